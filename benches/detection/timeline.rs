//! The time axis (issue 94, item 5): days pass for one deployment. On day 1 an attacker
//! re-registers lapsed listed names and points them at a company's own host, holds them 1, 30
//! or 90 days, then lets them lapse again; another company's host had names planted 40 days
//! before the deployment first started; a throwaway service moves its listed names, held
//! for years, from its host to a new one on day 1, where its new throwaways then receive mail;
//! and another's host has a reverse zone that refuses on some days and answers on others.
//! The gateway runs on the days something happens (and every 15 days between), stopped in
//! between while the days pass in its state files: the look passes at each start, as it does
//! daily. Each day the host's customers seen on day 0 are asked again, and domains the gateway
//! never saw (newcomers: customers, or the service's throwaways) are first asked on set days,
//! one of every age bucket: who is flagged, first answer and settled.

use std::path::Path;
use std::time::Duration;

use super::client::Route;
use super::deployment::{Bench, PAST_FILE};
use super::facts;
use super::spec::{Look, Rdap, Spec};
use super::world::{Bucket, Lapsed, World, MAX_PLANTED};
use crate::dns::DnsServer;

/// The days the gateway runs: events, newcomers' days, and no gap over 15 days (a name let go
/// is seen without mail well within its `hold_days`, as the daily look would).
const DAYS: [u32; 14] = [0, 1, 2, 16, 31, 32, 46, 61, 76, 91, 92, 106, 121, 122];
/// The day the attacker plants (re-registers and points) its names.
const PLANT_DAY: u32 = 1;
/// How long each attack holds its names on the host.
const HOLDS: [u32; 3] = [1, 30, 90];
/// The days a held attack's newcomers are first asked: the day after a one-day hold, past a
/// 30-day hold, past a 90-day one.
const NEWCOMER_DAYS: [u32; 3] = [2, 32, 92];
/// The days the moved service's throwaways are first asked: as a held attack's newcomers, and
/// past a hold of 120 days.
const MOVED_DAYS: [u32; 4] = [2, 32, 92, 122];
/// The days the refusing service's throwaways are first asked: its reverse zone refusing (the
/// first pass), answering, refusing again, answering again.
const REFUSING_DAYS: [u32; 4] = [0, 16, 32, 92];
/// Whether the refusing service's reverse zone answers REFUSED on `day`.
fn refuses(day: u32) -> bool {
    day < 16 || (32..=61).contains(&day)
}
/// The days a fresh start's newcomers are first asked.
const FRESH_DAYS: [u32; 3] = [0, 1, 32];
/// Days before the deployment's first start that the fresh start's names were re-registered.
const PLANTED_BEFORE: i64 = 40;

/// What happens to a host's listed names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Re-registered on [`PLANT_DAY`], pointed at a company's own host, held that many days.
    Held(u32),
    /// Re-registered and pointed at a company's own host before the deployment started, held
    /// all along.
    Before,
    /// A throwaway service's own, held for years, moved from its host to a new one on
    /// [`PLANT_DAY`] and kept there; its newcomers are its throwaways (flagged: caught).
    Moved,
    /// A throwaway service's own on its host, whose reverse zone refuses on the days
    /// [`refuses`] says; its newcomers are its throwaways (flagged: caught).
    Refusing,
}

/// One host's story: an attack on a company's own host, or a service's move.
pub struct Plant {
    pub kind: Kind,
    pub planted: Vec<String>,
    /// Where a moved name's mail goes from [`PLANT_DAY`] (its zone and records then).
    pub moved: std::collections::HashMap<String, Lapsed>,
    /// The addresses whose reverse zone refuses on the days [`refuses`] says.
    pub refusing: Vec<std::net::Ipv4Addr>,
    /// The host's customers the gateway sees on day 0 (none on the fresh start's host).
    pub seen: Vec<(String, Bucket)>,
    /// Customers first asked on a later day.
    pub newcomers: Vec<(u32, String, Bucket)>,
}

impl Plant {
    pub fn label(&self) -> String {
        match self.kind {
            Kind::Held(1) => "held 1 day".to_owned(),
            Kind::Held(h) => format!("held {h} days"),
            Kind::Before => format!("planted {PLANTED_BEFORE} days before the start"),
            Kind::Moved => "a service's aged names moved (its throwaways)".to_owned(),
            Kind::Refusing => {
                "a service's reverse zone refusing on some days (its throwaways)".to_owned()
            }
        }
    }
}

/// The attacks drawn into a world.
pub struct Timeline {
    pub plants: Vec<Plant>,
}

impl Timeline {
    /// Draws the attacks into `world` (after the rest of it, from its own stream: the rest of
    /// the world is drawn as before).
    pub fn draw(world: &mut World) -> Timeline {
        let own = world.rng.fork("timeline");
        let rest = std::mem::replace(&mut world.rng, own);
        let kinds = HOLDS.iter().map(|&h| Kind::Held(h)).chain([Kind::Before]);
        let mut plants: Vec<Plant> = kinds.map(|kind| plant(world, kind)).collect();
        plants.push(moved(world));
        plants.push(refusing(world));
        world.rng = rest;
        Timeline { plants }
    }
}

/// A company on `hosts` whose age falls in `bucket` on the day it is first asked, `asked_on`
/// (its registration that many days later than drawn: a young newcomer of day 92 registered
/// after day 0).
fn customer(world: &mut World, hosts: &[String], bucket: Bucket, asked_on: u32) -> String {
    let tld = world.company_tld(bucket);
    let d = world.fresh_name(&tld);
    let days = world.age_in(bucket, facts::company_age) - i64::from(asked_on);
    world.domain(&d, hosts, "a mx ~all", days);
    d
}

fn plant(world: &mut World, kind: Kind) -> Plant {
    let host = world.own_host_in(None);
    let held = matches!(kind, Kind::Held(_));
    let seen = if held {
        (Bucket::ALL.iter())
            .map(|&b| (customer(world, &host, b, 0), b))
            .collect()
    } else {
        Vec::new()
    };
    let days = if held { NEWCOMER_DAYS } else { FRESH_DAYS };
    let mut newcomers = Vec::new();
    for day in days {
        for &b in &Bucket::ALL {
            newcomers.push((day, customer(world, &host, b, day), b));
        }
    }
    let planted: Vec<String> = (0..MAX_PLANTED)
        .map(|_| {
            let d = world.throwaway_name();
            // Re-registered: the registry gives the day it was registered again (the plant
            // day, after day 0: a negative age on day 0).
            let age = if held {
                -i64::from(PLANT_DAY)
            } else {
                PLANTED_BEFORE
            };
            world.domain(&d, &host, "mx -all", age);
            world.listed.push(d.clone());
            d
        })
        .collect();
    if held {
        // Lapsed until the plant day: no zone served.
        for d in &planted {
            let lapsed = take_zone(world, d);
            world.lapsed.insert(d.clone(), lapsed);
        }
    }
    Plant {
        kind,
        planted,
        moved: Default::default(),
        refusing: Vec::new(),
        seen,
        newcomers,
    }
}

/// `d`'s zone and records, out of the world's.
fn take_zone(world: &mut World, d: &str) -> Lapsed {
    let zone = world.zones.remove(d).expect("a name's zone");
    let records = [d.to_owned(), format!("_dmarc.{d}")]
        .into_iter()
        .filter_map(|n| world.records.remove(&n).map(|r| (n, r)))
        .collect();
    Lapsed { zone, records }
}

/// A throwaway service (one of the published clusters' count of listed names, their ages at
/// listing as published) moves its names from its host to a new one on [`PLANT_DAY`]; its
/// unlisted throwaways, one of every age bucket, arrive on the new host on [`MOVED_DAYS`].
fn moved(world: &mut World) -> Plant {
    let mut tenants = Vec::new();
    let old = world.operator_hosts(&mut tenants);
    let new = world.operator_hosts(&mut tenants);
    let n = *world.rng.pick(&facts::CLUSTER_LISTED);
    let mut planted = Vec::new();
    let mut moved = std::collections::HashMap::new();
    for _ in 0..n {
        let d = world.throwaway_name();
        let days = facts::listing_age(&mut world.rng) as i64;
        world.domain(&d, &new, "mx -all", days);
        moved.insert(d.clone(), take_zone(world, &d));
        world.domain(&d, &old, "mx -all", days);
        world.listed.push(d.clone());
        planted.push(d);
    }
    Plant {
        kind: Kind::Moved,
        planted,
        moved,
        refusing: Vec::new(),
        seen: Vec::new(),
        newcomers: throwaways(world, &new, &MOVED_DAYS),
    }
}

/// A service's unlisted throwaways on `hosts`, one of every age bucket first asked on each of
/// `days` (their ages the unlisted ones' on that day).
fn throwaways(world: &mut World, hosts: &[String], days: &[u32]) -> Vec<(u32, String, Bucket)> {
    let mut out = Vec::new();
    for &day in days {
        for &b in &Bucket::ALL {
            let tld = world.throwaway_tld(b);
            let d = world.fresh_name(&tld);
            let age = world.age_in(b, facts::unlisted_age) - i64::from(day);
            world.domain(&d, hosts, "mx -all", age);
            out.push((day, d, b));
        }
    }
    out
}

/// A throwaway service on its own host (a published cluster's count of listed names, their
/// ages at listing as published) whose reverse zone refuses on the days [`refuses`] says.
fn refusing(world: &mut World) -> Plant {
    let mut tenants = Vec::new();
    let hosts = world.operator_hosts(&mut tenants);
    let refusing = (hosts.iter()).filter_map(|h| world.zones[h].a).collect();
    let n = *world.rng.pick(&facts::CLUSTER_LISTED);
    let planted: Vec<String> = (0..n)
        .map(|_| {
            let d = world.throwaway_name();
            let days = facts::listing_age(&mut world.rng) as i64;
            world.domain(&d, &hosts, "mx -all", days);
            world.listed.push(d.clone());
            d
        })
        .collect();
    Plant {
        kind: Kind::Refusing,
        planted,
        moved: Default::default(),
        refusing,
        seen: Vec::new(),
        newcomers: throwaways(world, &hosts, &REFUSING_DAYS),
    }
}

/// One customer's answers on one day.
#[derive(Debug, Clone)]
pub struct Row {
    pub plant: usize,
    /// First asked that day (a newcomer), or seen on day 0.
    pub newcomer: bool,
    pub day: u32,
    pub bucket: Bucket,
    pub first_flagged: bool,
    pub settled_flagged: bool,
}

/// Days pass for a stopped gateway's folder: every day its neighbourhood's state recorded
/// (`seen`, `since`, `first`, `live`, `watched`) moves `n` days back, and the registration days its RDAP cache
/// holds (`r`). Fails on a line it cannot read: a format it does not know must not pass as
/// days that passed.
fn pass_days(dir: &Path, n: u32) {
    let shift = |file: &str, fields: &[&str]| {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let mut out = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{file}: a line the timeline cannot read: {e}"));
            for f in fields {
                if let Some(day) = v[*f].as_i64() {
                    v[*f] = serde_json::json!(day - i64::from(n));
                }
            }
            out.push_str(&v.to_string());
            out.push('\n');
        }
        std::fs::write(&path, out).expect("a state file");
    };
    shift(
        "state/mx_neighbourhood.jsonl",
        &["seen", "since", "first", "live", "watched"],
    );
    shift(PAST_FILE, &["r"]);
}

/// Runs the days of `timeline` in `world` under `rdap`: every customer's answers, by day.
pub fn run(world: &World, timeline: &Timeline, repo: &Path, rdap: Rdap) -> Vec<Row> {
    let spec = Spec {
        rdap,
        look: Look::On,
        route: Route::Get,
        one_project: false,
        settle: Duration::from_secs(20),
        outage: Duration::ZERO,
        planted: MAX_PLANTED,
    };
    let project = world.projects[0];
    let mut dns = Some(DnsServer::start_world(
        world.zones.clone(),
        world.ptr.clone(),
        world.records.clone(),
    ));
    let mut dir: Option<tempfile::TempDir> = None;
    let mut last = 0;
    let mut rows = Vec::new();
    for day in DAYS {
        let served = dns.take().expect("the DNS server");
        for p in &timeline.plants {
            for ip in &p.refusing {
                served.set_refused(*ip, refuses(day));
            }
            let hold = match p.kind {
                Kind::Held(hold) => Some(hold),
                Kind::Moved => None,
                Kind::Before | Kind::Refusing => continue,
            };
            for d in &p.planted {
                if day == PLANT_DAY {
                    let to = p.moved.get(d).unwrap_or_else(|| &world.lapsed[d]);
                    served.set_zone(d, Some(to.zone.clone()));
                    for (n, r) in &to.records {
                        served.set_records(n, Some(r.clone()));
                    }
                } else if hold.is_some_and(|h| day == PLANT_DAY + h) {
                    served.set_zone(d, None);
                }
            }
        }
        if let Some(d) = &dir {
            pass_days(d.path(), day - last);
        }
        let bench = Bench::start_in(world, repo, &spec, served, (i64::from(day), dir.take()));
        bench.wait_first_look(Duration::from_secs(120));
        // Today's customers: those seen on day 0 (asked every day, as customers are), and the
        // newcomers of today.
        let mut asked: Vec<(usize, bool, Bucket, &str)> = Vec::new();
        for (i, p) in timeline.plants.iter().enumerate() {
            asked.extend(p.seen.iter().map(|(d, b)| (i, false, *b, d.as_str())));
            asked.extend(
                (p.newcomers.iter())
                    .filter(|(on, _, _)| *on == day)
                    .map(|(_, d, b)| (i, true, *b, d.as_str())),
            );
        }
        let names: Vec<String> = asked.iter().map(|a| a.3.to_owned()).collect();
        let first = bench.ask(project, &names);
        if rdap != Rdap::Off {
            bench.settle(spec.settle, (0.0, 0));
        }
        let settled = bench.ask(project, &names);
        for ((a, f), s) in asked.iter().zip(&first).zip(&settled) {
            rows.push(Row {
                plant: a.0,
                newcomer: a.1,
                day,
                bucket: a.2,
                first_flagged: f.flagged(),
                settled_flagged: s.flagged(),
            });
        }
        let (d, served) = bench.stop();
        dir = Some(d);
        dns = Some(served);
        last = day;
    }
    rows
}

/// The table of one condition's runs (every seed): flagged customers, settled (first answers
/// in brackets where they differ), by attack, seen or newcomer, day and age bucket.
pub fn table(timeline: &Timeline, rows: &[Row]) -> String {
    let mut out = String::from(
        "| attack | customers | day | under 45 days | 45 days to a year | over a year | no RDAP |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let mut keys: Vec<(usize, bool, u32)> =
        rows.iter().map(|r| (r.plant, r.newcomer, r.day)).collect();
    keys.sort_unstable();
    keys.dedup();
    for (plant, newcomer, day) in keys {
        // Customers seen on day 0: shown on the newcomers' days and the last day.
        let shown = newcomer
            || day == 0
            || day == *DAYS.last().expect("days")
            || timeline.plants[plant].newcomers.iter().any(|n| n.0 == day);
        if !shown {
            continue;
        }
        let mut cells = Vec::new();
        for b in Bucket::ALL {
            let of: Vec<&Row> = (rows.iter())
                .filter(|r| (r.plant, r.newcomer, r.day, r.bucket) == (plant, newcomer, day, b))
                .collect();
            let settled = of.iter().filter(|r| r.settled_flagged).count();
            let first = of.iter().filter(|r| r.first_flagged).count();
            cells.push(if first == settled {
                format!("{settled}/{}", of.len())
            } else {
                format!("{settled}/{} ({first})", of.len())
            });
        }
        out.push_str(&format!(
            "| {} | {} | {day} | {} |\n",
            timeline.plants[plant].label(),
            if newcomer {
                "first asked"
            } else {
                "seen on day 0"
            },
            cells.join(" | ")
        ));
    }
    out
}
