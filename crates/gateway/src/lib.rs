//! The host (the `drg-gateway` crate): the listener's side and the Pingora glue (`edge`), the
//! `/v1/check` backend (`upstream`), the wiring (`server`), the configuration composed from the
//! parts' own types (`config`), the embedding API (`embed`), the subcommands (`cli`), the shared
//! state (`state`) and the webhook engine composed (`webhooks`). **Not a stable API**: embedders
//! use `domain-risk-gateway`'s root.
//!
//! It owns everything that knows Pingora; the parts are crates below it (ARCHITECTURE.md draws
//! the graph), re-exported here under their module names (`access`, `account`, `changes`,
//! `live_top`, `data`, `mx`, `rdap`, `ops`, `infra`, `answer`, `domain`) so that tests,
//! benchmarks and fuzz targets use one path. Nothing below may import it.

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

/// Access control, in its own crate (`crates/access`).
pub use drg_access as access;
/// Answers as values, in the base crate (`crates/base`).
pub use drg_base::answer;
/// A project's own data, its verdict changes and the live top-domains, in their own crate
/// (`crates/projects`).
pub use drg_projects::{account, changes, live_top};
pub mod cli;
pub mod config;
/// The pure domain logic, its own crate (`crates/domain`).
pub use drg_domain as domain;
/// The evidence parts (the table's inputs, MX, RDAP), in their own crate (`crates/evidence`).
pub use drg_evidence::{data, mx, rdap};
pub mod edge;
pub mod embed;
/// Connections, files and shared records, in the base crate (`crates/base`).
pub use drg_base::infra;
/// Metrics, logs, traces and the process's lifecycle, in their own crate (`crates/telemetry`).
pub use drg_telemetry as ops;
pub mod server;
pub mod state;
pub mod upstream;
pub mod webhooks;

// The embedding API's names at the root too, where the parts' docs link them.
pub use edge::middleware::{Ctx, WithDomainRisk};
pub use embed::{install_logger, Builder, Config, DomainRisk, Error, Finish};
