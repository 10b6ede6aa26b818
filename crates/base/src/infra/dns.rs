//! A lean DNS client for the few questions the gateway asks its resolvers (MX, A, AAAA, PTR,
//! SOA): one message a question over a few long-lived UDP sockets per server, answers matched
//! by id, question and source, TCP when an answer comes truncated.
//!
//! A general resolver opens a socket for every question, follows referrals and keeps a cache of
//! records; the gateway keeps its own cache of what the records mean and asks recursive
//! resolvers only, so each question here costs one send and one receive. Every socket is bound
//! to a port the system picks at random and connected to its server (the kernel drops
//! datagrams from any other source); a socket is replaced by a fresh one after
//! [`QUERIES_PER_SOCKET`] questions, and every question carries a random id, so an answer
//! forged from off the path must guess both.
//!
//! A thread that runs a single-threaded runtime (a Pingora worker, a background service) asks
//! over sockets of its own, read by a task on that thread: an answer then wakes only the thread
//! that waits for it. Shared sockets were read on the thread that made them (the MX service's,
//! which asks first), which woke for every answer a worker waited on and woke the worker in
//! turn, both on the workers' core.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_resolver::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use thread_local::ThreadLocal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::oneshot;

use super::deadlines;

/// Sockets kept open per server.
const SOCKETS_PER_SERVER: usize = 4;
/// Questions a socket carries before a fresh one (a new random port) takes its place.
pub const QUERIES_PER_SOCKET: usize = 1024;
/// The largest UDP answer asked for (EDNS): the size DNS flag day 2020 settled on.
const UDP_PAYLOAD: u16 = 1232;
/// How often an idle receiver looks whether its socket was retired with nothing pending.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Why a question got no records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The name does not exist (NXDOMAIN); the SOA's negative TTL, seconds.
    #[error("no such name")]
    NxDomain { negative_ttl: u32 },
    /// The name exists with no record of the type asked (NODATA); the negative TTL.
    #[error("no record of that type")]
    NoData { negative_ttl: u32 },
    /// A server answered, with nothing usable: another response code (SERVFAIL, REFUSED...),
    /// a message that does not parse or does not answer the question, a CNAME chain it did
    /// not finish.
    #[error("the server's answer was no answer: {0}")]
    Failed(String),
    /// No server answered in time (or the question could not be sent).
    #[error("no answer: {0}")]
    NoAnswer(String),
}

impl QueryError {
    pub fn is_nx_domain(&self) -> bool {
        matches!(self, QueryError::NxDomain { .. })
    }

    /// NXDOMAIN or NODATA: the server says there is nothing.
    pub fn is_negative(&self) -> bool {
        matches!(
            self,
            QueryError::NxDomain { .. } | QueryError::NoData { .. }
        )
    }

    /// The negative answer's TTL (zero for anything else).
    pub fn negative_ttl(&self) -> Duration {
        match self {
            QueryError::NxDomain { negative_ttl } | QueryError::NoData { negative_ttl } => {
                Duration::from_secs(u64::from(*negative_ttl))
            }
            _ => Duration::ZERO,
        }
    }

    /// A server answered (whatever it said).
    pub fn answered(&self) -> bool {
        !matches!(self, QueryError::NoAnswer(_))
    }
}

/// The records that answer a question (those of the type asked, for the name or the end of
/// its CNAME chain), the answer's additional section, and how long they hold.
#[derive(Debug)]
pub struct Answer {
    records: Vec<Record>,
    additionals: Vec<Record>,
    valid_until: Instant,
}

impl Answer {
    pub fn answers(&self) -> &[Record] {
        &self.records
    }

    pub fn additionals(&self) -> &[Record] {
        &self.additionals
    }

    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
}

/// One UDP socket to one server, with the questions waiting on it.
struct Channel {
    socket: UdpSocket,
    pending: Mutex<HashMap<u16, oneshot::Sender<Vec<u8>>>>,
    retired: std::sync::atomic::AtomicBool,
}

/// Sockets in turn: (socket, questions it carried).
type Channels = Vec<(Arc<Channel>, usize)>;

struct Server {
    addr: SocketAddr,
    /// The sockets of threads that run no single-threaded runtime (a work-stealing one).
    shared: Mutex<Channels>,
    /// Each single-threaded runtime's thread's own sockets.
    own: ThreadLocal<RefCell<OwnChannels>>,
    next: AtomicUsize,
}

/// A thread's own sockets, with the thread they belong to: `ThreadLocal` hands a finished
/// thread's slot to a new thread, whose runtime never read those sockets.
struct OwnChannels {
    thread: ThreadId,
    channels: Channels,
}

/// Whether the calling thread runs a single-threaded runtime, whose tasks (a socket's reader
/// among them) never leave it.
fn single_threaded_here() -> bool {
    Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
}

/// The client: its servers (asked in turn, the next one when a server fails to answer) and
/// the time one server has to answer.
pub struct DnsClient {
    servers: Vec<Server>,
    timeout: Duration,
    next: AtomicUsize,
}

impl DnsClient {
    pub fn new(servers: Vec<SocketAddr>, timeout: Duration) -> DnsClient {
        DnsClient {
            servers: servers
                .into_iter()
                .map(|addr| Server {
                    addr,
                    shared: Mutex::new(Vec::new()),
                    own: ThreadLocal::new(),
                    next: AtomicUsize::new(0),
                })
                .collect(),
            timeout,
            next: AtomicUsize::new(0),
        }
    }

    pub fn has_servers(&self) -> bool {
        !self.servers.is_empty()
    }

    /// The records of `rtype` for `name` (a fully qualified name, trailing dot or not). A
    /// server that does not answer, or answers SERVFAIL or the like, leaves the question to
    /// the next; NXDOMAIN and NODATA are answers.
    pub async fn query(&self, name: &str, rtype: RecordType) -> Result<Answer, QueryError> {
        let qname = Name::from_ascii(name).map_err(|e| QueryError::NoAnswer(e.to_string()))?;
        let n = self.servers.len();
        if n == 0 {
            return Err(QueryError::NoAnswer("no DNS server".into()));
        }
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = QueryError::NoAnswer("not asked".into());
        for k in 0..n {
            let server = &self.servers[(first + k) % n];
            match self.ask(server, &qname, rtype).await {
                Ok(answer) => return Ok(answer),
                Err(e) if e.is_negative() => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The PTR names of `ip`.
    pub async fn reverse(&self, ip: IpAddr) -> Result<Answer, QueryError> {
        self.query(&Name::from(ip).to_ascii(), RecordType::PTR)
            .await
    }

    async fn ask(
        &self,
        server: &Server,
        qname: &Name,
        rtype: RecordType,
    ) -> Result<Answer, QueryError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let channel = server
            .channel()
            .await
            .map_err(|e| QueryError::NoAnswer(format!("{}: {e}", server.addr)))?;
        let (id, rx) = channel.register();
        let _pending = Pending(&channel, id);
        let question = question(id, qname, rtype)?;
        if let Err(e) = channel.socket.send(&question).await {
            // A socket that cannot send (its runtime gone, the route lost) is replaced before
            // the next question rather than failing a question in four for a thousand.
            server.retire(&channel);
            return Err(QueryError::NoAnswer(format!("{}: {e}", server.addr)));
        }
        // A datagram lost on the way is sent again once, half-way through the time allowed.
        let mut rx = rx;
        let halfway = tokio::time::Instant::now() + self.timeout / 2;
        let first = deadlines::timeout_at(halfway, &mut rx).await;
        let answered = match first {
            Ok(answer) => Ok(answer),
            Err(_) => {
                let _ = channel.socket.send(&question).await;
                deadlines::timeout_at(deadline, rx).await
            }
        };
        let Ok(Ok(bytes)) = answered else {
            return Err(QueryError::NoAnswer(format!("{}: timed out", server.addr)));
        };
        let mut response = parse(&bytes, id, qname, rtype)?;
        if response.metadata.truncation {
            let bytes = deadlines::timeout_at(deadline, over_tcp(server.addr, &question))
                .await
                .map_err(|_| QueryError::NoAnswer(format!("{}: TCP timed out", server.addr)))?
                .map_err(|e| QueryError::NoAnswer(format!("{}: TCP: {e}", server.addr)))?;
            response = parse(&bytes, id, qname, rtype)?;
        }
        classify(response, qname, rtype)
    }
}

/// Takes a question out of its channel's waiting list however its wait ends.
struct Pending<'c>(&'c Arc<Channel>, u16);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

impl Channel {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u16, oneshot::Sender<Vec<u8>>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A random id no question on this socket waits with, and the receiver of its answer.
    fn register(&self) -> (u16, oneshot::Receiver<Vec<u8>>) {
        let (tx, rx) = oneshot::channel();
        let mut pending = self.lock();
        let id = loop {
            let id = rand::random::<u16>();
            if !pending.contains_key(&id) {
                break id;
            }
        };
        pending.insert(id, tx);
        (id, rx)
    }

    /// Hands each datagram to the question waiting with its id, until the socket is retired
    /// and nothing waits on it any more.
    async fn receive(self: Arc<Self>) {
        let mut buf = vec![0u8; 65_535];
        // One timer for the socket's life, set again only when it passes: a timer set per
        // datagram would be the deadlines' earliest, and wake their thread, at every answer.
        let mut check = std::pin::pin!(deadlines::sleep(IDLE_CHECK));
        loop {
            tokio::select! {
                received = self.socket.recv(&mut buf) => match received {
                    Ok(n) if n >= 2 => {
                        let id = u16::from_be_bytes([buf[0], buf[1]]);
                        if let Some(tx) = self.lock().remove(&id) {
                            let _ = tx.send(buf[..n].to_vec());
                        }
                    }
                    // A refused datagram (ICMP) or a runt: the question times out.
                    _ => {}
                },
                () = check.as_mut() => {
                    check.as_mut().reset(tokio::time::Instant::now() + IDLE_CHECK);
                }
            }
            if self.retired.load(Ordering::Relaxed) && self.lock().is_empty() {
                return;
            }
        }
    }
}

impl Server {
    /// The calling thread's sockets: its own on a single-threaded runtime, else the shared
    /// ones.
    fn with_channels<R>(&self, f: impl FnOnce(&mut Channels) -> R) -> R {
        if !single_threaded_here() {
            return f(&mut self.shared.lock().unwrap_or_else(|p| p.into_inner()));
        }
        let here = std::thread::current().id();
        let cell = self.own.get_or(|| {
            RefCell::new(OwnChannels {
                thread: here,
                channels: Vec::new(),
            })
        });
        let mut own = cell.borrow_mut();
        if own.thread != here {
            // A finished thread's sockets: their reader ended with its runtime.
            retire_all(&own.channels);
            own.channels.clear();
            own.thread = here;
        }
        f(&mut own.channels)
    }

    /// Marks `channel` used up: the next question on its slot gets a fresh socket.
    fn retire(&self, channel: &Arc<Channel>) {
        self.with_channels(|channels| {
            for (c, used) in channels.iter_mut() {
                if Arc::ptr_eq(c, channel) {
                    *used = QUERIES_PER_SOCKET;
                }
            }
        });
    }

    /// The next socket in turn (made when missing, replaced when it carried its share).
    async fn channel(&self) -> std::io::Result<Arc<Channel>> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % SOCKETS_PER_SERVER;
        let ready = self.with_channels(|channels| match channels.get_mut(slot) {
            Some((channel, used)) if *used < QUERIES_PER_SOCKET => {
                *used += 1;
                Some(channel.clone())
            }
            _ => None,
        });
        if let Some(channel) = ready {
            return Ok(channel);
        }
        let bind: SocketAddr = if self.addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind).await?;
        socket.connect(self.addr).await?;
        let channel = Arc::new(Channel {
            socket,
            pending: Mutex::new(HashMap::new()),
            retired: std::sync::atomic::AtomicBool::new(false),
        });
        // Read on this runtime: on a single-threaded one, this thread.
        tokio::spawn(channel.clone().receive());
        self.with_channels(|channels| {
            if slot < channels.len() {
                let (old, _) = std::mem::replace(&mut channels[slot], (channel.clone(), 1));
                old.retired.store(true, Ordering::Relaxed);
            } else {
                channels.push((channel.clone(), 1));
            }
        });
        Ok(channel)
    }
}

impl Drop for Server {
    /// Lets every socket's reader end (once nothing waits on it), wherever it runs: a reader
    /// holds its socket, and would otherwise keep it open for the process's life.
    fn drop(&mut self) {
        retire_all(self.shared.get_mut().unwrap_or_else(|p| p.into_inner()));
        for own in self.own.iter_mut() {
            retire_all(&own.get_mut().channels);
        }
    }
}

fn retire_all(channels: &Channels) {
    for (c, _) in channels {
        c.retired.store(true, Ordering::Relaxed);
    }
}

/// The wire form of one recursive question (EDNS, 1232 bytes).
fn question(id: u16, qname: &Name, rtype: RecordType) -> Result<Vec<u8>, QueryError> {
    let mut message = Message::query();
    message.metadata.id = id;
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(qname.clone(), rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(UDP_PAYLOAD);
    message.set_edns(edns);
    message
        .to_vec()
        .map_err(|e| QueryError::NoAnswer(e.to_string()))
}

/// The response to question `id`, or why it is none.
fn parse(bytes: &[u8], id: u16, qname: &Name, rtype: RecordType) -> Result<Message, QueryError> {
    let message = Message::from_vec(bytes).map_err(|e| QueryError::Failed(e.to_string()))?;
    // Names compare without regard to case.
    let asked = message.queries.len() == 1
        && message.queries[0].name() == qname
        && message.queries[0].query_type() == rtype
        && message.queries[0].query_class() == DNSClass::IN;
    if message.metadata.id != id
        || message.metadata.message_type != MessageType::Response
        || message.metadata.op_code != OpCode::Query
        || !asked
    {
        return Err(QueryError::Failed("an answer to another question".into()));
    }
    Ok(message)
}

/// What a response says of the question: its records, or the negative answer, or nothing.
fn classify(mut message: Message, qname: &Name, rtype: RecordType) -> Result<Answer, QueryError> {
    let negative_ttl = || {
        message
            .authorities
            .iter()
            .find_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
            .unwrap_or(0)
    };
    match message.metadata.response_code {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => {
            return Err(QueryError::NxDomain {
                negative_ttl: negative_ttl(),
            })
        }
        code => return Err(QueryError::Failed(code.to_string())),
    }
    // The name, then each CNAME target in the answer.
    let mut names = vec![qname.clone()];
    let mut ttl = u32::MAX;
    while let Some((target, t)) = message.answers.iter().find_map(|r| match &r.data {
        RData::CNAME(c) if rtype != RecordType::CNAME && names.last() == Some(&r.name) => {
            Some((c.0.clone(), r.ttl))
        }
        _ => None,
    }) {
        if names.contains(&target) || names.len() > 8 {
            return Err(QueryError::Failed("a CNAME loop".into()));
        }
        ttl = ttl.min(t);
        names.push(target);
    }
    let records: Vec<Record> = std::mem::take(&mut message.answers)
        .into_iter()
        .filter(|r| r.record_type() == rtype && names.contains(&r.name))
        .collect();
    if records.is_empty() {
        if names.len() > 1 {
            // The resolver stopped half-way down a chain: that is not "no record".
            return Err(QueryError::Failed("an unfinished CNAME chain".into()));
        }
        return Err(QueryError::NoData {
            negative_ttl: negative_ttl(),
        });
    }
    let ttl = records.iter().map(|r| r.ttl).fold(ttl, u32::min);
    Ok(Answer {
        records,
        additionals: std::mem::take(&mut message.additionals),
        valid_until: Instant::now() + Duration::from_secs(u64::from(ttl)),
    })
}

/// Asks `question` over TCP (a truncated UDP answer): a connection for the one question.
async fn over_tcp(server: SocketAddr, question: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    let len = u16::try_from(question.len()).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(question.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(question);
    stream.write_all(&out).await?;
    let len = stream.read_u16().await?;
    let mut answer = vec![0u8; usize::from(len)];
    stream.read_exact(&mut answer).await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::rr::rdata::{A, CNAME, SOA};
    use std::net::Ipv4Addr;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn response(id: u16, q: &str, rtype: RecordType) -> Message {
        let mut m = Message::response(id, OpCode::Query);
        m.add_query(Query::query(name(q), rtype));
        m
    }

    fn a(owner: &str, ip: [u8; 4], ttl: u32) -> Record {
        Record::from_rdata(name(owner), ttl, RData::A(A(Ipv4Addr::from(ip))))
    }

    fn soa(zone: &str, ttl: u32, minimum: u32) -> Record {
        let soa = SOA::new(name("ns.x."), name("h.x."), 1, 60, 60, 60, minimum);
        Record::from_rdata(name(zone), ttl, RData::SOA(soa))
    }

    #[test]
    fn an_answer_to_another_question_is_refused() {
        let q = name("Mail.Example.com.");
        let ok = response(7, "mail.example.COM.", RecordType::A)
            .to_vec()
            .unwrap();
        assert!(
            parse(&ok, 7, &q, RecordType::A).is_ok(),
            "names compare without case"
        );
        let wrong_id = response(8, "mail.example.com.", RecordType::A)
            .to_vec()
            .unwrap();
        let wrong_type = response(7, "mail.example.com.", RecordType::AAAA)
            .to_vec()
            .unwrap();
        let wrong_name = response(7, "evil.example.com.", RecordType::A)
            .to_vec()
            .unwrap();
        let mut not_a_response = response(7, "mail.example.com.", RecordType::A);
        not_a_response.metadata.message_type = MessageType::Query;
        for bytes in [
            wrong_id,
            wrong_type,
            wrong_name,
            not_a_response.to_vec().unwrap(),
        ] {
            assert!(matches!(
                parse(&bytes, 7, &q, RecordType::A),
                Err(QueryError::Failed(_))
            ));
        }
        assert!(matches!(
            parse(b"\x00\x07junk", 7, &q, RecordType::A),
            Err(QueryError::Failed(_))
        ));
    }

    #[test]
    fn records_negatives_and_failures_are_told_apart() {
        let q = name("mail.example.com.");
        // Records of the type asked, for the name or the end of its CNAME chain; others dropped.
        let mut m = response(1, "mail.example.com.", RecordType::A);
        m.add_answer(Record::from_rdata(
            name("mail.example.com."),
            30,
            RData::CNAME(CNAME(name("mx.host.net."))),
        ));
        m.add_answer(a("mx.host.net.", [192, 0, 2, 1], 300));
        m.add_answer(a("unrelated.example.org.", [127, 0, 0, 1], 300));
        m.add_additional(a("other.example.com.", [192, 0, 2, 9], 300));
        let answer = classify(m, &q, RecordType::A).unwrap();
        assert_eq!(answer.answers().len(), 1);
        assert_eq!(answer.answers()[0].name, name("mx.host.net."));
        assert_eq!(answer.additionals().len(), 1);
        // The chain's shortest TTL.
        let left = answer.valid_until() - Instant::now();
        assert!(
            left <= Duration::from_secs(30) && left > Duration::from_secs(25),
            "{left:?}"
        );

        // NXDOMAIN and NODATA, with the SOA's negative TTL (the smaller of its TTL and minimum).
        let mut m = response(1, "mail.example.com.", RecordType::A);
        m.metadata.response_code = ResponseCode::NXDomain;
        m.add_authority(soa("example.com.", 600, 120));
        assert_eq!(
            classify(m, &q, RecordType::A).unwrap_err(),
            QueryError::NxDomain { negative_ttl: 120 }
        );
        let mut m = response(1, "mail.example.com.", RecordType::A);
        m.add_authority(soa("example.com.", 60, 900));
        let e = classify(m, &q, RecordType::A).unwrap_err();
        assert_eq!(e, QueryError::NoData { negative_ttl: 60 });
        assert!(e.is_negative() && e.answered() && !e.is_nx_domain());
        assert_eq!(e.negative_ttl(), Duration::from_secs(60));

        // A chain the resolver did not finish is no "no record"; SERVFAIL is no answer either.
        let mut m = response(1, "mail.example.com.", RecordType::A);
        m.add_answer(Record::from_rdata(
            name("mail.example.com."),
            30,
            RData::CNAME(CNAME(name("mx.host.net."))),
        ));
        let e = classify(m, &q, RecordType::A).unwrap_err();
        assert!(
            matches!(e, QueryError::Failed(_)) && !e.is_negative(),
            "{e:?}"
        );
        let mut m = response(1, "mail.example.com.", RecordType::A);
        m.metadata.response_code = ResponseCode::ServFail;
        let e = classify(m, &q, RecordType::A).unwrap_err();
        assert!(matches!(e, QueryError::Failed(_)) && e.answered() && !e.is_negative());
        assert!(!QueryError::NoAnswer("timed out".into()).answered());
    }

    /// A DNS server on loopback answering every question with one A record.
    fn answering_server() -> SocketAddr {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let asked = q.queries[0].name().to_ascii();
                let mut m = response(q.metadata.id, &asked, RecordType::A);
                m.add_answer(a(&asked, [192, 0, 2, 1], 60));
                let _ = socket.send_to(&m.to_vec().unwrap(), from);
            }
        });
        addr
    }

    /// On a single-threaded runtime of its own, asks `client` once and returns the local
    /// addresses of the sockets this thread asks over.
    fn ask_on_own_runtime(client: &DnsClient) -> Vec<SocketAddr> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let answer = client.query("a.example.", RecordType::A).await.unwrap();
            assert_eq!(answer.answers().len(), 1);
            client.servers[0].with_channels(|channels| {
                channels
                    .iter()
                    .map(|(c, _)| c.socket.local_addr().unwrap())
                    .collect()
            })
        })
    }

    #[test]
    fn each_single_threaded_runtime_asks_over_sockets_of_its_own() {
        let client = Arc::new(DnsClient::new(
            vec![answering_server()],
            Duration::from_secs(2),
        ));
        let on_thread = |c: &Arc<DnsClient>| {
            let c = c.clone();
            std::thread::spawn(move || ask_on_own_runtime(&c))
        };
        let (one, two) = (on_thread(&client), on_thread(&client));
        let (one, two) = (one.join().unwrap(), two.join().unwrap());
        assert_eq!((one.len(), two.len()), (1, 1), "{one:?} {two:?}");
        assert_ne!(one, two, "two threads, one socket");
        assert!(client.servers[0].shared.lock().unwrap().is_empty());
        // Threads that start after those ended may be given their slots: the finished
        // threads' sockets, whose reader ended with their runtime, are not asked over.
        for _ in 0..3 {
            let again = on_thread(&client).join().unwrap();
            assert_eq!(again.len(), 1);
            assert!(!one.contains(&again[0]) && !two.contains(&again[0]));
        }
    }

    #[test]
    fn a_work_stealing_runtime_shares_its_sockets_and_a_dropped_client_closes_them() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let client = Arc::new(DnsClient::new(
            vec![answering_server()],
            Duration::from_secs(2),
        ));
        for _ in 0..SOCKETS_PER_SERVER {
            // Asked from a worker of the work-stealing runtime.
            let c = client.clone();
            let asked = rt.spawn(async move {
                c.query("b.example.", RecordType::A)
                    .await
                    .map(|a| a.answers().len())
            });
            assert_eq!(rt.block_on(asked).unwrap(), Ok(1));
        }
        let sockets: Vec<std::sync::Weak<Channel>> = client.servers[0]
            .shared
            .lock()
            .unwrap()
            .iter()
            .map(|(c, _)| Arc::downgrade(c))
            .collect();
        assert_eq!(sockets.len(), SOCKETS_PER_SERVER);
        drop(Arc::into_inner(client).expect("the only handle left"));
        // Each reader sees its socket retired within its idle check, and lets it go.
        let deadline = Instant::now() + IDLE_CHECK * 3;
        while sockets.iter().any(|w| w.strong_count() > 0) {
            assert!(Instant::now() < deadline, "a socket outlived its client");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_question_asks_for_recursion_with_edns() {
        let bytes = question(0x1234, &name("example.com."), RecordType::MX).unwrap();
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert!(m.metadata.recursion_desired);
        assert_eq!(m.queries[0].query_type(), RecordType::MX);
        assert_eq!(m.max_payload(), UDP_PAYLOAD);
    }
}
