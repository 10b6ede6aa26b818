//! A project's own data and what it is told (the `drg-projects` crate): its account (`account`:
//! usage, call logs, keys made through the API, overrides, reports, webhooks, the audit trail),
//! the verdict changes of the domains it asked about (`changes`), and the live top-domains its
//! lookups feed (`live_top`).
//!
//! It must never import the host (edge, upstream, server) or Pingora (the compiler's): the host
//! routes a request to these and writes the answer they make.

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod account;
pub mod changes;
pub mod live_top;
