//! domain-risk-gateway: a Pingora gateway that answers domain-risk lookups itself, from a
//! hot-reloaded in-memory table, and guards the email-check backend it proxies to.
//!
//! - [`domain`]: pure logic (names, records, table, classification), no I/O;
//! - [`access`]: API keys, origins and monthly quotas;
//! - [`config`]: typed settings; [`data_files`]: the table's files on disk;
//! - [`reload`]: hot reload of any file-backed snapshot; [`lifecycle`]: draining on SIGTERM;
//! - [`route`], [`http`], [`gateway`]: routing, local answers, and the Pingora glue;
//! - [`mx`]: DNS lookups of a domain's mail set-up, budgeted and cached;
//! - [`commands`]: what the CLI subcommands do.

pub mod access;
pub mod commands;
pub mod config;
pub mod data_files;
pub mod domain;
pub mod gateway;
pub mod http;
pub mod lifecycle;
pub mod mx;
pub mod reload;
pub mod route;
