//! A real DNS server on loopback UDP for tests: authoritative answers from in-memory zones, a
//! count of the queries it received, a slow mode (each answer held for a while, counting how
//! many questions it holds at once) and a black-hole mode that never answers.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::str::FromStr;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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
    held: Arc<Mutex<Held>>,
}

/// Questions received and not answered yet (slow mode). A DNS client resends an unanswered
/// UDP query: a resend is the same question, not one more, and the first answer settles it.
#[derive(Default)]
struct Held {
    questions: HashSet<(String, RecordType)>,
    most: usize,
}

impl DnsServer {
    /// Serves `zones`; any other name is NXDOMAIN.
    pub fn start(zones: HashMap<String, Zone>) -> DnsServer {
        DnsServer::start_slow(zones, Duration::ZERO)
    }

    /// Like `start`, on `addr` (a port a test kept for a server that comes up late).
    #[allow(dead_code)]
    pub fn start_at(zones: HashMap<String, Zone>, addr: SocketAddr) -> DnsServer {
        DnsServer::serve(UdpSocket::bind(addr).unwrap(), zones, Duration::ZERO)
    }

    /// Like `start`, but each answer leaves `delay` after its query came in: a slow nameserver.
    pub fn start_slow(zones: HashMap<String, Zone>, delay: Duration) -> DnsServer {
        DnsServer::serve(UdpSocket::bind("127.0.0.1:0").unwrap(), zones, delay)
    }

    fn serve(socket: UdpSocket, zones: HashMap<String, Zone>, delay: Duration) -> DnsServer {
        let addr = socket.local_addr().unwrap();
        let queries = Arc::new(Mutex::new(HashMap::new()));
        let counted = queries.clone();
        let held = Arc::new(Mutex::new(Held::default()));
        // Answers wait in arrival order, so one thread sending each at its time keeps them all.
        type Due = (Instant, Vec<u8>, SocketAddr, (String, RecordType));
        let (later, due) = mpsc::channel::<Due>();
        let sender = socket.try_clone().unwrap();
        let holding = held.clone();
        thread::spawn(move || {
            for (at, answer, peer, question) in due {
                thread::sleep(at.saturating_duration_since(Instant::now()));
                let _ = sender.send_to(&answer, peer);
                holding.lock().unwrap().questions.remove(&question);
            }
        });
        let holding = held.clone();
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
                let answer = response.to_vec().unwrap();
                // The root's NS is the gateway's DNS probe: answered at once, so a slow
                // server is slow for names, not taken for a dead one.
                if delay.is_zero() || name.is_empty() {
                    let _ = socket.send_to(&answer, peer);
                } else {
                    let question = (name.clone(), query.query_type());
                    let mut held = holding.lock().unwrap();
                    held.questions.insert(question.clone());
                    held.most = held.most.max(held.questions.len());
                    drop(held);
                    let _ = later.send((Instant::now() + delay, answer, peer, question));
                }
            }
        });
        DnsServer {
            addr,
            queries,
            held,
        }
    }

    /// Slow mode: the most distinct questions held unanswered at once so far.
    pub fn most_held(&self) -> usize {
        self.held.lock().unwrap().most
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
