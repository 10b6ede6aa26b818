//! What one deployment's run is set up with (`Spec`, with its RDAP condition `Rdap`) and what
//! the registries did in it (`RdapNote`). These plain types are shared by `runner.rs` and the
//! modules it drives (`deployment.rs` reads the spec and makes the note); they live here, below
//! both, so that imports run one way: runner -> deployment -> spec.

use std::time::Duration;

use super::client::Route;

/// Domain age in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rdap {
    /// As shipped: every registry answers, paced one request a second.
    On,
    /// `rdap.enabled: false`.
    Off,
    /// As shipped, while the busiest registries misbehave for the first part of the run
    /// (`Spec::outage`): Verisign's `.com` answers 429 (`Retry-After: 10`), its `.net` and
    /// PIR's `.org` 503, CentralNic's TLDs hang past the gateway's timeout.
    Failing,
    /// As shipped, while every registry answers 503 for the whole run: no egress to RDAP (a
    /// usual platform deployment), or every registry down.
    Unreachable,
}

impl Rdap {
    /// The conditions the gate holds (`tests/detection.rs`; the benchmark runs [`Rdap::EVERY`]).
    #[allow(dead_code)]
    pub const ALL: [Rdap; 3] = [Rdap::On, Rdap::Off, Rdap::Failing];
    /// Every condition the benchmark runs by default.
    pub const EVERY: [Rdap; 4] = [Rdap::On, Rdap::Off, Rdap::Failing, Rdap::Unreachable];

    pub fn label(self) -> &'static str {
        match self {
            Rdap::On => "on",
            Rdap::Off => "off",
            Rdap::Failing => "failing",
            Rdap::Unreachable => "unreachable",
        }
    }
}

/// The gateway's background look at its listed names (`gateway.mx.neighbourhood.look`): where
/// each one's mail goes, from the start and then daily, so a lapsed listed name re-registered
/// later plants nothing until it has held its new hosts `hold_days`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Look {
    /// `look: {enabled: true, ...}`; the run waits for the first pass before the past.
    On,
    /// `look: {enabled: false}` (`--look off`): the state before the look.
    Off,
}

impl Look {
    #[allow(dead_code)]
    pub fn label(self) -> &'static str {
        match self {
            Look::On => "on",
            Look::Off => "off",
        }
    }
}

/// One deployment's run.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub rdap: Rdap,
    /// The gateway's look at its listed names.
    pub look: Look,
    pub route: Route,
    /// All traffic from one project (the attacks only) instead of several.
    pub one_project: bool,
    /// The longest the settling waits for RDAP.
    pub settle: Duration,
    /// How long the failing registries misbehave, from the start.
    pub outage: Duration,
    /// Listed domains each attack plants at most.
    pub planted: usize,
}

/// What the registries did by the end of the settling.
#[derive(Debug, Clone, Copy, Default)]
pub struct RdapNote {
    pub found: f64,
    pub errors: f64,
    /// Names still waiting when the settling stopped.
    pub queued: f64,
    /// Misses not queued (the queue or a project's share full).
    pub queue_full: f64,
    /// Ages the cache held at start, of the past's ages written to its file.
    pub past_loaded: f64,
    pub past: usize,
    pub settle_secs: f64,
}
