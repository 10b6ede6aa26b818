//! domain-risk-gateway: a Pingora gateway that answers domain-risk lookups itself, from a
//! hot-reloaded in-memory table, and guards the email-check backend it proxies to.
//!
//! - [`domain`]: pure logic (names, records, table, classification), no I/O;
//! - [`access`]: API keys, origins and monthly quotas; [`access_log`]: one JSON line per request;
//! - [`config`]: typed settings; [`data_files`]: the table's files on disk; [`sources`]: lists
//!   fetched from URLs into cached files;
//! - [`reload`]: hot reload of any file-backed snapshot; [`lifecycle`]: draining on SIGTERM,
//!   the hand-off on SIGQUIT (graceful upgrade), readiness;
//!   [`periodic`]: the loop every background service runs;
//! - [`logging`]: env_logger with client-caused error lines rate-limited and counted, known
//!   benign Pingora errors re-levelled, and (with [`redact`]) no email address in any line;
//! - [`route`], [`http`], [`gateway`]: routing, local answers, and the Pingora glue;
//!   [`openapi`]: the contract as an OpenAPI document;
//! - [`upstream`]: the request the gateway builds for the backend; [`downstream`]: limits on
//!   client connections;
//! - [`mx`]: DNS lookups of a domain's mail set-up, budgeted and cached;
//! - [`flags`]: the live top-domains (flag counts, their ranking, persistence, Redis sharing);
//! - [`admin`]: the operator-only listener; [`tls`]: the public listener's certificate, reloaded;
//! - [`server`]: wires all of the above into a Pingora server; [`cli`]: the subcommands.

pub mod access;
pub mod access_log;
pub mod admin;
pub mod calls;
pub mod cli;
pub mod config;
pub mod data_files;
pub mod domain;
pub mod downstream;
pub mod flags;
pub mod framing;
pub mod fsutil;
pub mod gateway;
pub mod http;
pub mod keys_api;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod mx;
pub mod openapi;
pub mod periodic;
pub mod redact;
pub mod redis_link;
pub mod relay;
pub mod reload;
pub mod route;
pub mod server;
pub mod sources;
pub mod tls;
pub mod upstream;
