//! What operators see and steer (the `drg-telemetry` crate): metrics, logging, the access log,
//! traces, draining and hand-off.
//!
//! It must never import a gateway part or Pingora: parts record into its types, the host
//! classifies Pingora's errors and signals (`upstream::errors`, `edge::signals`).

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

/// The commit this build is made from (`build.rs`; "unknown" outside a git checkout).
pub const GIT_HASH: &str = env!("DRG_GIT_HASH");

pub mod access_log;
pub mod config;
pub mod connections;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod redact;
pub mod request_ids;
pub mod trace;
