//! Domain age from RDAP (RFC 9082/9083): when the registrable domain of a looked-up name was
//! registered, asked of the registry the IANA bootstrap names for its TLD (RFC 9224), in the
//! background, cached for days. The young-domain rule itself is pure, in `domain`.

pub mod answer;
pub mod bootstrap;
pub mod cache;
pub mod config;
pub mod fetch;
pub mod queue;
pub mod service;
