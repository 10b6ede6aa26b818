//! The listener's side: the Pingora glue, routes, framing, connection limits, local answers, TLS,
//! the OpenAPI document and the browser dashboard's files.

pub mod admin;
pub mod batch;
pub mod bodies;
pub mod config;
pub mod cors;
pub mod dashboard;
pub mod downstream;
pub mod framing;
pub mod gateway;
pub mod http;
pub mod middleware;
pub mod mount;
pub mod openapi;
pub mod route;
pub mod signals;
pub mod tls;
