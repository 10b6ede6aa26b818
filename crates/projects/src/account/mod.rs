//! A project's own data: the keys API, its overrides and webhooks, and the call stores behind
//! `/v1/logs` and `/v1/stats`.

pub mod audit;
pub mod calls;
pub mod config;
pub mod keys_api;
pub mod migrate;
pub mod once;
pub mod overrides;
pub mod reports;
pub mod routes;
pub mod usage;
pub mod webhooks;
