//! domain-risk-gateway: a Pingora gateway that answers domain-risk lookups itself, from a
//! hot-reloaded in-memory table, and guards the email-check backend it relays to.
//!
//! The parts (ARCHITECTURE.md has the map and the rules on who imports whom):
//! - [`edge`]: the listener's side: the Pingora glue ([`edge::gateway`]), routes, framing,
//!   connection limits, the writer of local answers, TLS, the OpenAPI document;
//! - [`account`]: a project's own data: the keys API and the call stores of logs and stats;
//! - [`access`]: API keys, origins, plans, monthly quotas and per-key rates; decisions are values;
//! - [`upstream`]: the `/v1/check` request the gateway builds, and the relay that sends it;
//! - [`domain`]: pure logic (names, records, table, classification), no I/O;
//! - [`mx`]: DNS lookups of a domain's mail set-up, budgeted and cached;
//! - [`flags`]: the live top-domains (flag counts, ranking, persistence, Redis sharing);
//! - [`data`]: the table's files on disk, lists fetched from URLs, hot reload of any file;
//! - [`ops`]: admin listener, metrics, logging, access log, draining and hand-off, periodic loops;
//! - [`infra`]: the Redis connection, atomic file replacement, units;
//! - [`state`] and [`answer`]: what every part shares (the request-time snapshots; answers as
//!   values and the contract's error body);
//! - [`config`]: composes the parts' configuration types; [`server`]: wires everything into a
//!   Pingora server; [`cli`]: the subcommands.

pub mod access;
pub mod account;
pub mod answer;
pub mod cli;
pub mod config;
pub mod data;
pub mod domain;
pub mod edge;
pub mod flags;
pub mod infra;
pub mod mx;
pub mod ops;
pub mod server;
pub mod state;
pub mod upstream;
