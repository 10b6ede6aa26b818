//! A DNS server on loopback for the load harness's `mix` scenario (`benches/load/run --only
//! mix`): the tests' own server (`tests/common/dns.rs`), its zones read from a file, every answer
//! sent `--delay-ms` after its query came in (a real resolver's latency), and the MX queries it
//! received (and the totals of each type) written as JSON every second, so the harness can tell how many queries the gateway
//! sent per distinct name.
//!
//! ```text
//! cargo build --release --example dns_loopback
//! target/release/examples/dns_loopback --zones zones.txt --delay-ms 20 --counts counts.json
//! ```
//! Zones: one `name ttl mx-host` line per domain. Prints `listening <ip:port>` when it serves.

#[allow(dead_code)]
#[path = "../tests/common/dns.rs"]
mod dns;

use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use hickory_proto::rr::RecordType;

#[derive(Parser)]
struct Args {
    /// `name ttl mx-host` lines.
    #[arg(long)]
    zones: std::path::PathBuf,
    /// Each answer leaves this long after its query.
    #[arg(long, default_value_t = 20)]
    delay_ms: u64,
    /// Written every second: `{"mx_queries": {name: count}}`.
    #[arg(long)]
    counts: std::path::PathBuf,
    /// MX answers without their hosts' addresses in the additional section (a resolver that
    /// sends minimal answers: the gateway asks the addresses in a second round trip).
    #[arg(long)]
    no_glue: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut zones = HashMap::new();
    for line in std::fs::read_to_string(&args.zones)?.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(ttl), Some(host)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        zones.insert(
            name.to_owned(),
            dns::Zone {
                mx: vec![(10, host.to_owned())],
                a: None,
                ttl: ttl.parse()?,
            },
        );
    }
    let server = dns::DnsServer::start_slow(zones, Duration::from_millis(args.delay_ms));
    server.set_glue(!args.no_glue);
    println!("listening {}", server.addr);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let total = |t| server.counts(t).values().sum::<usize>();
        let counts = serde_json::json!({
            "mx_queries": server.counts(RecordType::MX),
            "totals": {
                "MX": total(RecordType::MX), "A": total(RecordType::A),
                "AAAA": total(RecordType::AAAA), "PTR": total(RecordType::PTR),
            },
        });
        let tmp = args.counts.with_extension("tmp");
        std::fs::write(&tmp, counts.to_string())?;
        std::fs::rename(&tmp, &args.counts)?;
    }
}
