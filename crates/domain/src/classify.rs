//! Classification: what the table says of a name, turned into the API's `RiskRecord`.
//!
//! Pure and ordered as the contract lists it (allowlist, explicit record, free provider,
//! blocklists, otherwise safe); a name only a broad third-party free list carries is a free
//! provider only where no blocklist matched (the table decides: see [`DomainTable::lookup`]).
//! Scores come from [`Scores`], which operators set in config.
//!
//! MX evidence cannot be used to buy a better score: anyone can point a throwaway domain's MX
//! at a host of their own, so only a recognised business provider (where mail goes first)
//! lowers the score below `unknown`; own hosts earn `is_corporate_email` at most, and only
//! without a [`RiskSignal`].
//!
//! **One evidence model**: everything beyond the table a verdict may rest on is a typed piece
//! of [`Signals`] (the MX evidence from a checked resolver, the neighbourhood's finding with its
//! counts and lists, the domain's age from RDAP), and [`verdict_of`] is the one function that turns
//! the table's match and those pieces into the record; `?explain=true` shows the same pieces.
//! Its rules, calibrated on `benches/detection`: a mail set-up that cannot take mail is
//! `undeliverable`; the neighbourhood makes an unlisted domain `disposable` unless the domain
//! is established; age alone only raises a score.

use super::age::{AgeRule, DomainAge, YoungEffect};
use super::mail::{MxEvidence, MxHost, ProviderKind};
use super::name::DomainName;
use super::neighbour_index::{Finding, Grounds, KeyKind, AGED_LISTED};
use super::providers::{MxSurvey, ProviderMatch};
use super::record::{Reason, RiskRecord};
use super::scores::Scores;
use super::table::{DomainTable, TableMatch, TableRule};

/// The classification of one name, with the rule that decided it (for `lookup` and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'a> {
    pub record: RiskRecord<'a>,
    pub rule: TableRule<'a>,
    /// The recognised MX provider, when MX evidence was used.
    pub provider: Option<ProviderMatch<'a>>,
    /// Why the domain's own MX hosts were not taken for a business's (set only when MX hosts
    /// were found and the most preferred ones are not at a business provider).
    pub risk_signal: Option<RiskSignal>,
    /// The table left the name open and its MX evidence changed the reason or the score.
    pub mx_decided: bool,
    /// The learned MX neighbourhood judged the (unlisted) name disposable: the key and counts.
    pub neighbourhood: Option<Finding>,
    /// The curated free provider the name is likely a typo of (`gmial.com` -> `gmail.com`).
    pub did_you_mean: Option<&'a str>,
    /// Why a name a broad free list names is answered not free: `free_exclusions` (listed as
    /// an organisation) or `business_mx` (its mail goes first to a business mailbox provider).
    pub not_free_because: Option<&'static str>,
    /// MX hosts were found and the most preferred are not at a business mailbox provider: a
    /// weak signal (own or unrecognised hosts, a forwarder, a consumer host) that only the
    /// young-domain rule weighs.
    pub weak_mx: bool,
    /// When the name's registrable domain was registered (RDAP), when known.
    pub age: Option<DomainAge>,
    /// What the young-domain rule did ([`apply_age`]), if anything.
    pub young: Option<YoungEffect>,
    /// The neighbourhood would have made the name `disposable`, but the domain is established
    /// (registered more than `rdap.established_days` ago, [`shields`]) or enough projects
    /// reported it `safe` (`reported_safe`): it stays `safe`.
    pub established: bool,
    /// The neighbourhood would have made the name `disposable` on what lookups taught, and an
    /// established age would outweigh that, but the domain's age is on its way from a registry
    /// not known to fail ([`Signals::age_pending`]): it stays `safe` until the age is in, and
    /// a change then reaches the project as verdict changes do.
    pub age_pending: bool,
    /// The neighbourhood would have made the name `disposable` on a network key alone (the /24
    /// or /48 its mail host shares with throwaway hosts), on what lookups or the look taught,
    /// and nothing dates the domain ([`undated_network`]): it stays `safe`.
    pub undated_network: bool,
    /// The projects whose `safe` reports the operator accepted ([`Signals`]).
    pub reported_safe: Option<u32>,
}

impl Verdict<'_> {
    /// The answer is `disposable` on the neighbourhood's word (an inference, not a listing).
    pub fn inferred(&self) -> bool {
        self.neighbourhood.is_some() && self.record.reason == Reason::Disposable
    }
}

/// What a verdict may rest on besides the table, each piece with its provenance (see the
/// module documentation).
#[derive(Debug, Clone, Default)]
pub struct Signals<'e> {
    /// What DNS said of the name's mail (asked only for names the table leaves open).
    pub mx: Option<&'e MxEvidence>,
    /// The learned MX neighbourhood's finding: the key, its counts and the lists behind them.
    pub neighbourhood: Option<Finding>,
    /// When RDAP says the registrable domain was registered. `None` when it has not said
    /// (no RDAP for the TLD, RDAP off, the registry failing or refusing, or its answer still
    /// on its way: see `age_pending`).
    pub age: Option<DomainAge>,
    /// With no `age`: the registry's answer is queued or in flight, and that registry is not
    /// known to fail (its last answer was an answer). A queued age is not a missing age: a
    /// finding the age could outweigh waits for it ([`pending`]). A registry that is absent,
    /// failing or refusing gives nothing to wait for: the verdict is the one without RDAP.
    pub age_pending: bool,
    /// The operator accepted `safe` for the domain (`reports accept`): how many projects'
    /// reports. Inference never flags it.
    pub reported_safe: Option<u32>,
}

/// The one verdict function: the table's match for `name` and the `signals` beyond it, with
/// age weighed by `age_rule`.
pub fn verdict_of<'a>(
    table: &'a DomainTable,
    name: &'a DomainName,
    found: TableMatch<'a>,
    signals: Signals<'_>,
    age_rule: AgeRule,
) -> Verdict<'a> {
    let mut verdict = classify_match(table, name, found, signals.mx, signals.neighbourhood);
    verdict.age = signals.age;
    verdict.reported_safe = signals.reported_safe;
    let finding = verdict
        .neighbourhood
        .as_ref()
        .filter(|_| verdict.inferred());
    let shielded = finding.is_some()
        && (signals.reported_safe.is_some()
            || finding.is_some_and(|f| shields(f, signals.age, age_rule)));
    let waits = !shielded
        && finding.is_some_and(|f| {
            f.holds_pending || pending(f, (signals.age, signals.age_pending), age_rule)
        });
    let spared = !shielded && !waits && finding.is_some_and(|f| undated_network(f, signals.age));
    if shielded || waits || spared {
        verdict.record.reason = Reason::Safe;
        verdict.record.risk_score = table.scores().neighbourhood_established;
        verdict.established = shielded;
        verdict.age_pending = waits;
        verdict.undated_network = spared;
    }
    if let Some(age) = signals.age {
        apply_age(&mut verdict, age, age_rule, table.scores());
    }
    verdict
}

/// Whether `age` keeps the neighbourhood's `finding` from making a domain `disposable`: an
/// established age the registry gave, against a finding that rests on lookups
/// ([`Grounds::Lookups`]). Lookups teach where listed domains' mail goes, which whoever holds
/// those domains chooses, through any project's sign-up form: a 15-year-old company is not
/// condemned because some listed names point at its host, whichever projects, and however
/// many, asked for them. Throwaway domains do live past a year (the median is about 331 days
/// old when a blocklist first names it), so aged throwaways found by lookups alone are given up
/// (must-not-flag wins); only a finding the operator's lists hold alone condemns them. An age
/// the registry did not give (missing, slow, throttled, failing) weighs nothing either way:
/// a registry that never answers makes the answer neither worse nor better than no registry.
///
/// Unless the key's listed names were themselves held long: [`AGED_LISTED`] of them the
/// registry shows registered at least `established_days` ago ([`Finding::aged_listed`]) are not
/// what anyone plants cheaply (a lapsed name re-registered gets a new date), so the finding is
/// a throwaway service's own host, and an aged throwaway on it is judged as a young one.
pub fn shields(finding: &Finding, age: Option<DomainAge>, rule: AgeRule) -> bool {
    finding.grounds == Grounds::Lookups
        && finding.aged_listed < AGED_LISTED
        && age.is_some_and(|a| rule.is_established(a))
}

/// Whether the neighbourhood's `finding` waits for the domain's age: it rests on lookups or the
/// gateway's own look (an established age would outweigh it, [`shields`]), the age rule weighs
/// establishment, and the age is on its way from a registry not known to fail. Answering
/// `disposable` meanwhile would condemn an established company for the gateway's own queue;
/// answering from what is known and settling when the age is in does not. Whoever re-registers
/// lapsed listed names chooses where their mail goes, before the gateway first looked as well
/// as after (names planted before a deployment's first pass are the look's baseline), so what
/// the look saw waits as what a project's lookups taught does. Only a finding the operator's
/// lists hold alone does not wait. A registry that is absent or failing is no registry:
/// nothing is waited for.
pub fn pending(
    finding: &Finding,
    (age, on_its_way): (Option<DomainAge>, bool),
    rule: AgeRule,
) -> bool {
    finding.grounds == Grounds::Lookups && rule.established_days > 0 && age.is_none() && on_its_way
}

/// Whether the neighbourhood's `finding` is a network's alone (a /24 or /48 that the domain's
/// mail host shares with throwaway hosts), resting on lookups or the gateway's own look, for a
/// domain nothing dates (no RDAP for its TLD, RDAP off, its registry failing or refusing). A
/// network is where a hosting provider puts unrelated customers' servers side by side: a
/// company whose mail server a VPS provider numbered beside throwaway hosts shows exactly the
/// evidence a throwaway service's new host does (a new host, a PTR that names it, one MX, the
/// usual SPF and DMARC), and only an age tells them apart. A young age the registry gives
/// lets the network judge, an established one shields ([`shields`]), one on its way is
/// waited for ([`pending`]); with none, must-not-flag wins: the answer is the one without the
/// network (benches/RESULTS-detection.md: a `.in` company in the /24 of a throwaway
/// operator's ten hosts was `disposable` 80; the recall given up is the network shape's
/// throwaways that nothing dates). A finding the operator's lists hold alone stands.
pub fn undated_network(finding: &Finding, age: Option<DomainAge>) -> bool {
    finding.grounds == Grounds::Lookups && finding.key_kind == KeyKind::Network && age.is_none()
}

/// What keeps a domain on its own (unrecognised) MX hosts from counting as corporate mail.
/// Names the table flags (a blocklist on the name or a parent, a flagged explicit record) never
/// get that far: MX evidence is only asked for names the table leaves open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RiskSignal {
    /// The name or a parent is on the free-provider list.
    FreeProvider,
    /// An MX host, at any preference, is a disposable-mail service's.
    DisposableMx,
    /// An MX host, at any preference, is a forwarding service's (throwaway domains use them).
    ForwarderMx,
    /// An MX host, at any preference, is a consumer webmail provider's.
    ConsumerMx,
    /// An MX host is not a mail host name: a single label (`localhost`) or an IP address.
    InvalidMxHost,
}

/// The first risk signal of a domain whose most preferred MX hosts are not at a business.
fn risk_signal(free: bool, survey: &MxSurvey<'_>, hosts: &[MxHost]) -> Option<RiskSignal> {
    if free {
        return Some(RiskSignal::FreeProvider);
    }
    match survey.risky {
        Some(ProviderKind::Disposable) => return Some(RiskSignal::DisposableMx),
        Some(ProviderKind::Forwarder) => return Some(RiskSignal::ForwarderMx),
        Some(ProviderKind::Consumer) => return Some(RiskSignal::ConsumerMx),
        _ => {}
    }
    hosts
        .iter()
        .any(|h| !h.is_mail_host_name())
        .then_some(RiskSignal::InvalidMxHost)
}

/// Whether MX evidence can change the answer for a table match: only names the table leaves
/// open (unknown or allowlisted) are worth a DNS lookup.
pub fn wants_mx(found: &TableMatch<'_>) -> bool {
    matches!(found.rule, TableRule::Unknown | TableRule::Allowlist { .. }) || found.broad_only
}

/// Classifies `name` from what `table` knows and, optionally, its MX evidence.
pub fn classify<'a>(
    table: &'a DomainTable,
    name: &'a DomainName,
    mx: Option<&MxEvidence>,
) -> Verdict<'a> {
    classify_match(table, name, table.lookup(name), mx, None)
}

/// Classifies a table match (from [`DomainTable::lookup`]) with optional MX evidence and
/// what the MX neighbourhood index found for the name (used only with MX hosts, for a name the
/// table leaves unknown, whose mail does not go first to a business provider).
pub fn classify_match<'a>(
    table: &'a DomainTable,
    name: &'a DomainName,
    found: TableMatch<'a>,
    mx: Option<&MxEvidence>,
    neighbourhood: Option<Finding>,
) -> Verdict<'a> {
    let scores = table.scores();
    let mut base = classify_table(scores, name, &found);
    base.did_you_mean = typo_of(table, name, &found);
    let mx = mx.filter(|_| wants_mx(&found));
    let Some(evidence) = mx else {
        return base;
    };
    let hosts = evidence.hosts();
    let survey = table.providers().survey(hosts);
    let mut v = base;
    let kind = survey.provider.as_ref().map(|p| p.kind);
    if let Some(p) = &survey.provider {
        v.record.mx_provider_label = Some(p.label);
    }
    let has_hosts = matches!(evidence, MxEvidence::Hosts(_));
    let business = has_hosts && survey.primary_business;
    if let TableRule::Unknown = found.rule {
        if evidence.is_undeliverable() {
            (v.record.reason, v.record.risk_score) = (Reason::Undeliverable, scores.undeliverable);
        } else if kind == Some(ProviderKind::Disposable) {
            (v.record.reason, v.record.risk_score) = (Reason::Disposable, scores.disposable_mx);
        } else if let Some(finding) = neighbourhood.filter(|_| has_hosts && !business) {
            (v.record.reason, v.record.risk_score) = (Reason::Disposable, scores.mx_neighbourhood);
            v.neighbourhood = Some(finding);
        } else if kind == Some(ProviderKind::Forwarder) {
            v.record.risk_score = scores.forwarder_mx;
        } else if business {
            v.record.risk_score = scores.corporate;
        }
        // Anything else (own hosts, a recognised host only as a backup, a consumer host) is no
        // evidence of a business: the score stays `unknown`.
    }
    // A broad list is not curated: a name whose mail goes first to a business mailbox
    // provider (Google Workspace, Microsoft 365, a security gateway) is an organisation's.
    // Own hosts prove nothing here: webmail providers run their own.
    if found.broad_only && business {
        v.record.is_free_provider = false;
        v.record.risk_score = scores.corporate;
        v.not_free_because = Some("business_mx");
    }
    v.mx_decided = (v.record.reason, v.record.risk_score) != (Reason::Safe, scores.unknown)
        && found.rule == TableRule::Unknown;
    if has_hosts && !business {
        v.risk_signal = risk_signal(v.record.is_free_provider, &survey, hosts);
        v.weak_mx = true;
    }
    v.record.is_corporate_email = has_hosts
        && v.record.reason == Reason::Safe
        && !v.record.is_free_provider
        && (business || v.risk_signal.is_none());
    // A domain receiving mail on hosts of its own (a real company at `gmai.co`) is no typo;
    // one whose mail goes to a throwaway service may well be.
    if has_hosts && survey.risky != Some(ProviderKind::Disposable) {
        v.did_you_mean = None;
    }
    v.provider = survey.provider;
    v
}

/// Weighs the age of `verdict`'s name (registered as `age` says) as `rule` says, for names the
/// table leaves unknown: a young one nothing flagged gets its score raised within the low band.
/// Age never makes a name `disposable`. The age is always recorded.
pub fn apply_age(verdict: &mut Verdict<'_>, age: DomainAge, rule: AgeRule, scores: &Scores) {
    verdict.age = Some(age);
    if verdict.rule != TableRule::Unknown {
        return;
    }
    let open = verdict.record.reason == Reason::Safe && verdict.neighbourhood.is_none();
    if !open || !rule.is_young(age) {
        return;
    }
    let raised = if verdict.weak_mx {
        scores.young_domain_weak_mx
    } else {
        scores.young_domain
    };
    if verdict.record.risk_score < raised {
        verdict.record.risk_score = raised;
        verdict.young = Some(YoungEffect::Raised);
    }
}

/// The provider `name` is likely a typo of, from the table alone: only for a registrable
/// domain that no list vouches for (unknown or blocklisted: typo domains are often listed).
fn typo_of<'a>(
    table: &'a DomainTable,
    name: &DomainName,
    found: &TableMatch<'_>,
) -> Option<&'a str> {
    let open = matches!(found.rule, TableRule::Unknown | TableRule::Blocklist { .. });
    (open && !found.no_typo && name.registrable() == Some(name.as_str()))
        .then(|| table.typo_of(name.as_str()))
        .flatten()
}

fn classify_table<'a>(
    scores: &Scores,
    name: &'a DomainName,
    found: &TableMatch<'a>,
) -> Verdict<'a> {
    let (reason, risk_score) = match found.rule {
        TableRule::Allowlist { .. } => match found.record {
            Some(rec) if rec.reason == Reason::Safe => (Reason::Safe, rec.risk_score),
            _ => (Reason::Safe, scores.allowlisted),
        },
        TableRule::Record(rec) => (rec.reason, rec.risk_score),
        TableRule::FreeProvider { .. } => (Reason::Safe, scores.free_provider),
        TableRule::Relay { .. } => (Reason::Safe, scores.relay),
        TableRule::Blocklist { at } if at == name.as_str() => {
            (Reason::Disposable, scores.disposable)
        }
        TableRule::Blocklist { .. } => (Reason::Disposable, scores.disposable_subdomain),
        TableRule::Unknown => (Reason::Safe, scores.unknown),
    };
    Verdict {
        record: RiskRecord {
            domain: name.as_str(),
            risk_score,
            reason,
            is_free_provider: found.is_free_provider,
            is_corporate_email: false,
            // A relay's mail is the service's own: its name is the provider label.
            mx_provider_label: match found.rule {
                TableRule::Relay { service, .. } => service,
                _ => found.record.and_then(|r| r.mx_provider_label.as_deref()),
            },
        },
        rule: found.rule,
        provider: None,
        risk_signal: None,
        mx_decided: false,
        neighbourhood: None,
        did_you_mean: None,
        not_free_because: found.not_free_listed.then_some("free_exclusions"),
        weak_mx: false,
        age: None,
        young: None,
        established: false,
        age_pending: false,
        undated_network: false,
        reported_safe: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::MxHost;
    use crate::record::RiskScore;
    use crate::{
        table::{ExplicitRecord, ListKind},
        TableBuilder,
    };

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    fn sample() -> DomainTable {
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("gmail.com"), ListKind::FreeProvider);
        b.add(&n("126.com"), ListKind::Allow);
        b.add(&n("126.com"), ListKind::FreeProvider);
        b.add_record(
            &n("corp.example"),
            ExplicitRecord {
                reason: Reason::Safe,
                risk_score: 2,
                mx_provider_label: Some("Google Workspace".into()),
                flag_weight: 0,
            },
        )
        .unwrap();
        b.add_record(
            &n("team.example"),
            ExplicitRecord {
                reason: Reason::RoleAccount,
                risk_score: 65,
                mx_provider_label: None,
                flag_weight: 0,
            },
        )
        .unwrap();
        b.build(Scores::default())
    }

    #[test]
    fn each_rule_gives_its_reason_and_configured_score() {
        let t = sample();
        let s = Scores::default();
        let check = |q: &str, reason, score, free| {
            let name = n(q);
            let v = classify(&t, &name, None);
            assert_eq!(v.record.reason, reason, "{q}");
            assert_eq!(v.record.risk_score, score, "{q}");
            assert_eq!(v.record.is_free_provider, free, "{q}");
        };
        check("mailinator.com", Reason::Disposable, s.disposable, false);
        check(
            "a.b.mailinator.com",
            Reason::Disposable,
            s.disposable_subdomain,
            false,
        );
        check("gmail.com", Reason::Safe, s.free_provider, true);
        check("126.com", Reason::Safe, s.allowlisted, true);
        check("team.example", Reason::RoleAccount, 65, false);
        check("corp.example", Reason::Safe, 2, false);
        check("unknown-domain.org", Reason::Safe, s.unknown, false);
    }

    #[test]
    fn record_label_is_reported() {
        let t = sample();
        let name = n("corp.example");
        assert_eq!(
            classify(&t, &name, None).record.mx_provider_label,
            Some("Google Workspace")
        );
    }

    #[test]
    fn mx_evidence_only_decides_what_the_table_leaves_open() {
        use crate::providers::ProviderTable;
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("gmail.com"), ListKind::FreeProvider);
        b.set_providers(
            ProviderTable::parse(
                "match,pattern,label,kind\nsuffix,google.com,Google Workspace,mailbox\nsuffix,yopmail.com,Yopmail,disposable\n",
                "p",
            )
            .unwrap(),
        );
        let t = b.build(Scores::default());
        let s = Scores::default();
        let hosts = |h: &str| {
            MxEvidence::Hosts(vec![MxHost {
                preference: 1,
                host: h.into(),
            }])
        };
        let run = |q: &str, e: MxEvidence| {
            let name = n(q);
            let v = classify(&t, &name, Some(&e));
            (
                v.record.reason,
                v.record.risk_score,
                v.record.is_corporate_email,
                v.record.mx_provider_label.map(str::to_owned),
            )
        };
        assert_eq!(
            run("corp.example", hosts("aspmx.l.google.com")),
            (
                Reason::Safe,
                s.corporate,
                true,
                Some("Google Workspace".into())
            )
        );
        // Own hosts earn the flag, not a better score.
        assert_eq!(
            run("corp.example", hosts("mx.corp.example")),
            (Reason::Safe, s.unknown, true, None)
        );
        assert_eq!(
            run("x.example", hosts("mx.yopmail.com")),
            (
                Reason::Disposable,
                s.disposable_mx,
                false,
                Some("Yopmail".into())
            )
        );
        assert_eq!(
            run("x.example", MxEvidence::NullMx),
            (Reason::Undeliverable, s.undeliverable, false, None)
        );
        assert_eq!(
            run("x.example", MxEvidence::Unknown),
            (Reason::Safe, s.unknown, false, None)
        );
        assert_eq!(
            run("x.example", MxEvidence::AddressOnly),
            (Reason::Safe, s.unknown, false, None)
        );
        // The table decided: evidence is ignored.
        assert_eq!(
            run("mailinator.com", MxEvidence::NullMx).0,
            Reason::Disposable
        );
        assert_eq!(run("gmail.com", MxEvidence::NoDomain).0, Reason::Safe);
    }

    /// A table with the providers the MX rules need, an allowlisted free provider and an
    /// allowlisted name.
    fn mx_table() -> DomainTable {
        use crate::providers::ProviderTable;
        let mut b = TableBuilder::new();
        b.add(&n("126.com"), ListKind::Allow);
        b.add(&n("126.com"), ListKind::FreeProvider);
        b.add(&n("trusted.example"), ListKind::Allow);
        b.set_providers(
            ProviderTable::parse(
                "match,pattern,label,kind\n\
                 suffix,gmail-smtp-in.l.google.com,Gmail,consumer\n\
                 suffix,google.com,Google Workspace,mailbox\n\
                 suffix,pphosted.com,Proofpoint,security_gateway\n\
                 suffix,improvmx.com,ImprovMX,forwarder\n\
                 suffix,mailinator.com,Mailinator,disposable\n",
                "p",
            )
            .unwrap(),
        );
        b.build(Scores::default())
    }

    fn mx(list: &[(u16, &str)]) -> MxEvidence {
        MxEvidence::Hosts(
            list.iter()
                .map(|(p, h)| MxHost {
                    preference: *p,
                    host: (*h).into(),
                })
                .collect(),
        )
    }

    /// (score, is_corporate_email, risk signal, label) of `q` with these MX hosts.
    fn mx_verdict(
        t: &DomainTable,
        q: &str,
        list: &[(u16, &str)],
    ) -> (RiskScore, bool, Option<RiskSignal>, Option<String>) {
        let name = n(q);
        let e = mx(list);
        let v = classify(t, &name, Some(&e));
        (
            v.record.risk_score,
            v.record.is_corporate_email,
            v.risk_signal,
            v.record.mx_provider_label.map(str::to_owned),
        )
    }

    #[test]
    fn a_recognised_business_provider_is_corporate_whatever_the_backups() {
        let t = mx_table();
        let s = Scores::default();
        let google = Some("Google Workspace".to_owned());
        assert_eq!(
            mx_verdict(&t, "corp.example", &[(1, "aspmx.l.google.com")]),
            (s.corporate, true, None, google.clone())
        );
        assert_eq!(
            mx_verdict(&t, "corp.example", &[(10, "mx1.pphosted.com")]),
            (s.corporate, true, None, Some("Proofpoint".into()))
        );
        // Mail goes to Google first: the unrecognised backup takes nothing away.
        assert_eq!(
            mx_verdict(
                &t,
                "corp.example",
                &[(1, "aspmx.l.google.com"), (20, "backup.corp.example")]
            ),
            (s.corporate, true, None, google)
        );
    }

    #[test]
    fn own_hosts_never_score_below_unknown() {
        let t = mx_table();
        let s = Scores::default();
        let google = Some("Google Workspace".to_owned());
        // The domain's own host, or anyone's unrecognised host: the flag, at the unknown score.
        assert_eq!(
            mx_verdict(&t, "corp.example", &[(10, "mail.corp.example")]),
            (s.unknown, true, None, None)
        );
        assert_eq!(
            mx_verdict(&t, "corp.example", &[(10, "mx.hoster.example")]),
            (s.unknown, true, None, None)
        );
        // A business provider only as a backup, or tied with an own host where mail goes
        // first, is a label to show, not evidence: listing Google costs nothing.
        assert_eq!(
            mx_verdict(
                &t,
                "x.example",
                &[(10, "mail.x.example"), (20, "aspmx.l.google.com")]
            ),
            (s.unknown, true, None, google.clone())
        );
        assert_eq!(
            mx_verdict(
                &t,
                "x.example",
                &[(10, "aspmx.l.google.com"), (10, "mail.x.example")]
            ),
            (s.unknown, true, None, google)
        );
        // An allowlisted name keeps its score: MX evidence only adds the flag.
        assert_eq!(
            mx_verdict(&t, "trusted.example", &[(10, "mail.trusted.example")]),
            (s.allowlisted, true, None, None)
        );
    }

    #[test]
    fn own_hosts_with_a_risk_signal_are_not_corporate() {
        let t = mx_table();
        let s = Scores::default();
        let own = (10, "mail.x.example");
        assert_eq!(
            mx_verdict(&t, "x.example", &[own, (20, "mx1.improvmx.com")]),
            (
                s.forwarder_mx,
                false,
                Some(RiskSignal::ForwarderMx),
                Some("ImprovMX".into())
            )
        );
        assert_eq!(
            mx_verdict(&t, "x.example", &[own, (20, "mx1.mailinator.com")]),
            (
                s.disposable_mx,
                false,
                Some(RiskSignal::DisposableMx),
                Some("Mailinator".into())
            )
        );
        assert_eq!(
            mx_verdict(&t, "x.example", &[own, (20, "gmail-smtp-in.l.google.com")]),
            (
                s.unknown,
                false,
                Some(RiskSignal::ConsumerMx),
                Some("Gmail".into())
            )
        );
        // A recognised risky host is found whatever the order it comes in and behind a
        // business provider's backup.
        assert_eq!(
            mx_verdict(
                &t,
                "x.example",
                &[
                    (30, "mx1.improvmx.com"),
                    own,
                    (20, "alt1.aspmx.l.google.com")
                ]
            )
            .2,
            Some(RiskSignal::ForwarderMx)
        );
        for bogus in ["localhost", "192.0.2.1", "2001:db8::1"] {
            assert_eq!(
                mx_verdict(&t, "x.example", &[own, (20, bogus)]),
                (s.unknown, false, Some(RiskSignal::InvalidMxHost), None),
                "{bogus}"
            );
        }
        // A free provider (here allowlisted too) on its own hosts is consumer mail.
        let v = mx_verdict(&t, "126.com", &[(10, "mx.126.com")]);
        assert_eq!(
            (v.0, v.1, v.2),
            (s.allowlisted, false, Some(RiskSignal::FreeProvider))
        );
    }

    proptest::proptest! {
        /// Whatever MX hosts a domain shows, its score drops below `unknown` only when every
        /// host where mail goes first is at a recognised business provider.
        #[test]
        fn only_a_business_primary_lowers_the_score(
            picks in proptest::collection::vec((0u16..4, 0usize..8), 1..5)
        ) {
            const POOL: [&str; 8] = [
                "aspmx.l.google.com",
                "mx1.pphosted.com",
                "mail.x.example",
                "mx.other.example",
                "mx1.improvmx.com",
                "gmail-smtp-in.l.google.com",
                "mx1.mailinator.com",
                "localhost",
            ];
            let t = mx_table();
            let list: Vec<(u16, &str)> = picks.iter().map(|(p, i)| (*p, POOL[*i])).collect();
            let (score, corporate, signal, _) = mx_verdict(&t, "x.example", &list);
            let lowest = list.iter().map(|(p, _)| *p).min().unwrap();
            let business = list
                .iter()
                .filter(|(p, _)| *p == lowest)
                .all(|(_, h)| (h.ends_with("google.com") && !h.starts_with("gmail")) || h.ends_with("pphosted.com"));
            if score < Scores::default().unknown {
                proptest::prop_assert!(business, "{list:?}");
            }
            proptest::prop_assert_eq!(corporate, business || signal.is_none(), "{:?}", list);
        }
    }

    #[test]
    fn age_only_modifies_a_score_and_keeps_an_established_domain_from_its_neighbours() {
        use crate::neighbour_index::{Finding, KeyKind};
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("gmail.com"), ListKind::FreeProvider);
        let table = b.build(Scores::default());
        let scores = Scores::default();
        let rule = AgeRule {
            young_days: 30,
            established_days: 365,
        };
        let young = DomainAge::on(100, 104);
        let old = DomainAge::on(100, 2_000);
        let name = n("fresh.example");
        let own = mx(&[(10, "mail.fresh.example")]);
        let judged = |signals: Signals<'_>| {
            let v = verdict_of(&table, &name, table.lookup(&name), signals, rule);
            (v.record.reason, v.record.risk_score, v.young, v.established)
        };
        // Young: raised, never flagged, also with its own hosts.
        assert_eq!(
            judged(Signals {
                age: Some(young),
                ..Signals::default()
            }),
            (
                Reason::Safe,
                scores.young_domain,
                Some(YoungEffect::Raised),
                false
            )
        );
        assert_eq!(
            judged(Signals {
                mx: Some(&own),
                age: Some(young),
                ..Signals::default()
            }),
            (
                Reason::Safe,
                scores.young_domain_weak_mx,
                Some(YoungEffect::Raised),
                false
            )
        );
        // Old, or the rule off: the age is recorded and nothing changes.
        for (age, r) in [(old, rule), (young, AgeRule::OFF)] {
            let mut v = classify(&table, &name, None);
            apply_age(&mut v, age, r, &scores);
            assert_eq!(v.record.risk_score, scores.unknown);
            assert_eq!((v.young, v.age), (None, Some(age)));
        }
        // The neighbourhood flags a young or unknown-age domain, not an established one.
        let finding = Finding {
            key_kind: KeyKind::Host,
            key: "mx.throw.example".into(),
            listed: 9,
            unlisted: 0,
            vouched: 0,
            throwaway_hosts: 1,
            share: 1.0,
            grounds: Grounds::Lookups,
            own_lookups: true,
            sources: vec![],
            since: None,
            aged_listed: 0,
            holds_pending: false,
        };
        let with = |age, grounds| Signals {
            mx: Some(&own),
            neighbourhood: Some(Finding {
                grounds,
                ..finding.clone()
            }),
            age,
            age_pending: false,
            reported_safe: None,
        };
        // A finding lookups taught (whichever projects, however many): an established age
        // shields; no age (whether the registry is slow, failing or absent) is the answer
        // without one.
        let lookups = Grounds::Lookups;
        assert_eq!(judged(with(Some(young), lookups)).0, Reason::Disposable);
        assert_eq!(judged(with(None, lookups)).0, Reason::Disposable);
        // ... unless the age is on its way from a registry not known to fail: the finding
        // waits for it (safe, pending), as long as the age could outweigh it.
        let pending = |grounds, rule| {
            let s = Signals {
                age_pending: true,
                ..with(None, grounds)
            };
            let v = verdict_of(&table, &name, table.lookup(&name), s, rule);
            (
                v.record.reason,
                v.record.risk_score,
                v.age_pending,
                v.established,
            )
        };
        assert_eq!(
            pending(lookups, rule),
            (Reason::Safe, scores.neighbourhood_established, true, false)
        );
        // The lists alone hold it (no age outweighs that), or establishment is not weighed:
        // nothing to wait for.
        assert_eq!(pending(Grounds::Lists, rule).0, Reason::Disposable);
        let no_establishment = AgeRule {
            established_days: 0,
            ..rule
        };
        assert_eq!(pending(lookups, no_establishment).0, Reason::Disposable);
        // What the gateway's own look holds for every project waits too: names planted before
        // its first pass are its baseline.
        let everyone = Signals {
            age_pending: true,
            neighbourhood: Some(Finding {
                own_lookups: false,
                ..finding.clone()
            }),
            ..with(None, lookups)
        };
        assert_eq!(judged(everyone).0, Reason::Safe);
        // An age in settles it, whatever `age_pending` says.
        let young_in = Signals {
            age_pending: true,
            ..with(Some(young), lookups)
        };
        assert_eq!(judged(young_in).0, Reason::Disposable);
        // ... unless the key's listed names' registration dates are still on their way: the
        // answer waits for them (whether they held the key), a young age in or not.
        for age in [Some(young), None] {
            let undated = Signals {
                neighbourhood: Some(Finding {
                    holds_pending: true,
                    ..finding.clone()
                }),
                ..with(age, lookups)
            };
            let v = verdict_of(&table, &name, table.lookup(&name), undated, rule);
            assert_eq!(
                (v.record.reason, v.age_pending),
                (Reason::Safe, true),
                "{age:?}"
            );
        }
        assert_eq!(
            judged(with(Some(old), lookups)),
            (Reason::Safe, scores.neighbourhood_established, None, true)
        );
        // Listed names on the key the registry shows held long: age does not shield either,
        // from the third.
        for (aged, shielded) in [(2, true), (AGED_LISTED, false)] {
            let held = Signals {
                neighbourhood: Some(Finding {
                    aged_listed: aged,
                    ..finding.clone()
                }),
                ..with(Some(old), lookups)
            };
            assert_eq!(judged(held).3, shielded, "{aged} aged");
        }
        // The operator's lists alone hold it: age does not shield.
        assert_eq!(
            judged(with(Some(old), Grounds::Lists)).0,
            Reason::Disposable
        );
        // A network's finding (a /24 a hosting provider fills with unrelated servers) judges
        // only a domain the registry dates: with no age it is the answer without it, not on
        // the operator's lists' word; a young age lets it judge, an old one shields.
        let network = |age, grounds| {
            let s = Signals {
                neighbourhood: Some(Finding {
                    key_kind: KeyKind::Network,
                    key: "203.0.113.0/24".into(),
                    grounds,
                    ..finding.clone()
                }),
                ..with(age, grounds)
            };
            let v = verdict_of(&table, &name, table.lookup(&name), s, rule);
            (v.record.reason, v.record.risk_score, v.undated_network)
        };
        assert_eq!(
            network(None, lookups),
            (Reason::Safe, scores.neighbourhood_established, true)
        );
        assert_eq!(network(None, Grounds::Lists).0, Reason::Disposable);
        assert_eq!(
            network(Some(young), lookups),
            (Reason::Disposable, scores.mx_neighbourhood, false)
        );
        assert!(!network(Some(old), lookups).2);
        // Enough projects reporting the domain safe do, whatever the finding rests on.
        for grounds in [Grounds::Lookups, Grounds::Lists] {
            let reported = Signals {
                reported_safe: Some(3),
                ..with(Some(young), grounds)
            };
            assert_eq!(judged(reported).0, Reason::Safe);
        }
        // Names a list decides are never touched: a free provider, a listed throwaway.
        for listed in ["gmail.com", "mailinator.com"] {
            let name = n(listed);
            let before = classify(&table, &name, None).record;
            let mut v = classify(&table, &name, None);
            v.weak_mx = true;
            apply_age(&mut v, young, rule, &scores);
            assert_eq!(v.record, before);
            assert_eq!(v.young, None);
        }
    }
}
