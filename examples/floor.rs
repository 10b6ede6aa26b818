//! The bare Pingora floor for the load harness (`benches/load/run`): what the same Pingora, with
//! the gateway's server options and allocator, does with no gateway logic at all.
//!
//! ```sh
//! cargo build --release --example floor
//! target/release/examples/floor -c gateway.yaml \
//!     --answer 127.0.0.1:7001=200:lookup.json --answer 127.0.0.1:7002=401:unauth.json \
//!     --proxy 127.0.0.1:7003
//! ```
//!
//! `--answer ADDR=STATUS:FILE` listens on ADDR and answers every request with STATUS and the
//! file's bytes from `request_filter` (`Content-Type` and `Content-Length`, nothing else).
//! `--proxy ADDR` listens on ADDR and proxies every request, as received, to the config's
//! `gateway.upstream` (keep-alive pool `upstream_keepalive_pool_size`). The server part of the
//! config (threads, work stealing, pool size, ...) and the per-connection request limit are the
//! gateway's own, read from the same file, so only the gateway's work differs.

use std::path::PathBuf;
use std::process::ExitCode;

use async_trait::async_trait;
use bytes::Bytes;
use clap::Parser;
use drg_gateway::config::Settings;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use pingora::apps::HttpServerOptions;
use pingora::http::ResponseHeader;
use pingora::prelude::{Error, ErrorType, HttpPeer, ProxyHttp, Result, Session};
use pingora::proxy::{http_proxy, HttpProxy};
use pingora::server::Server;
use pingora::services::listening::Service;

/// The gateway's allocator: the floor must not differ from it by malloc.
#[global_allocator]
static GLOBAL: drg_base::infra::alloc::Allocator = drg_base::infra::alloc::Allocator;

#[derive(Parser)]
#[command(about = "Bare Pingora floor for the load harness")]
struct Args {
    /// The gateway config whose server options (and upstream) the floor uses.
    #[arg(short, long)]
    conf: PathBuf,
    /// ADDR=STATUS:FILE: answer every request on ADDR with STATUS and the file's bytes.
    #[arg(long)]
    answer: Vec<String>,
    /// ADDR: proxy every request on ADDR to the config's upstream.
    #[arg(long)]
    proxy: Vec<String>,
}

/// A fixed answer written from `request_filter`, the way the gateway writes its own.
struct Answer {
    status: u16,
    body: Bytes,
}

#[async_trait]
impl ProxyHttp for Answer {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        Error::e_explain(ErrorType::InternalError, "the answer floor has no upstream")
    }

    async fn request_filter(&self, session: &mut Session, _: &mut ()) -> Result<bool> {
        let mut header = ResponseHeader::build_no_case(self.status, Some(2))?;
        header.insert_header(CONTENT_TYPE, "application/json")?;
        header.insert_header(CONTENT_LENGTH, self.body.len())?;
        session
            .write_response_header(Box::new(header), false)
            .await?;
        session
            .write_response_body(Some(self.body.clone()), true)
            .await?;
        Ok(true)
    }
}

/// Every request, untouched, to one upstream peer.
struct Relay {
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Relay {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

fn parse_answer(spec: &str) -> std::result::Result<(String, Answer), String> {
    let bad = || format!("--answer {spec}: expected ADDR=STATUS:FILE");
    let (addr, rest) = spec.split_once('=').ok_or_else(bad)?;
    let (status, file) = rest.split_once(':').ok_or_else(bad)?;
    let status = status.parse().map_err(|_| bad())?;
    let body = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    Ok((
        addr.to_owned(),
        Answer {
            status,
            body: body.into(),
        },
    ))
}

fn service<SV>(
    server: &Server,
    name: &str,
    addr: &str,
    inner: SV,
    limit: u32,
) -> Service<HttpProxy<SV>>
where
    SV: ProxyHttp + Send + Sync + 'static,
    SV::CTX: Send + Sync,
{
    let mut proxy = http_proxy(&server.configuration, inner);
    let mut options = HttpServerOptions::default();
    // The gateway's setting: Pingora counts reuses after the first request.
    options.keepalive_request_limit = Some(limit - 1);
    proxy.server_options = Some(options);
    let mut service = Service::new(format!("floor {name} {addr}"), proxy);
    service.add_tcp(addr);
    service
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut settings = match Settings::load(&args.conf) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Beside a gateway on the same config: its own pid file and upgrade socket.
    let own = |suffix: &str| format!("{}.floor.{suffix}", args.conf.display());
    settings.server.pid_file = own("pid");
    settings.server.upgrade_sock = own("sock");
    let limit = settings.gateway.limits.max_requests_per_connection;
    let mut server = Server::new_with_opt_and_conf(None, settings.server);
    server.bootstrap();
    for spec in &args.answer {
        let (addr, answer) = match parse_answer(spec) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        server.add_service(service(&server, "answer", &addr, answer, limit));
    }
    for addr in &args.proxy {
        let relay = Relay {
            peer: drg_gateway::upstream::peer::http_peer(&settings.gateway.upstream),
        };
        server.add_service(service(&server, "proxy", addr, relay, limit));
    }
    server.run_forever()
}
