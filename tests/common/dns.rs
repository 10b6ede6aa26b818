//! A real DNS server on loopback UDP for tests: authoritative answers from in-memory zones, a
//! count of the queries it received, and a black-hole mode that never answers.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, MX, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// What one name holds.
#[derive(Debug, Clone, Default)]
pub struct Zone {
    pub mx: Vec<(u16, String)>,
    pub a: Option<Ipv4Addr>,
    /// Seconds; also the negative TTL (SOA minimum).
    pub ttl: u32,
}

/// A running test DNS server.
pub struct DnsServer {
    pub addr: SocketAddr,
    queries: Arc<Mutex<HashMap<(String, RecordType), usize>>>,
}

impl DnsServer {
    /// Serves `zones`; any other name is NXDOMAIN.
    pub fn start(zones: HashMap<String, Zone>) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let queries = Arc::new(Mutex::new(HashMap::new()));
        let counted = queries.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else {
                    return;
                };
                let Ok(request) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(query) = request.queries.first().cloned() else {
                    continue;
                };
                let name = query
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                *counted
                    .lock()
                    .unwrap()
                    .entry((name.clone(), query.query_type()))
                    .or_insert(0) += 1;
                let mut response = Message::response(request.metadata.id, OpCode::Query);
                response.metadata.authoritative = true;
                response.metadata.recursion_desired = request.metadata.recursion_desired;
                response.metadata.recursion_available = true;
                response.add_query(query.clone());
                let owner = query.name().clone();
                match zones.get(&name) {
                    None => {
                        response.metadata.response_code = ResponseCode::NXDomain;
                        response.add_authority(soa(&name, 5));
                    }
                    Some(zone) => {
                        let answers: Vec<Record> = match query.query_type() {
                            RecordType::MX => zone
                                .mx
                                .iter()
                                .map(|(pref, host)| {
                                    let exchange =
                                        Name::from_str(&format!("{}.", host.trim_end_matches('.')))
                                            .unwrap_or_else(|_| Name::root());
                                    Record::from_rdata(
                                        owner.clone(),
                                        zone.ttl,
                                        RData::MX(MX::new(*pref, exchange)),
                                    )
                                })
                                .collect(),
                            RecordType::A => zone
                                .a
                                .iter()
                                .map(|ip| {
                                    Record::from_rdata(owner.clone(), zone.ttl, RData::A(A(*ip)))
                                })
                                .collect(),
                            _ => Vec::new(),
                        };
                        if answers.is_empty() {
                            response.add_authority(soa(&name, zone.ttl));
                        }
                        response.add_answers(answers);
                    }
                }
                let _ = socket.send_to(&response.to_vec().unwrap(), peer);
            }
        });
        DnsServer { addr, queries }
    }

    /// How many queries of this type the server received for `name`.
    pub fn count(&self, name: &str, rtype: RecordType) -> usize {
        *self
            .queries
            .lock()
            .unwrap()
            .get(&(name.to_owned(), rtype))
            .unwrap_or(&0)
    }
}

fn soa(zone: &str, minimum: u32) -> Record {
    let name = Name::from_str(&format!("{zone}.")).unwrap();
    let rdata = SOA::new(
        Name::from_str("ns.test.").unwrap(),
        Name::from_str("hostmaster.test.").unwrap(),
        1,
        3600,
        600,
        86400,
        minimum,
    );
    Record::from_rdata(name, minimum, RData::SOA(rdata))
}

/// A UDP socket that reads queries and never answers.
pub fn black_hole() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while socket.recv_from(&mut buf).is_ok() {
            thread::sleep(Duration::from_millis(1));
        }
    });
    addr
}
