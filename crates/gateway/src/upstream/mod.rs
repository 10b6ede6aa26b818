//! The `/v1/check` backend: the request the gateway builds, and the relay that sends it.

pub mod config;
pub mod errors;
pub mod peer;
pub mod relay;
pub mod request;
