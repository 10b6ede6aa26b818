//! The lookups answered from the domain table: one name (`GET /v1/public/domain/{domain}`) and a
//! batch (`POST /v1/public/domains`). Both classify, explain and record a name the same way
//! (`judge`); a batch reads its body, takes its calls at once and resolves the MX of its names
//! concurrently, within one budget.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::header::HeaderValue;
use http::StatusCode;
use pingora::prelude::*;
use serde::Serialize;

use super::dispatch::decode;
use super::{Gateway, PendingCall, RequestCtx, X_DID_YOU_MEAN};
use crate::edge::batch::{self, Item, Results};
use drg_base::answer::{body_bytes, Answer, ApiError};
use drg_domain::age::{AgeRule, DomainAge};
use drg_domain::classify::{wants_mx, Signals};
use drg_domain::evidence::Evidence;
use drg_domain::mail::MxEvidence;
use drg_domain::neighbour_index::{Finding, Grounds};
use drg_domain::overrides::{Override, OverrideVerdict};
use drg_domain::table::{DomainTable, TableMatch};
use drg_domain::{DomainName, RiskRecord, TableRule};
use drg_evidence::listed_holds;
use drg_evidence::mx::neighbourhood::Neighbourhood;
use drg_evidence::mx::resolver::MxResolver;
use drg_projects::account::calls::Verdict;
use drg_telemetry::trace::Kind;

/// What classifying a name takes besides the table: its MX evidence (for names the table leaves
/// open) and what the neighbourhood index finds for it.
type MxInputs = (Option<Arc<MxEvidence>>, Option<Finding>);

/// A record with its evidence (`?explain=true`).
#[derive(Serialize)]
struct Explained<'a> {
    #[serde(flatten)]
    record: &'a RiskRecord<'a>,
    evidence: WithRegistry<'a>,
}

/// The evidence, and what the registry said when it gave no age (failed, refused, queued):
/// without it an answer missing its age could not tell a registry that failed from one not
/// asked. With `rule: project_allow | project_block`, the project's override that decided.
#[derive(Serialize)]
struct WithRegistry<'a> {
    #[serde(flatten)]
    evidence: Evidence<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    registry: Option<drg_evidence::rdap::service::RegistryNote>,
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    project_override: Option<drg_projects::account::overrides::Item<'a>>,
}

impl Gateway {
    pub(super) async fn domain(&self, raw: &str, explain: bool, ctx: &mut RequestCtx) -> Answer {
        let name = match decode(raw)
            .and_then(|s| DomainName::parse(&s).map_err(|e| ApiError::Validation(e.to_string())))
        {
            Ok(name) => name,
            Err(e) => return e.into(),
        };
        let span = self
            .shared
            .mx
            .as_ref()
            .and_then(|_| self.child_span(ctx, "mx lookup", Kind::Internal));
        // The route needs a key, so the principal is there. Borrowed, not cloned: a clone
        // bumps a count every worker shares.
        let project_name = ctx.principal.as_ref().map_or("", |p| &*p.key.project);
        let over = self.override_of(project_name, &name);
        // A name the table decides alone (listed, a curated free provider: most of a signup
        // stream), or the project blocked, wants no DNS and no age: one table lookup answers it.
        let table = self.shared.table.load();
        let found = table.lookup(&name);
        let blocked = over
            .as_ref()
            .is_some_and(|o| o.verdict == OverrideVerdict::Block);
        if blocked || (!wants_mx(&found) && found.rule != TableRule::Unknown) {
            self.learn_if_listed(&name, &found, project_name);
            ctx.dataset = Some(crate::edge::http::dataset_header(table.version()));
            let mut body = Vec::with_capacity(if explain { 1024 } else { 256 });
            let (suggestion, verdict) = self.classify_and_record(
                (&table, found),
                &name,
                ((None, None), None),
                (project_name, over.as_deref()),
                explain,
                &mut body,
            );
            let suggestion = suggestion.and_then(|p| HeaderValue::from_str(p).ok());
            return lookup_answer(name, suggestion, verdict, body, ctx);
        }
        // An allowed name's age changes nothing: not asked.
        let (wants, open) = (
            wants_mx(&found),
            found.rule == TableRule::Unknown && over.is_none(),
        );
        self.learn_if_listed(&name, &found, project_name);
        // Not held across the DNS wait.
        drop(table);
        // The age is read (or, within its budget, waited for) while DNS is asked.
        let (inputs, age) = futures_util::join!(
            self.mx_inputs(&name, wants, project_name),
            self.age_of(&name, open, project_name)
        );
        let age = self
            .age_if_judged(&name, open, &inputs, age, project_name)
            .await;
        drop(span);
        let table = self.shared.table.load();
        // A reload during the DNS wait: the answer says which table it came from.
        ctx.dataset = Some(crate::edge::http::dataset_header(table.version()));
        // A record is ~140-190 bytes: one allocation instead of a growing buffer's four.
        let mut body = Vec::with_capacity(if explain { 1024 } else { 256 });
        let (suggestion, verdict) = self.classify_and_record(
            (&table, table.lookup(&name)),
            &name,
            (inputs, age),
            (project_name, over.as_deref()),
            explain,
            &mut body,
        );
        let suggestion = suggestion.and_then(|p| HeaderValue::from_str(p).ok());
        lookup_answer(name, suggestion, verdict, body, ctx)
    }

    /// `POST /v1/public/domains`: the body read (bounded in size and time) and parsed, every
    /// name taken as one call at once, the MX of the names resolved together, and each name
    /// answered in its place.
    pub(super) async fn batch(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        explain: bool,
    ) -> Answer {
        let Some(key) = ctx.principal.as_ref().map(|p| p.key.clone()) else {
            return ApiError::Internal("batch without a principal".into()).into();
        };
        if let Err(e) = batch::check_content_type(&session.req_header().headers) {
            return self.refused_body(&key, e.into(), ctx);
        }
        let limit = self.batch.max_body_bytes;
        let body = match self.read_body(session, ctx, limit, self.h2_body_wait).await {
            Ok(body) => body,
            Err(e) => return self.refused_body(&key, e.into(), ctx),
        };
        let items = match batch::parse(&body, self.batch.max_names) {
            Ok(items) => items,
            Err(e) => return self.refused_body(&key, e.into(), ctx),
        };
        let now = self.shared.clock.now();
        let calls = items.len() as u64;
        if let Err(refused) = self.admit_calls(&key, calls, true, now, ctx).await {
            return refused;
        }
        let names: Vec<&DomainName> = items
            .iter()
            .filter_map(|item| match item {
                Item::Valid(name) => Some(name),
                Item::Invalid { .. } => None,
            })
            .collect();
        let span = self
            .shared
            .mx
            .as_ref()
            .and_then(|_| self.child_span(ctx, "mx lookup", Kind::Internal));
        let overrides = self.shared.overrides.load_full();
        let over: Vec<Option<&Arc<Override>>> = (names.iter())
            .map(|n| overrides.find(&key.project, n))
            .collect();
        let inputs = self.mx_inputs_batch(&names, &over, &key.project).await;
        let ages = self.ages_batch(&names, &inputs, &over, &key.project).await;
        let mut over = over.into_iter();
        let mut inputs = inputs.into_iter().zip(ages);
        drop(span);
        let table = self.shared.table.load();
        ctx.dataset = Some(crate::edge::http::dataset_header(table.version()));
        let mut results = Results::with_capacity(items.len());
        for item in &items {
            match item {
                Item::Valid(name) => {
                    let (mx, age) = inputs.next().unwrap_or_default();
                    let found = table.lookup(name);
                    let age = age.filter(|_| found.rule == TableRule::Unknown);
                    let over = over.next().flatten().map(|o| &**o);
                    let out = results.entry();
                    let (_, verdict) = self.classify_and_record(
                        (&table, found),
                        name,
                        (mx, age),
                        (&key.project, over),
                        explain,
                        out,
                    );
                    ctx.batch_calls.extend(verdict.map(|v| PendingCall {
                        domain: name.as_str().into(),
                        verdict: Some(v),
                        lookup: true,
                    }));
                }
                Item::Invalid { sent, detail } => {
                    batch::push_invalid(results.entry(), sent, detail)
                }
            }
        }
        self.shared.metrics.batch(items.len());
        Answer::raw(StatusCode::OK, Bytes::from(results.finish()))
    }

    /// The ages of a batch's names, in order: the same signals as a lookup of each name alone
    /// (the cache's, or within `rdap.budget_ms`; for a name its neighbours would flag, waited
    /// for as GET waits), all at once.
    async fn ages_batch(
        &self,
        names: &[&DomainName],
        inputs: &[MxInputs],
        over: &[Option<&Arc<Override>>],
        project: &str,
    ) -> Vec<Option<DomainAge>> {
        let table = self.shared.table.load();
        let open: Vec<bool> = (names.iter().zip(over))
            .map(|(n, o)| o.is_none() && table.lookup(n).rule == TableRule::Unknown)
            .collect();
        drop(table);
        let waits = names
            .iter()
            .zip(inputs)
            .zip(open)
            .map(|((name, inputs), open)| async move {
                let age = self.age_of(name, open, project).await;
                self.age_if_judged(name, open, inputs, age, project).await
            });
        futures_util::future::join_all(waits).await
    }

    /// Classifies `name` as every lookup does (the project's override, `over`, deciding
    /// first), records what a lookup records (the neighbourhood's verdict count, the live
    /// top-domains: never an overridden answer), writes its JSON (with the evidence when
    /// `explain`) to `out`, and returns the provider it is likely a typo of and the verdict to
    /// log for the name (call logs on).
    fn classify_and_record<'t>(
        &self,
        (table, found): (&'t DomainTable, TableMatch<'t>),
        name: &'t DomainName,
        ((evidence, mut finding), age): (MxInputs, Option<DomainAge>),
        (project, over): (&str, Option<&Override>),
        explain: bool,
        out: &mut Vec<u8>,
    ) -> (Option<&'t str>, Option<Verdict>) {
        let rdap = self.shared.rdap.as_ref();
        self.weigh_listed_dates(&mut finding, age);
        let signals = Signals {
            mx: evidence.as_deref(),
            age_pending: self.age_pending(name, &found, &finding, age),
            neighbourhood: finding,
            age,
            reported_safe: None,
        };
        let accepted = self.shared.accepted.load();
        let age_rule = rdap.map_or(AgeRule::OFF, |r| r.age_rule());
        let mut verdict = drg_projects::account::reports::decisions::verdict_with(
            &accepted,
            (table, name, found),
            signals,
            age_rule,
        );
        if let Some(o) = over {
            o.verdict.apply(&mut verdict.record);
        }
        let nb = self.neighbourhood().filter(|_| over.is_none());
        if let (Some(MxEvidence::Hosts(_)), Some(nb)) = (evidence.as_deref(), nb) {
            // What the gateway inferred neither dilutes nor feeds the neighbourhood; what it
            // did not counts as vouched for (an established age the registry gave) or unknown.
            // The same on every route.
            // A `safe` verdict the operator accepted vouches as an established age does.
            let vouched = match verdict.reported_safe {
                Some(_) => Some(true),
                None => (verdict.age).map(|a| a.age_days >= nb.config.vouch_age_days),
            };
            nb.judged(name, verdict.inferred(), vouched);
            if let (true, Some(f)) = (verdict.inferred(), &verdict.neighbourhood) {
                nb.count_verdict(f.key_kind);
            }
        }
        if let Some(live) = self.top_live.as_ref().filter(|_| over.is_none()) {
            live.record(
                name,
                &verdict.record,
                drg_projects::live_top::WhyFlagged::of(&verdict),
                project,
            );
        }
        let call = self.calls.as_ref().map(|_| Verdict {
            risk_score: verdict.record.risk_score,
            reason: verdict.record.reason,
        });
        if explain {
            let registry = (self.shared.rdap.as_ref())
                .filter(|_| verdict.age.is_none())
                .and_then(|r| r.registry_note(name));
            let mut why =
                drg_domain::evidence::evidence(table, name, &verdict, evidence.as_deref());
            if let Some(o) = over {
                why.rule = o.verdict.evidence_rule();
            }
            let body = Explained {
                record: &verdict.record,
                evidence: WithRegistry {
                    evidence: why,
                    registry,
                    project_override: over.map(drg_projects::account::overrides::Item::of),
                },
            };
            // Plain structs of strings, numbers and lists: always serialise.
            let _ = serde_json::to_writer(&mut *out, &body);
        } else {
            verdict.record.write_json(out);
        }
        (verdict.did_you_mean, call)
    }

    /// Whether `name`'s age is on its way from a registry not known to fail, for a name the
    /// table leaves open that the neighbourhood has a finding for and no age came for. Asked
    /// only then: the lock it takes is off the path of every other lookup.
    fn age_pending(
        &self,
        name: &DomainName,
        found: &TableMatch<'_>,
        finding: &Option<Finding>,
        age: Option<DomainAge>,
    ) -> bool {
        age.is_none()
            && finding.is_some()
            && found.rule == TableRule::Unknown
            && (self.shared.rdap.as_ref()).is_some_and(|r| r.awaits(name))
    }

    /// The age of `name`'s registrable domain, for names no list decides (`open`): from the
    /// cache, or within `rdap.budget_ms` (a miss is fetched in the background).
    async fn age_of(&self, name: &DomainName, open: bool, project: &str) -> Option<DomainAge> {
        let rdap = self.shared.rdap.as_ref().filter(|_| open)?;
        rdap.age_within(name, project).await
    }

    /// `age`, or, for a name its neighbours would flag (`inputs` has a finding) whose age the
    /// cache does not hold yet, the age waited for within `rdap.neighbourhood_budget_ms`: an
    /// established age may shield it. Meanwhile the registration dates of the key's listed
    /// names that could show they held it are waited for too (`listed_holds`). GET and batch
    /// alike.
    async fn age_if_judged(
        &self,
        name: &DomainName,
        open: bool,
        inputs: &MxInputs,
        age: Option<DomainAge>,
        project: &str,
    ) -> Option<DomainAge> {
        let (Some(finding), Some(rdap), true) = (&inputs.1, self.shared.rdap.as_deref(), open)
        else {
            return age;
        };
        if age.is_some_and(|a| rdap.age_rule().is_established(a)) {
            // Shielded whatever the key's names' dates: none is asked for it.
            return age;
        }
        let budget = rdap.neighbourhood_budget();
        let own = async {
            match age {
                Some(age) => Some(age),
                None => rdap.age_within_budget(name, project, budget).await,
            }
        };
        let listed = async {
            let Some(nb) = self.neighbourhood() else {
                return;
            };
            let weighed = listed_holds::weigh(nb, Some(rdap), finding);
            let dates =
                (weighed.on_its_way.iter()).map(|n| rdap.age_within_budget(n, project, budget));
            futures_util::future::join_all(dates).await;
        };
        futures_util::join!(own, listed).0
    }

    /// `finding` as the registration dates of its key's listed names leave it. For a domain
    /// whose established `age` outweighs it: whether they were held for years
    /// (`weigh_aged_listed`). Otherwise whether they held the key at all
    /// (`drg_evidence::listed_holds`): gone when they have not, waiting while the dates that
    /// could show it are on their way.
    fn weigh_listed_dates(&self, finding: &mut Option<Finding>, age: Option<DomainAge>) {
        let (Some(f), Some(nb)) = (finding.as_ref(), self.neighbourhood()) else {
            return;
        };
        let rdap = self.shared.rdap.as_deref();
        if rdap.is_some_and(|r| age.is_some_and(|a| r.age_rule().is_established(a))) {
            self.weigh_aged_listed(finding.as_mut(), age);
            return;
        }
        let weighed = listed_holds::weigh(nb, rdap, f);
        listed_holds::apply(finding, &weighed, rdap);
    }

    /// Where the judged domain's established `age` would outweigh `finding` (it rests on
    /// lookups), how many of the listed names its key keeps by name the registry shows
    /// registered at least `established_days` ago (`Finding::aged_listed`): names held that
    /// long are a throwaway service's own, not a planting. Names whose age the cache does not
    /// know are queued for the registry in the background, on a line of their own: the answer
    /// does not wait, the settled one has them.
    fn weigh_aged_listed(&self, finding: Option<&mut Finding>, age: Option<DomainAge>) {
        let (Some(finding), Some(rdap)) = (finding, self.shared.rdap.as_deref()) else {
            return;
        };
        let rule = rdap.age_rule();
        let outweighed =
            finding.grounds == Grounds::Lookups && age.is_some_and(|a| rule.is_established(a));
        let Some(nb) = self.neighbourhood().filter(|_| outweighed) else {
            return;
        };
        let mut aged = 0;
        for listed in nb.listed_sample(finding) {
            let Ok(name) = DomainName::parse(&listed) else {
                continue;
            };
            match rdap.known_age(&name) {
                Some(Some(a)) if rule.is_established(a) => aged += 1,
                Some(_) => {}
                None => rdap.fetch_later(&name, listed_holds::LINE),
            }
        }
        finding.aged_listed = aged;
    }

    fn neighbourhood(&self) -> Option<&Arc<Neighbourhood>> {
        self.shared.mx.as_ref().and_then(|mx| mx.neighbourhood())
    }

    /// The MX inputs of `name`, when it `wants` them (the table leaves it open).
    async fn mx_inputs(&self, name: &DomainName, wants: bool, project: &str) -> MxInputs {
        let Some(mx) = self.shared.mx.as_ref().filter(|_| wants) else {
            return (None, None);
        };
        let evidence = mx.evidence(name.as_str(), project).await.0;
        let finding = if self.agrees() {
            self.finding(name, &evidence, project).await
        } else {
            self.local_finding(name, &evidence, project)
        };
        (Some(evidence), finding)
    }

    /// The MX inputs of a batch's names, in order: the names the cache cannot answer are
    /// resolved concurrently within the project's share of the slots
    /// (`mx.max_inflight_per_project`), never one after another, each within a budget of its
    /// own from when its turn comes (as GET: a batch never answers a name differently); names
    /// past the gateway's or the project's slots are answered from the table, as GET's are.
    async fn mx_inputs_batch(
        &self,
        names: &[&DomainName],
        over: &[Option<&Arc<Override>>],
        project: &str,
    ) -> Vec<MxInputs> {
        let Some(mx) = &self.shared.mx else {
            return vec![(None, None); names.len()];
        };
        let wants = self.consider(names, over, project);
        let concurrency = mx.project_share().clamp(1, names.len().max(1));
        // Made first, polled `concurrency` at a time (a closure making them inside the stream
        // would not be `Send` for every lifetime, as Pingora's futures must be).
        let lookups: Vec<_> = names
            .iter()
            .zip(wants)
            .map(|(name, wants)| self.mx_within(mx, name, wants, project))
            .collect();
        stream::iter(lookups).buffered(concurrency).collect().await
    }

    /// One name's MX inputs, within the budget of a single lookup from when it is first polled
    /// (its turn in the batch).
    async fn mx_within(
        &self,
        mx: &Arc<MxResolver>,
        name: &DomainName,
        wants: bool,
        project: &str,
    ) -> MxInputs {
        if !wants {
            return (None, None);
        }
        let evidence = mx
            .evidence_within(name.as_str(), mx.budget(), project)
            .await
            .0;
        let finding = if self.agrees() {
            self.finding(name, &evidence, project).await
        } else {
            self.local_finding(name, &evidence, project)
        };
        (Some(evidence), finding)
    }

    /// Which of `names` want MX evidence (the table leaves them open, the project did not
    /// block them); listed ones are queued for the neighbourhood index to learn (not while
    /// offline: nothing could be resolved).
    fn consider(
        &self,
        names: &[&DomainName],
        over: &[Option<&Arc<Override>>],
        project: &str,
    ) -> Vec<bool> {
        let table = self.shared.table.load();
        names
            .iter()
            .zip(over)
            .map(|(name, o)| {
                let found = table.lookup(name);
                self.learn_if_listed(name, &found, project);
                let blocked = o.is_some_and(|o| o.verdict == OverrideVerdict::Block);
                wants_mx(&found) && !blocked
            })
            .collect()
    }

    /// The override of `name` for `project`, if it set one (most projects have none: no walk).
    fn override_of(&self, project: &str, name: &DomainName) -> Option<Arc<Override>> {
        let set = self.shared.overrides.load();
        if set.none_for(project) {
            return None;
        }
        set.find(project, name).cloned()
    }

    /// A listed name is queued for the neighbourhood index to learn its MX in the background
    /// (not while offline: nothing could be resolved).
    fn learn_if_listed(&self, name: &DomainName, found: &TableMatch<'_>, project: &str) {
        if let TableRule::Blocklist { .. } = found.rule {
            let learn = (self.shared.mx.as_ref())
                .filter(|mx| !mx.evidence_off())
                .and_then(|mx| mx.neighbourhood());
            if let Some(nb) = learn {
                nb.consider_listed(name, project);
            }
        }
    }

    /// What the neighbourhood index finds for a name whose MX hosts are known, for
    /// `project`'s answer: agreed with the other gateways on a shared Redis (one verdict).
    async fn finding(
        &self,
        name: &DomainName,
        evidence: &MxEvidence,
        project: &str,
    ) -> Option<Finding> {
        self.judging(evidence)?.agreed_finding(name, project).await
    }

    /// Whether [`Self::finding`] may have to ask the other gateways (else
    /// [`Self::local_finding`] answers the same, with no future to poll).
    fn agrees(&self) -> bool {
        self.neighbourhood().is_some_and(|nb| nb.shares_holds())
    }

    /// This index's finding for a name whose MX hosts are known.
    fn local_finding(
        &self,
        name: &DomainName,
        evidence: &MxEvidence,
        project: &str,
    ) -> Option<Finding> {
        self.judging(evidence)?.finding(name, project)
    }

    /// The neighbourhood index, when `evidence` names hosts it could judge by.
    fn judging(&self, evidence: &MxEvidence) -> Option<&Arc<Neighbourhood>> {
        matches!(evidence, MxEvidence::Hosts(_))
            .then(|| self.neighbourhood())
            .flatten()
    }
}

/// A lookup's answer: the record's bytes, the typo hint, and the call to log (the name itself
/// is logged, moved, not copied: the record's `domain` is this name).
fn lookup_answer(
    name: DomainName,
    suggestion: Option<HeaderValue>,
    verdict: Option<Verdict>,
    body: Vec<u8>,
    ctx: &mut RequestCtx,
) -> Answer {
    ctx.call = verdict.map(|v| PendingCall {
        domain: name.into_boxed_str(),
        verdict: Some(v),
        lookup: true,
    });
    let answer = Answer::raw(StatusCode::OK, body_bytes(body));
    match suggestion {
        Some(p) => answer.with_header(X_DID_YOU_MEAN, p),
        None => answer,
    }
}
