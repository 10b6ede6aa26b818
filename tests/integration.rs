//! The integration tests: one test binary (one link, one process whose tests run side by side)
//! holding a module per area, each against the real gateway binary and real servers on loopback.
//! Run one area with `cargo test --test integration AREA::` (e.g. `dashboard::`).

#[path = "common/certs.rs"]
mod certs;
#[path = "common/commit_cutter.rs"]
mod commit_cutter;
mod common;
#[path = "common/dns.rs"]
mod dns;
#[path = "common/postgres.rs"]
mod postgres;
#[path = "common/rdap.rs"]
mod rdap_server;
#[path = "common/redis_server.rs"]
mod redis_server;
#[path = "common/slow_proxy.rs"]
mod slow_proxy;
#[path = "common/webhook.rs"]
mod webhook;

mod access;
mod access_log;
mod alerts;
mod answers;
mod batch;
mod calls;
mod changes;
mod check;
mod cli;
mod control_store;
mod daemon;
mod dashboard;
mod detection;
mod dns_trust;
mod embed;
mod evidence;
mod free_evidence;
mod fuzz_smoke;
mod gcra;
mod h2_bodies;
mod harness;
mod hostile;
mod keys_api;
mod keys_control;
mod keys_expiry;
mod logging;
mod metrics;
mod mx;
mod mx_neighbourhood;
mod no_emails;
mod openapi;
mod overrides;
mod policy;
mod project_webhooks;
mod projects;
mod quota_crash;
mod quota_namespaces;
mod rdap;
mod readme;
mod redis_cluster;
mod redis_quota;
mod relay;
mod relays;
mod reload;
mod reports;
mod routes;
mod service;
mod shared_data;
mod shipped_data;
mod sources;
mod state_files;
mod tenancy;
mod tls;
mod top_evidence;
mod top_live;
mod tracing;
mod typos;
mod upgrade;
mod webhooks_api;
