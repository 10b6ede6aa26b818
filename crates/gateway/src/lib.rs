//! The domain-risk gateway's parts, as a crate of the workspace: the binary, the embedding API
//! (the `domain-risk-gateway` package's root), the tests, benchmarks and fuzz targets use them.
//! **Not a stable API**: anything here may change in any release; embedders use
//! `domain-risk-gateway`'s root.
//!
//! The parts (ARCHITECTURE.md has the map and the rules on who imports whom): `edge` (the
//! listener's side and the Pingora glue), `account`, `access`, `upstream`, `changes`, `mx`,
//! `rdap`, `live_top`, `data`, `ops`; `infra` and `answer` (the `drg-base` crate) and `domain`
//! (pure: the `drg-domain` crate); `state` is shared by all; `config` composes the parts' configuration; `server` wires
//! everything; `embed` is the embedding API; `cli` holds the subcommands.

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
