//! The published facts the detection world is drawn from, each with where it is published (the
//! full list, with what is an assumption, in `benches/detection/PROVENANCE.md`). Nothing here is
//! read from the model: no share, count or day number of the gateway's rules appears.

use super::rng::Rng;

/// Days in a year: a calendar fact, for drawing ages counted in years.
pub const YEAR: f64 = 365.25;

/// Median age of a throwaway domain when the community blocklist first names it, in days:
/// 331 (Baviskar, "research: how temp email providers beat blocklists with shared mx
/// infrastructure", 2026-02-28; `Per0x1de-1337/tempmail-research`, `blog.md`).
pub const LISTING_AGE_MEDIAN: f64 = 331.0;
/// The spread (standard deviation of the natural logarithm) of that age: 0.72, the spread of
/// the ten ages at listing the same study publishes (`outputs/detection_gap_feb2026.json`:
/// 190, 269, 393, 397, 407, 407, 427, 427, 427 days, and `dnsclick.com`'s 2,986 in `blog.md`).
pub const LISTING_AGE_SIGMA: f64 = 0.72;

/// Share of domains newly added to the blocklist that already sat on a known throwaway MX at
/// listing: 60 of 111 (same study, "reference MX hit rate"). An unlisted throwaway arrives
/// after its host is known with this probability, before it otherwise.
pub const AFTER_HOST_KNOWN: f64 = 60.0 / 111.0;

/// Listed domains on one MX host, as the same study's sample shows its largest clusters
/// (`smtp.yopmail.com` 43, `mail.casadorock.com` 22, the wabblywabble pair 22, Cloudflare
/// Email Routing 21): a sample of 406 of the list's 5,173 names, so the whole list's clusters
/// are larger.
pub const CLUSTER_LISTED: [u64; 4] = [43, 22, 22, 21];
/// Throwaway domains one MX host served (`tinyhost.shop`, Castle's research as cited by
/// mailcop.net, "Detecting Disposable Email Addresses: Why Blocklists Alone Aren't Enough").
pub const ONE_HOST_SERVED: u64 = 1_814;
/// Numbered MX hosts of one throwaway operator: `mx1.emaildbox.pro` to `mx5.emaildbox.pro`
/// (Short-io/otm-detector `blocklist.json`; `data/SOURCES.md` source D).
pub const NUMBERED_HOSTS: u64 = 5;
/// Of the study's three largest clusters on a throwaway service's own hosts (Cloudflare's is
/// a forwarder), one uses a pair of MX hosts (`mail.wabblywabble.com` and
/// `mail.wallywatts.com`), two one host.
pub const OPERATOR_TWO_HOSTS: f64 = 1.0 / 3.0;

/// TLDs of the names on the community blocklist (`data/community/disposable-email-domains`,
/// 8,335 names at `a6458931`): every TLD with at least 30 names (88% of the list), with its
/// count. Whether each has RDAP is read from the shipped bootstrap, as the gateway reads it.
pub const THROWAWAY_TLDS: [(&str, f64); 43] = [
    ("com", 2859.0),
    ("net", 781.0),
    ("org", 414.0),
    ("de", 219.0),
    ("top", 192.0),
    ("ru", 173.0),
    ("cc", 172.0),
    ("uk", 159.0),
    ("us", 156.0),
    ("info", 150.0),
    ("site", 128.0),
    ("store", 128.0),
    ("xyz", 126.0),
    ("cfd", 123.0),
    ("tk", 100.0),
    ("vn", 98.0),
    ("shop", 95.0),
    ("me", 94.0),
    ("nf", 77.0),
    ("online", 75.0),
    ("ml", 74.0),
    ("ga", 69.0),
    ("in", 56.0),
    ("pl", 55.0),
    ("cf", 55.0),
    ("pro", 53.0),
    ("id", 51.0),
    ("fr", 47.0),
    ("ro", 46.0),
    ("bond", 45.0),
    ("gq", 44.0),
    ("cd", 43.0),
    ("io", 42.0),
    ("biz", 41.0),
    ("click", 41.0),
    ("eu", 40.0),
    ("space", 40.0),
    ("cn", 37.0),
    ("icu", 37.0),
    ("email", 32.0),
    ("ua", 32.0),
    ("sbs", 31.0),
    ("co", 30.0),
];

/// TLDs of registered domains, in millions (Verisign, Domain Name Industry Brief, Q2 2024:
/// 362.4 in all, `.com` 157.6, `.net` 13.0, ccTLDs 140.0 with the top ten `.cn`, `.de`, `.uk`,
/// `.ru`, `.nl`, `.br`, `.au`, `.fr`, `.in`, `.eu`; the other 51.8 in the other gTLDs). How the
/// ccTLDs' 140.0 and the other gTLDs' 51.8 split among the names listed is an assumption:
/// evenly.
pub const COMPANY_TLDS: [(&str, f64); 20] = [
    ("com", 157.6),
    ("net", 13.0),
    ("cn", 14.0),
    ("de", 14.0),
    ("uk", 14.0),
    ("ru", 14.0),
    ("nl", 14.0),
    ("br", 14.0),
    ("au", 14.0),
    ("fr", 14.0),
    ("in", 14.0),
    ("eu", 14.0),
    ("org", 6.475),
    ("info", 6.475),
    ("xyz", 6.475),
    ("online", 6.475),
    ("shop", 6.475),
    ("site", 6.475),
    ("top", 6.475),
    ("store", 6.475),
];

/// Share of `.com` and `.net` names registered in the last year: 9.2 million new a quarter
/// over a base of 170.6 million (the same brief, Q2 2024).
pub const COMPANY_FIRST_YEAR: f64 = 4.0 * 9.2 / 170.6;
/// Mean years a domain past its first year has been registered beyond it: an assumption (the
/// brief gives no age distribution).
pub const COMPANY_LATER_YEARS_MEAN: f64 = 5.0;

/// Share of domains publishing SPF: 50.5% of the top ten million (Al Iverson, Spam Resource,
/// "SPF adoption rates over time", 2024-10, August 2024). The same share for every class: an
/// assumption (no share is published for throwaway domains), so the records carry no signal
/// the world invents.
pub const SPF: f64 = 0.505;
/// Share publishing DMARC: about 20% of the top ten million (same post). Same for every class.
pub const DMARC: f64 = 0.20;
/// Share of domains with a website (an address at the apex): an assumption, the same for
/// every class.
pub const WEBSITE: f64 = 0.85;
/// Share of websites also on IPv6: an assumption.
pub const WEBSITE_V6: f64 = 0.30;
/// Websites on more than one address (a load balancer, a CDN): an assumption.
pub const WEBSITE_MANY: f64 = 0.25;
/// Record TTLs in seconds and their shares: an assumption (common operator defaults).
pub const TTLS: [(u32, f64); 6] = [
    (300, 0.25),
    (600, 0.10),
    (1_800, 0.10),
    (3_600, 0.35),
    (14_400, 0.10),
    (86_400, 0.10),
];
/// A company's own mail set-up has a backup MX: an assumption.
pub const OWN_BACKUP_MX: f64 = 0.4;
/// A Google Workspace domain on the one-record set-up (`smtp.google.com`, Google's default
/// for new domains since 2023) rather than the five `aspmx` records: an assumption.
pub const GOOGLE_ONE_RECORD: f64 = 0.5;

/// Names no list decides looked up a second in the main traffic (an assumption: a busy
/// deployment, most of whose signups the table answers alone; fewer a second
/// give the registries more time between first lookups).
pub const ARRIVALS_PER_SECOND: f64 = 5.0;
/// The past (listed names and companies seen before) replays this much faster.
pub const HISTORY_PER_SECOND: f64 = 300.0;
/// Projects' shares of the signups in a several-project deployment: an assumption.
pub const PROJECT_SHARES: [f64; 4] = [0.4, 0.3, 0.2, 0.1];
/// A batch client sends what arrived every this many milliseconds, one batch per project.
pub const BATCH_EVERY_MS: u64 = 500;

/// Customers of a shared-hosting mail host: "hundreds" (an assumption, drawn 100 to 400), and
/// the share of them the deployment has seen before (an assumption).
pub const HOSTING_CUSTOMERS: (u64, u64) = (100, 400);
pub const HOSTING_SEEN: f64 = 0.1;
/// Listed throwaways on a shared-hosting mail host: "a few" (an assumption, 2 to 5).
pub const HOSTING_LISTED: (u64, u64) = (2, 5);
/// Customers of a small shared host (a local provider, an agency): an assumption.
pub const SMALL_HOST_CUSTOMERS: (u64, u64) = (5, 30);
/// A small shared host also serves one listed throwaway: an assumption.
pub const SMALL_HOST_LISTED: f64 = 0.5;
/// Other tenants' mail hosts in a VPS provider's /24 that also holds a throwaway service's
/// host: an assumption (VPS providers put unrelated tenants in one /24).
pub const VPS_TENANTS: (u64, u64) = (3, 12);
/// A tenant's reverse DNS names its own host (else the provider's generic name): an
/// assumption.
pub const TENANT_OWN_PTR: f64 = 0.5;
/// Hosts a throwaway service spreads over its own /24 (an assumption; vrfymail.com's
/// "Bulletproof hosting disposable email" counts 186 such /24 ranges).
pub const NETWORK_HOSTS: u64 = 10;

/// A throwaway domain's age at listing, in days.
pub fn listing_age(rng: &mut Rng) -> f64 {
    rng.lognormal(LISTING_AGE_MEDIAN, LISTING_AGE_SIGMA)
}

/// An unlisted throwaway's age when it is looked up, in days: a moment of its unlisted life,
/// uniformly (an assumption: it is used all along until a list names it).
pub fn unlisted_age(rng: &mut Rng) -> f64 {
    rng.unit() * listing_age(rng)
}

/// The longest an attacker holds a re-registered listed name before planting it, in days: the
/// longest hold of issue 94 ("holds planted names for 1, 30 and 90 days"), an assumption.
pub const REREGISTERED_MAX_DAYS: f64 = 90.0;

/// A planted name's age by its registry, in days: a lapsed name registered again gets a new
/// creation date (how registries record a re-registration), drawn uniformly up to
/// [`REREGISTERED_MAX_DAYS`] before the attack (an assumption). Two draws, as the listing age
/// it replaced took: the rest of a seed's world stays what it was.
pub fn reregistered_age(rng: &mut Rng) -> f64 {
    let age = rng.unit() * REREGISTERED_MAX_DAYS;
    rng.unit();
    age
}

/// A company domain's age, in days.
pub fn company_age(rng: &mut Rng) -> f64 {
    if rng.chance(COMPANY_FIRST_YEAR) {
        rng.unit() * YEAR
    } else {
        (YEAR * (1.0 + rng.exponential(COMPANY_LATER_YEARS_MEAN))).min(30.0 * YEAR)
    }
}

/// A TTL, in seconds.
pub fn ttl(rng: &mut Rng) -> u32 {
    *rng.weighted(&TTLS)
}
