//! The attacks of a detection run, against its gateway: the planting attacks (one attacker
//! project's, and those of K attacker projects together), round by round, each planted name
//! re-registered (its DNS served: it was lapsed) just before its round, the victims looked up by
//! their own deployment project after each round; and one project's repeated lookups for
//! top-domains.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::deployment::Bench;
use super::projects::{ATTACKER, ATTACKERS, SOLO};
use super::world::{Attack, Bucket, Lapsed, Through, World};

/// One attack's result: the planted listed domains after which a victim was first flagged
/// (in the victims' project's answers), if any was, and which victim's bucket; and after how
/// many each victim was (the attack goes on until every victim is flagged or nothing is left
/// to plant: what flagging an established victim costs).
#[derive(Debug, Clone)]
pub struct AttackOutcome {
    pub class: &'static str,
    /// Projects that planted (in turn).
    pub attackers: usize,
    pub through: Through,
    pub needed: Option<usize>,
    pub tried: usize,
    pub victim: Option<Bucket>,
    /// Every victim flagged: its bucket and the planted domains after which it first was.
    pub flagged: Vec<(Bucket, usize)>,
    /// Victims of the attack.
    pub victims: usize,
}

impl AttackOutcome {
    /// The report's cell: each victim flagged, after how many planted (its age bucket), or
    /// `none/N`.
    pub fn cell(&self) -> String {
        if self.flagged.is_empty() {
            return format!("none/{}", self.tried);
        }
        let each: Vec<String> = (self.flagged.iter())
            .map(|(b, n)| format!("{n} ({})", b.label()))
            .collect();
        each.join(" + ")
    }
}

/// The project that plants an attack's `k`-th domain: the attack's attackers in turn, or the
/// deployment's own `projects` in turn (in a one-project deployment, its project).
fn planter(
    attack: &Attack,
    k: usize,
    one_project: bool,
    projects: &[&'static str],
) -> &'static str {
    match attack.through {
        _ if one_project => SOLO,
        Through::Deployment => projects[k % attack.attackers.clamp(1, projects.len())],
        Through::SelfServe => ATTACKERS[k % attack.attackers.clamp(1, ATTACKERS.len())],
    }
}

/// Each planter asks its names, the planters side by side (an attacker does not wait for
/// another's answers).
fn plant(bench: &Bench, planted: &[(&'static str, String)]) {
    let mut by: Vec<(&'static str, Vec<String>)> = Vec::new();
    for (project, name) in planted {
        match by.iter_mut().find(|(p, _)| p == project) {
            Some((_, names)) => names.push(name.clone()),
            None => by.push((project, vec![name.clone()])),
        }
    }
    std::thread::scope(|s| {
        for (project, names) in &by {
            s.spawn(move || bench.ask(project, names));
        }
    });
}

/// Plants the attacks' listed domains one at a time, the k-th of every attack together (they
/// aim at separate hosts and networks), each re-registered from `lapsed` (its zone served) just
/// before its round; after each round, every victim of an attack still going is looked up by
/// `victims_project`.
pub fn attack_all(
    bench: &Bench,
    attacks: &[&Attack],
    lapsed: &HashMap<String, Lapsed>,
    (one_project, projects): (bool, &[&'static str]),
    victims_project: &str,
    most: usize,
) -> Vec<AttackOutcome> {
    let mut out: Vec<AttackOutcome> = attacks
        .iter()
        .map(|a| AttackOutcome {
            class: a.class,
            attackers: a.attackers,
            through: a.through,
            needed: None,
            tried: 0,
            victim: None,
            flagged: Vec::new(),
            victims: a.victims.len(),
        })
        .collect();
    for k in 0..most {
        let going: Vec<usize> = (0..attacks.len())
            .filter(|&i| out[i].flagged.len() < out[i].victims && k < attacks[i].planted.len())
            .collect();
        if going.is_empty() {
            break;
        }
        let planted: Vec<(&'static str, String)> = going
            .iter()
            .map(|&i| {
                let a = attacks[i];
                (planter(a, k, one_project, projects), a.planted[k].clone())
            })
            .collect();
        // Lapsed until now: the attacker re-registers this round's names and points their MX
        // at the victims' hosts, then asks for them.
        for (_, name) in &planted {
            let was = lapsed.get(name).expect("a planted name is a lapsed one");
            bench.re_register(name, was);
        }
        let before = bench.taught().unwrap_or(0.0);
        plant(bench, &planted);
        let quiet = Duration::from_millis(150);
        bench.wait_taught(before + planted.len() as f64, quiet, Duration::from_secs(3));
        let victims: Vec<(usize, &(String, Bucket))> = going
            .iter()
            .flat_map(|&i| attacks[i].victims.iter().map(move |v| (i, v)))
            .collect();
        let names: Vec<String> = victims.iter().map(|(_, (d, _))| d.clone()).collect();
        for &i in &going {
            out[i].tried = k + 1;
        }
        // The victims' own project's answers. What one project alone taught judges only that
        // project's answers (DESIGN: the rule the goal holds the model to), so the attacker's
        // own lookups of the victims are not the victims' harm; in a one-project deployment
        // the victims' project is the attacker's, and its cost is reported.
        for ((i, (_, bucket)), answer) in victims.iter().zip(bench.ask(victims_project, &names)) {
            let o = &mut out[*i];
            if answer.flagged() && !o.flagged.iter().any(|(b, _)| b == bucket) {
                o.flagged.push((*bucket, k + 1));
                if o.needed.is_none() {
                    o.needed = Some(k + 1);
                    o.victim = Some(*bucket);
                }
            }
        }
    }
    out
}

/// The attacker looks each pushed name up 12 times, and the listed control as often (the twelve
/// rounds side by side); once the control is ranked (or 10 s passed), which pushed names are.
pub fn top_push(bench: &Bench, world: &World) -> (Vec<String>, bool) {
    let names: Vec<String> = world
        .pushed
        .iter()
        .chain([&world.pushed_control])
        .cloned()
        .collect();
    // Twelve rounds at once: an attacker does not wait for its answers.
    std::thread::scope(|s| {
        for _ in 0..12 {
            s.spawn(|| bench.ask(ATTACKER, &names));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = bench.gw.get("/v1/public/top-domains?limit=1000");
        let ranked: Vec<String> = r.json()["domains"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["domain"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let control = ranked.contains(&world.pushed_control);
        if control || Instant::now() > deadline {
            let pushed = world
                .pushed
                .iter()
                .filter(|p| ranked.contains(p))
                .cloned()
                .collect();
            return (pushed, control);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
