//! The host (the `drg-gateway` crate): the listener's side and the Pingora glue (`edge`), the
//! `/v1/check` backend (`upstream`), the wiring (`server`), the configuration composed from the
//! parts' own types (`config`), the embedding API (`embed`), the subcommands (`cli`), the shared
//! state (`state`) and the webhook engine composed (`webhooks`). **Not a stable API**: embedders
//! use `domain-risk-gateway`'s root.
//!
//! It owns everything that knows Pingora; the parts are crates below it (ARCHITECTURE.md draws
//! the graph), and code here, in the tests, benchmarks and fuzz targets names them by their
//! own names (`drg_access`, `drg_projects`, ...): a reader sees which crate a name lives in.
//! Nothing below may import it.

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cli;
pub mod config;
pub mod edge;
pub mod embed;
pub mod server;
pub mod state;
pub mod upstream;
pub mod webhooks;

// The embedding API's names at the root too, where the parts' docs link them.
pub use edge::middleware::{Ctx, WithDomainRisk};
pub use embed::{install_logger, Builder, Config, DomainRisk, Error, Finish};
