//! The RDAP domain-age lookups' counters and their metric families.

use super::Families;

/// Counters of the RDAP lookups since start, and their queue now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RdapStats {
    /// Lookups the cache answered (a date, or that there is none to give).
    pub cache_hits: u64,
    /// Lookups the cache could not answer (each queued, joined a queued name, or refused).
    pub cache_misses: u64,
    /// Lookups of names whose TLD has no RDAP server in the bootstrap.
    pub no_server: u64,
    /// Misses not queued: the queue or the project's share of it was full.
    pub queue_full: u64,
    /// Fetches answered with a domain object (dated or not).
    pub found: u64,
    /// Fetches answered 404.
    pub not_found: u64,
    /// Times a server was left alone for a while (429, 503, timeouts, transport errors).
    pub backoffs: u64,
    /// Failed fetches by kind.
    pub errors: Vec<(&'static str, u64)>,
    /// Names waiting for a fetch.
    pub queued: u64,
    pub servers_backing_off: u64,
    pub cache_entries: u64,
    pub bootstrap_tlds: u64,
}

/// `drg_rdap_*`.
pub(super) fn families(f: &mut Families, r: &RdapStats) {
    f.counters(
        "drg_rdap_lookups_total",
        "Domain-age lookups by result: hit (the cache answered), miss (the cache could not: a fetch queued, already queued or running, or refused when the queue is full), no_server (the TLD runs no RDAP service the bootstrap names).",
        "result",
        &[
            ("hit", r.cache_hits),
            ("miss", r.cache_misses),
            ("no_server", r.no_server),
        ],
    );
    f.counter(
        "drg_rdap_queue_full_total",
        "Misses not queued because the queue or the project's share of it was full (asked again at the name's next lookup).",
        r.queue_full,
    );
    f.counters(
        "drg_rdap_fetches_total",
        "RDAP fetches by outcome: found (a domain object), not_found (404), error (see drg_rdap_errors_total).",
        "outcome",
        &[
            ("found", r.found),
            ("not_found", r.not_found),
            ("error", r.errors.iter().map(|(_, n)| n).sum()),
        ],
    );
    f.counters(
        "drg_rdap_errors_total",
        "Failed RDAP fetches by kind: rate_limited, unavailable, timeout, transport, status, too_large, redirect, invalid_answer.",
        "kind",
        &r.errors,
    );
    f.counter(
        "drg_rdap_backoffs_total",
        "Times an RDAP server was left alone for a while (429 or 503 with their Retry-After, timeouts, transport errors).",
        r.backoffs,
    );
    f.gauge(
        "drg_rdap_queued",
        "Names waiting for an RDAP fetch.",
        r.queued as f64,
    );
    f.gauge(
        "drg_rdap_servers_backing_off",
        "RDAP servers not asked now because they asked to slow down or failed.",
        r.servers_backing_off as f64,
    );
    f.gauge(
        "drg_rdap_cache_entries",
        "Domains in the RDAP cache.",
        r.cache_entries as f64,
    );
    f.gauge(
        "drg_rdap_bootstrap_tlds",
        "TLDs with an RDAP server in the bootstrap in service.",
        r.bootstrap_tlds as f64,
    );
}
