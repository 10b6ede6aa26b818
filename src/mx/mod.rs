//! MX intelligence from live DNS: [`resolver`] looks up a domain's mail set-up under a time
//! budget and caches it; recognising providers and classifying are pure, in `domain`.

pub mod config;
pub mod resolver;
