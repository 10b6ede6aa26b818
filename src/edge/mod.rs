//! The listener's side: the Pingora glue, routes, framing, connection limits, local answers, TLS and the OpenAPI document.

pub mod config;
pub mod downstream;
pub mod framing;
pub mod gateway;
pub mod http;
pub mod openapi;
pub mod route;
pub mod tls;
