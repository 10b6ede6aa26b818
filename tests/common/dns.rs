//! A real DNS server on loopback UDP for tests: authoritative answers from in-memory zones, a
//! count of the queries it received, a slow mode (each answer held for a while, counting how
//! many questions it holds at once), a black-hole mode that never answers, and resolvers that
//! lie in each common way (NXDOMAIN, SERVFAIL or an empty answer for every name).
//!
//! An honest server also answers what any resolver on the internet would: the gateway's
//! canary names (gmail.com, outlook.com, yahoo.com, icloud.com) have MX records, every TLD has
//! an SOA record, and reverse DNS (PTR) comes from the map a test gives. A name with a label
//! `blackhole` (`x.blackhole7.test`) is never answered: a zone whose nameservers are silent; nor
//! is the reverse query of an address whose PTR name has one. The reverse query of an address
//! whose PTR name has a label `refused` is answered REFUSED (a lame reverse delegation).
//! A name with a label `v6fail` answers its AAAA questions SERVFAIL (one address family
//! failing, as a broken IPv6 delegation does), its other questions as usual.
//! An answer for a name with a label `big` comes truncated over UDP and whole over TCP on the
//! same port, as a resolver sends an answer too big for a datagram.
//! An MX answer carries the addresses of its hosts that the server knows in its additional
//! section, as RFC 1035 (3.3.9) has servers do; [`DnsServer::set_glue`] turns that off (a
//! resolver that sends minimal answers).
//! Mail hosts exist, as on the internet: an MX host that no zone names gets an address
//! ([`MAIL_HOST_ADDRESS`]) unless a label of it starts with `ghost` or `nothere`, the names a
//! test gives hosts that do not exist.
//! [`DnsServer::start_world`] serves a whole world instead (the detection benchmark's): more
//! records per name ([`Records`]: several A, AAAA, TXT), and no address made up for any host.
//! What a server serves can change while it runs: [`DnsServer::set_zone`] adds, replaces or
//! removes a name's zone and [`DnsServer::set_records`] its records, from the next query on
//! (UDP and TCP alike): a name that lapses, or one registered again.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, MX, PTR, SOA, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// What one name holds.
#[derive(Debug, Clone, Default)]
pub struct Zone {
    pub mx: Vec<(u16, String)>,
    pub a: Option<Ipv4Addr>,
    /// Seconds; also the negative TTL (SOA minimum).
    pub ttl: u32,
}

/// Records of a name beyond its [`Zone`] (its MX and one address): more A records, AAAA and
/// TXT records, with their TTL. A name with records and no zone exists (`_dmarc.` names).
#[derive(Debug, Clone, Default)]
#[allow(dead_code)]
pub struct Records {
    pub a: Vec<Ipv4Addr>,
    pub aaaa: Vec<Ipv6Addr>,
    pub txt: Vec<String>,
    pub ttl: u32,
}

/// What a server serves: zones, reverse DNS, more records, and whether MX hosts no zone names
/// get an address (see the module documentation).
struct Served {
    zones: HashMap<String, Zone>,
    ptr: HashMap<Ipv4Addr, String>,
    records: HashMap<String, Records>,
    address_hosts: bool,
}

impl Served {
    fn zones(zones: HashMap<String, Zone>, ptr: HashMap<Ipv4Addr, String>) -> Served {
        Served {
            zones,
            ptr,
            records: HashMap::new(),
            address_hosts: true,
        }
    }
}

/// How a server lies: the same answer for every question, canaries and TLDs included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Lie {
    /// NXDOMAIN for every name (a resolver with no internet behind it, a filtering one).
    NxDomain,
    /// SERVFAIL for every name.
    ServFail,
    /// NOERROR with no records for every name.
    Empty,
    /// The canaries' MX records, and NXDOMAIN for every other name, TLDs included (a
    /// split-horizon resolver that knows a few public names).
    NxDomainButCanaries,
}

/// The canary names the gateway checks its resolver with, and the MX host each gets here.
pub const CANARIES: [(&str, &str); 4] = [
    ("gmail.com", "gmail-smtp-in.l.google.com"),
    ("outlook.com", "outlook-com.olc.protection.outlook.com"),
    ("yahoo.com", "mta5.am0.yahoodns.net"),
    ("icloud.com", "mx01.mail.icloud.com"),
];

/// The address of a mail host that an MX record names and no zone does.
pub const MAIL_HOST_ADDRESS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 254);

/// Gives an address to every MX host of `zones` that no zone names (see the module
/// documentation).
fn address_mail_hosts(zones: &mut HashMap<String, Zone>) {
    let all: Vec<Zone> = zones.values().cloned().collect();
    address_hosts_of(&all, zones);
}

/// Gives an address to every MX host of `of` that no zone of `zones` names (see the module
/// documentation).
fn address_hosts_of(of: &[Zone], zones: &mut HashMap<String, Zone>) {
    let missing: Vec<String> = of
        .iter()
        .flat_map(|z| {
            z.mx.iter()
                .map(|(_, h)| h.trim_end_matches('.').to_ascii_lowercase())
        })
        .filter(|h| {
            h.contains('.')
                && !zones.contains_key(h)
                && !h.split('.').any(|l| {
                    l.starts_with("ghost") || l.starts_with("nothere") || l.starts_with("blackhole")
                })
        })
        .collect();
    for host in missing {
        zones.insert(
            host,
            Zone {
                mx: vec![],
                a: Some(MAIL_HOST_ADDRESS),
                ttl: 300,
            },
        );
    }
}

/// What a running server answers from, shared by its UDP and TCP sides and its handle (see
/// [`DnsServer::set_zone`]): the zones, and the records beyond them.
#[derive(Default)]
struct Names {
    zones: HashMap<String, Zone>,
    records: HashMap<String, Records>,
    /// Names never answered over UDP (their nameservers silent), until `set_silent` says.
    silent: HashSet<String>,
    /// Addresses whose reverse DNS is answered REFUSED, until `set_refused` says.
    refused: HashSet<std::net::Ipv4Addr>,
}

/// A running test DNS server.
pub struct DnsServer {
    pub addr: SocketAddr,
    names: Arc<RwLock<Names>>,
    /// Whether an MX host no zone names gets an address (not in a world: `start_world`).
    address_hosts: bool,
    queries: Arc<Mutex<HashMap<(String, RecordType), usize>>>,
    held: Arc<Mutex<Held>>,
    lie: Arc<Mutex<Option<Lie>>>,
    glue: Arc<AtomicBool>,
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
        let tcp = std::net::TcpListener::bind(addr).ok();
        DnsServer::serve((UdpSocket::bind(addr).unwrap(), tcp), zones, Duration::ZERO)
    }

    /// Serves a whole world: `zones`, reverse DNS from `ptr`, the `records` beyond the zones;
    /// an MX host no zone names does not exist (NXDOMAIN), whatever its name.
    #[allow(dead_code)]
    pub fn start_world(
        zones: HashMap<String, Zone>,
        ptr: HashMap<Ipv4Addr, String>,
        records: HashMap<String, Records>,
    ) -> DnsServer {
        let served = Served {
            zones,
            ptr,
            records,
            address_hosts: false,
        };
        DnsServer::serve_all(loopback_sockets(), served, Duration::ZERO, None)
    }

    /// Like `start`, but each answer leaves `delay` after its query came in: a slow nameserver.
    pub fn start_slow(zones: HashMap<String, Zone>, delay: Duration) -> DnsServer {
        DnsServer::serve(loopback_sockets(), zones, delay)
    }

    /// Like `start`, with reverse DNS: `ptr` maps an address to the name its PTR record gives.
    #[allow(dead_code)]
    pub fn start_with_ptr(
        zones: HashMap<String, Zone>,
        ptr: HashMap<Ipv4Addr, String>,
    ) -> DnsServer {
        DnsServer::serve_all(
            loopback_sockets(),
            Served::zones(zones, ptr),
            Duration::ZERO,
            None,
        )
    }

    /// A server that tells `lie` for every question.
    #[allow(dead_code)]
    pub fn lying(lie: Lie) -> DnsServer {
        DnsServer::serve_all(
            loopback_sockets(),
            Served::zones(HashMap::new(), HashMap::new()),
            Duration::ZERO,
            Some(lie),
        )
    }

    fn serve(socket: Sockets, zones: HashMap<String, Zone>, delay: Duration) -> DnsServer {
        DnsServer::serve_all(socket, Served::zones(zones, HashMap::new()), delay, None)
    }

    fn serve_all(
        (socket, tcp): Sockets,
        served: Served,
        delay: Duration,
        lie: Option<Lie>,
    ) -> DnsServer {
        let Served {
            mut zones,
            ptr,
            records,
            address_hosts,
        } = served;
        for (canary, host) in CANARIES {
            zones.entry(canary.to_owned()).or_insert_with(|| Zone {
                mx: vec![(5, host.to_owned())],
                a: None,
                ttl: 300,
            });
        }
        if address_hosts {
            address_mail_hosts(&mut zones);
        } else {
            // The canaries' hosts exist: the resolver check asks only their MX, but a world
            // without made-up addresses still has them.
            for (_, host) in CANARIES {
                zones.entry(host.to_owned()).or_insert_with(|| Zone {
                    mx: vec![],
                    a: Some(MAIL_HOST_ADDRESS),
                    ttl: 300,
                });
            }
        }
        // A name with records and no zone exists (an empty zone of its TTL).
        for (name, r) in &records {
            zones.entry(name.clone()).or_insert_with(|| Zone {
                mx: vec![],
                a: None,
                ttl: r.ttl,
            });
        }
        let addr = socket.local_addr().unwrap();
        let names = Arc::new(RwLock::new(Names {
            zones,
            records,
            silent: HashSet::new(),
            refused: HashSet::new(),
        }));
        if let Some(listener) = tcp {
            serve_tcp(listener, names.clone());
        }
        let served = names.clone();
        let lying = Arc::new(Mutex::new(lie));
        let lies = lying.clone();
        let queries = Arc::new(Mutex::new(HashMap::new()));
        let counted = queries.clone();
        let held = Arc::new(Mutex::new(Held::default()));
        let glue = Arc::new(AtomicBool::new(true));
        let glued = glue.clone();
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
                let Some((request, query, name)) = question_of(&buf[..n]) else {
                    continue;
                };
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
                let lie = *lies.lock().unwrap();
                let canary = CANARIES.iter().any(|(c, _)| *c == name);
                if lie.is_none() && name.split('.').any(|l| l.starts_with("blackhole")) {
                    continue;
                }
                if served.read().unwrap().silent.contains(&name) {
                    continue;
                }
                let lie = lie.filter(|l| !(canary && *l == Lie::NxDomainButCanaries));
                let owner = query.name().clone();
                let reverse = (query.query_type() == RecordType::PTR)
                    .then(|| reverse_v4(&name))
                    .flatten();
                // Reverse DNS whose name has a `blackhole` label is never answered either: an
                // address owner's silent nameservers.
                if reverse
                    .and_then(|ip| ptr.get(&ip))
                    .is_some_and(|t| t.split('.').any(|l| l.starts_with("blackhole")))
                {
                    continue;
                }
                // Reverse DNS whose name has a `refused` label is answered REFUSED: a lame
                // reverse delegation, or a resolver that may not ask that zone.
                let refused = reverse
                    .and_then(|ip| ptr.get(&ip))
                    .is_some_and(|t| t.split('.').any(|l| l.starts_with("refused")))
                    || reverse.is_some_and(|ip| served.read().unwrap().refused.contains(&ip));
                let v6fail = query.query_type() == RecordType::AAAA
                    && name.split('.').any(|l| l.starts_with("v6fail"));
                // What is served now (`set_zone` may change it between two questions).
                let now = served.read().unwrap();
                let (zones, records) = (&now.zones, &now.records);
                match (lie, zones.get(&name)) {
                    (None, _) if refused => {
                        response.metadata.response_code = ResponseCode::Refused;
                    }
                    (None, _) if v6fail => {
                        response.metadata.response_code = ResponseCode::ServFail;
                    }
                    (Some(Lie::NxDomain | Lie::NxDomainButCanaries), _) => {
                        response.metadata.response_code = ResponseCode::NXDomain;
                        response.add_authority(soa(&name, 5));
                    }
                    (Some(Lie::ServFail), _) => {
                        response.metadata.response_code = ResponseCode::ServFail;
                    }
                    (Some(Lie::Empty), _) => {
                        response.add_authority(soa(&name, 5));
                    }
                    // Every TLD exists, as on the internet.
                    (None, None) if !name.is_empty() && !name.contains('.') => {
                        if query.query_type() == RecordType::SOA {
                            response.add_answer(soa(&name, 300));
                        } else {
                            response.add_authority(soa(&name, 300));
                        }
                    }
                    (None, None) if reverse.is_some() => {
                        match reverse.and_then(|ip| ptr.get(&ip)) {
                            Some(target) => {
                                let target = Name::from_str(&format!("{target}.")).unwrap();
                                response.add_answer(Record::from_rdata(
                                    owner.clone(),
                                    300,
                                    RData::PTR(PTR(target)),
                                ));
                            }
                            None => {
                                response.metadata.response_code = ResponseCode::NXDomain;
                                response.add_authority(soa(&name, 5));
                            }
                        }
                    }
                    (None, None) => {
                        response.metadata.response_code = ResponseCode::NXDomain;
                        response.add_authority(soa(&name, 5));
                    }
                    (None, Some(zone)) => {
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
                            RecordType::A => {
                                let more = records.get(&name).map_or(&[][..], |r| &r.a[..]);
                                zone.a
                                    .iter()
                                    .chain(more)
                                    .map(|ip| {
                                        Record::from_rdata(
                                            owner.clone(),
                                            zone.ttl,
                                            RData::A(A(*ip)),
                                        )
                                    })
                                    .collect()
                            }
                            RecordType::AAAA => records
                                .get(&name)
                                .map(|r| {
                                    r.aaaa
                                        .iter()
                                        .map(|ip| {
                                            Record::from_rdata(
                                                owner.clone(),
                                                r.ttl,
                                                RData::AAAA(AAAA(*ip)),
                                            )
                                        })
                                        .collect()
                                })
                                .unwrap_or_default(),
                            RecordType::TXT => records
                                .get(&name)
                                .map(|r| {
                                    r.txt
                                        .iter()
                                        .map(|t| {
                                            Record::from_rdata(
                                                owner.clone(),
                                                r.ttl,
                                                RData::TXT(TXT::new(vec![t.clone()])),
                                            )
                                        })
                                        .collect()
                                })
                                .unwrap_or_default(),
                            _ => Vec::new(),
                        };
                        if answers.is_empty() {
                            response.add_authority(soa(&name, zone.ttl));
                        }
                        if query.query_type() == RecordType::MX && glued.load(Ordering::Relaxed) {
                            for (_, host) in &zone.mx {
                                let host = host.trim_end_matches('.').to_ascii_lowercase();
                                let Some(ip) = zones.get(&host).and_then(|z| z.a) else {
                                    continue;
                                };
                                let Ok(owner) = Name::from_str(&format!("{host}.")) else {
                                    continue;
                                };
                                let ttl = zones[&host].ttl;
                                response.add_additional(Record::from_rdata(
                                    owner,
                                    ttl,
                                    RData::A(A(ip)),
                                ));
                            }
                        }
                        response.add_answers(answers);
                    }
                }
                // A name with a label `big` is too big for UDP: the answer comes truncated and
                // empty, and whole over TCP (`serve_tcp`).
                if name.split('.').any(|l| l.starts_with("big")) {
                    response.metadata.truncation = true;
                    response.answers.clear();
                    response.additionals.clear();
                }
                drop(now);
                let answer = response.to_vec().unwrap();
                // The canaries (the gateway's check of its resolver) and the TLDs are
                // answered at once: a slow server is slow for names, not taken for a dead one.
                if delay.is_zero() || !name.contains('.') || canary {
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
            names,
            address_hosts,
            queries,
            held,
            lie: lying,
            glue,
        }
    }

    /// Whether MX answers carry their hosts' addresses (on at start).
    #[allow(dead_code)]
    pub fn set_glue(&self, on: bool) {
        self.glue.store(on, Ordering::Relaxed);
    }

    /// `name` as questions carry it, and what the server answers from, to change.
    fn edit(&self, name: &str) -> (String, std::sync::RwLockWriteGuard<'_, Names>) {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        (name, self.names.write().unwrap())
    }

    /// From the next query on, `name` holds `zone` (`Some`: added, or replacing its zone) or
    /// none (`None`: NXDOMAIN from then on), over UDP and TCP. A server that makes up mail
    /// hosts' addresses (`start`, not `start_world`) gives one to the added zone's MX hosts
    /// that no zone names yet, as at start (`ghost`, `nothere`, `blackhole` hosts excepted);
    /// an address it made up stays when the zone naming the host goes. A removed zone stays
    /// removed, a mail host's or a canary's too (no address is made up for it again unless a
    /// later added zone names it).
    #[allow(dead_code)]
    pub fn set_zone(&self, name: &str, zone: Option<Zone>) {
        let (name, mut names) = self.edit(name);
        match zone {
            Some(zone) => {
                if self.address_hosts {
                    address_hosts_of(std::slice::from_ref(&zone), &mut names.zones);
                }
                names.zones.insert(name, zone);
            }
            None => {
                names.zones.remove(&name);
            }
        }
    }

    /// From the next query on, `name` has `records` beyond its zone (`Some`: a zone it has
    /// stays; a name with records and no zone exists, an empty zone of their TTL, as at start)
    /// or none (`None`: its zone, if any, stays). When both change, set the zone first (set
    /// last, it replaces the empty zone records alone give).
    #[allow(dead_code)]
    pub fn set_records(&self, name: &str, records: Option<Records>) {
        let (name, mut names) = self.edit(name);
        match records {
            Some(r) => {
                names.zones.entry(name.clone()).or_insert_with(|| Zone {
                    mx: vec![],
                    a: None,
                    ttl: r.ttl,
                });
                names.records.insert(name, r);
            }
            None => {
                names.records.remove(&name);
            }
        }
    }

    /// From the next query on, `name`'s questions get no answer over UDP (`true`: its
    /// nameservers gone silent) or are answered again (`false`).
    #[allow(dead_code)]
    pub fn set_silent(&self, name: &str, silent: bool) {
        let (name, mut names) = self.edit(name);
        match silent {
            true => names.silent.insert(name),
            false => names.silent.remove(&name),
        };
    }

    /// From the next query on, reverse DNS for `ip` is answered REFUSED (`true`) or from the
    /// world's PTR records again (`false`).
    #[allow(dead_code)]
    pub fn set_refused(&self, ip: std::net::Ipv4Addr, refused: bool) {
        let mut names = self.names.write().unwrap();
        match refused {
            true => names.refused.insert(ip),
            false => names.refused.remove(&ip),
        };
    }

    /// From now on, tells `lie` for every question (`None`: honest again).
    #[allow(dead_code)]
    pub fn set_lie(&self, lie: Option<Lie>) {
        *self.lie.lock().unwrap() = lie;
    }

    /// Slow mode: the most distinct questions held unanswered at once so far.
    pub fn most_held(&self) -> usize {
        self.held.lock().unwrap().most
    }

    /// Queries of `rtype` received so far, by name.
    #[allow(dead_code)]
    pub fn counts(&self, rtype: RecordType) -> HashMap<String, usize> {
        let queries = self.queries.lock().unwrap();
        queries
            .iter()
            .filter(|((_, t), _)| *t == rtype)
            .map(|((name, _), n)| (name.clone(), *n))
            .collect()
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

/// A request, its first question and the question's name (lower case, no trailing dot).
fn question_of(bytes: &[u8]) -> Option<(Message, Query, String)> {
    let request = Message::from_vec(bytes).ok()?;
    let query = request.queries.first().cloned()?;
    let name = query
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    Some((request, query, name))
}

/// DNS over TCP on the server's port: the MX records of the zones (as served now), for the
/// truncated answers' second try (one question per connection, as a client asks after a
/// truncated answer).
fn serve_tcp(listener: std::net::TcpListener, names: Arc<RwLock<Names>>) {
    use std::io::{Read, Write};
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut len = [0u8; 2];
            if stream.read_exact(&mut len).is_err() {
                continue;
            }
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if stream.read_exact(&mut buf).is_err() {
                continue;
            }
            let Some((request, query, name)) = question_of(&buf) else {
                continue;
            };
            let mut response = Message::response(request.metadata.id, OpCode::Query);
            response.metadata.recursion_available = true;
            response.add_query(query.clone());
            let now = names.read().unwrap();
            match now.zones.get(&name) {
                Some(zone) if query.query_type() == RecordType::MX => {
                    for (pref, host) in &zone.mx {
                        let exchange = Name::from_str(&format!("{}.", host.trim_end_matches('.')))
                            .unwrap_or_else(|_| Name::root());
                        response.add_answer(Record::from_rdata(
                            query.name().clone(),
                            zone.ttl,
                            RData::MX(MX::new(*pref, exchange)),
                        ));
                    }
                }
                Some(zone) => {
                    response.add_authority(soa(&name, zone.ttl));
                }
                None => {
                    response.metadata.response_code = ResponseCode::NXDomain;
                    response.add_authority(soa(&name, 5));
                }
            }
            drop(now);
            let answer = response.to_vec().unwrap();
            let mut out = (answer.len() as u16).to_be_bytes().to_vec();
            out.extend_from_slice(&answer);
            let _ = stream.write_all(&out);
        }
    });
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

/// The shipped `data/mx_providers.csv` (provider labels and kinds).
#[allow(dead_code)]
pub fn shipped_providers() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mx_providers.csv"
    ))
    .unwrap()
}

/// The address of a reverse name (`4.3.2.1.in-addr.arpa`).
fn reverse_v4(name: &str) -> Option<Ipv4Addr> {
    let head = name.strip_suffix(".in-addr.arpa")?;
    let mut octets: Vec<u8> = head
        .split('.')
        .map(|o| o.parse().ok())
        .collect::<Option<_>>()?;
    if octets.len() != 4 {
        return None;
    }
    octets.reverse();
    Some(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
}

/// A server's UDP socket and a TCP listener on the same loopback port.
type Sockets = (UdpSocket, Option<std::net::TcpListener>);

/// A UDP socket and a TCP listener on one port: the TCP port is taken first, then UDP on its
/// number. Binding UDP alone and TCP on its number later lost the TCP side now and then (the
/// number was some other connection's source port), and with it every answer too big for UDP.
fn loopback_sockets() -> Sockets {
    for _ in 0..100 {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()) {
            return (udp, Some(tcp));
        }
    }
    panic!("no loopback port free for both UDP and TCP in 100 tries");
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
