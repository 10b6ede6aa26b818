//! The base every part of the gateway stands on: connections and files (`infra`: the Redis
//! link, the DNS client, outgoing HTTP's TLS, atomic and private files, SQLite opened one way,
//! the small per-project records every gateway shares), answers as values (`answer`), the one
//! background-service contract (`service`), its loop (`periodic`) and the reloader (`reload`).
//!
//! It must never import a gateway part or Pingora: the host runs each [`service::Service`] as
//! one of Pingora's background services.

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod answer;
pub mod infra;
pub mod periodic;
pub mod reload;
pub mod service;
