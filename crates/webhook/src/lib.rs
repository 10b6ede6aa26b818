//! The signed-webhook engine. It owns where a webhook may go (the destination guard, `guard`,
//! judged on the configured URL and again on every address when sending, `resolve`), how it is
//! signed (`sign`), one durable outbox (`outbox`) and one deliverer (`engine`): quota alerts,
//! verdict changes and each project's own webhooks hand their messages to it, and it delivers
//! them with retries that survive a restart, a lane at a time (a slow receiver holds up its own
//! lane only). A producer may keep its own record of a hand-over there (a hold, held back from
//! delivery until it releases it): the outbox is then the one durable record of what it sends.
//!
//! It must never import a gateway part, Pingora or a store: producers say what to send
//! ([`Message`]) and the gateway says where a destination is ([`Directory`]).

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod client;
pub mod config;
pub mod engine;
pub mod guard;
pub mod holder;
pub mod outbox;
pub mod resolve;
pub mod sign;

use std::time::Duration;

pub use engine::{Engine, Sender};

/// One message to deliver, as a producer hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Unique in the outbox: a message handed over twice (after a crash) is delivered once.
    pub key: String,
    /// What it tells: `quota.threshold`, `verdict.changed` (counted by it).
    pub topic: String,
    /// What the logs call it: `quota alert`, `verdict changes message`.
    pub label: String,
    /// Where it goes, as the [`Directory`] knows it (read again at each attempt: a destination
    /// removed meanwhile drops it; one not known here yet is tried again later).
    pub destination: String,
    /// Messages of a lane go in order, one at a time; lanes go side by side.
    pub lane: String,
    /// The header carrying its fixed id (`X-Alert-Id`, `X-Change-Id`); every message also
    /// carries it as `Webhook-Id`, the one header receivers dedupe on.
    pub id_header: String,
    pub id: String,
    /// The JSON body, fixed at the hand-over (every attempt signs and sends the same bytes).
    pub body: String,
}

/// Where a destination is, when a message to it is tried.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    pub secret: Vec<u8>,
    /// The client: its timeout and its guard's policy (`client::agent`).
    pub agent: ureq::Agent,
    pub max_attempts: u32,
    /// Also sign with the untimed `X-Signature` (the operator's receivers, for the release
    /// their code may still read it); projects' webhooks get `Webhook-Signature` only, whose
    /// time lets a receiver refuse a replayed capture.
    pub legacy_signature: bool,
}

/// A project webhook's destination name: `project:<project>:<id>` (ids hold no `:`).
pub fn project_destination(project: &str, id: &str) -> String {
    format!("project:{project}:{id}")
}

/// The project and webhook id of a project webhook's `destination` (`None`: one of the
/// operator's receivers).
pub fn project_of(destination: &str) -> Option<(&str, &str)> {
    destination.strip_prefix("project:")?.rsplit_once(':')
}

/// What the [`Directory`] knows of a destination when a message to it is tried.
pub enum Found {
    /// In force: post there.
    Target(Target),
    /// Removed (or no longer configured): its messages are dropped.
    Gone,
    /// Not known here yet (this gateway has not read it, or the records are still loading):
    /// the message is tried again after the backoff, as after a failed attempt, and given up
    /// after [`config::default_attempts`] tries. Never a reason to drop: a message handed over
    /// for a webhook is not lost because one gateway's memory lags.
    NotHere,
}

/// The destinations: the operator's configured receivers and the projects' own webhooks.
pub trait Directory: Send + Sync {
    fn target(&self, destination: &str) -> Found;
}

/// Who receives a project's messages of a topic: the destinations, as the [`Directory`] names
/// them (the operator's receiver, the project's own webhooks).
pub trait Subscribers: Send + Sync {
    fn destinations(&self, project: &str, topic: &str) -> Vec<String>;
}

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    /// Failed; tried again after the backoff.
    Retrying,
    /// Failed for the last time (`max_attempts`).
    GivenUp,
    /// The guard refused every address of the receiver: given up at once.
    Refused,
    /// The destination was gone.
    Dropped,
}

/// Told of every attempt's outcome (the producers' counters).
pub trait Observer: Send + Sync {
    fn observe(&self, message: &Message, outcome: Outcome);
}

/// An observer that counts nothing.
pub struct Unobserved;

impl Observer for Unobserved {
    fn observe(&self, _: &Message, _: Outcome) {}
}

/// An attempt's budget is at most this (`config::delivery_problems`); a message is leased for
/// it and some, so no other deliverer tries it meanwhile.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
