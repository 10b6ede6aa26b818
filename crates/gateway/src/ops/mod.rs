//! What operators see and steer: metrics, logging, the access log, traces,
//! draining and hand-off, the background-service loop.

pub mod access_log;
pub mod config;
pub mod connections;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
/// The background services' loop, in the base crate.
pub use drg_base::periodic;
pub mod redact;
pub mod request_ids;
pub mod trace;
