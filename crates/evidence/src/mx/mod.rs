//! MX intelligence from live DNS: [`resolver`] looks up a domain's mail set-up under a time
//! budget and caches it; [`neighbourhood`] learns which MX hosts, parents and networks serve
//! listed throwaway domains. Recognising providers and classifying are pure, in `domain`.

pub mod config;
pub mod neighbourhood;
pub mod resolver;
pub mod shares;
pub mod slow_zones;
pub mod trust;
