//! A host proxy that embeds the domain-risk routes: a Pingora proxy with its own upstream and
//! its own routes, which mounts the gateway under `/v1/` and keeps serving everything else.
//!
//! ```sh
//! cargo run --example embed -- -c conf/gateway.yaml --listen 127.0.0.1:8088 --upstream 127.0.0.1:3000
//! ```
//!
//! - `GET /host/health` is the host's own local answer;
//! - `/v1/...` is the gateway's: API key, origin, rate and monthly quota, the domain table
//!   (hot-reloaded), `/v1/check` to `gateway.upstream`, the admin listener's `/metrics`;
//! - every other request goes, as received, to `--upstream` (the host's backend).
//!
//! The one config file holds Pingora's server keys (read by `Server::new`) and the `gateway:`
//! section (read by `Config::load`). docs/embedding.md walks through it.

use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use clap::Parser;
use domain_risk_gateway::{Config, DomainRisk};
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::server::configuration::Opt;
use pingora::server::RunArgs;

#[derive(Parser)]
#[command(about = "A Pingora host proxy with the domain-risk routes mounted under /v1/")]
struct Args {
    /// Pingora's server keys and the `gateway:` section, in one file.
    #[arg(short, long)]
    conf: PathBuf,
    /// Where the host listens.
    #[arg(long)]
    listen: String,
    /// The host's own backend, for every path that is not the gateway's.
    #[arg(long)]
    upstream: String,
}

/// The host's own proxy: one local route, everything else to its backend.
struct Host {
    upstream: String,
}

#[async_trait]
impl ProxyHttp for Host {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if session.req_header().uri.path() != "/host/health" {
            return Ok(false);
        }
        let body = Bytes::from_static(b"host ok\n");
        let mut header = ResponseHeader::build(200, Some(2))?;
        header.insert_header("Content-Type", "text/plain")?;
        header.insert_header("Content-Length", body.len().to_string())?;
        session
            .write_response_header(Box::new(header), false)
            .await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.upstream.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG`, email addresses masked in every line (a host may keep a logger of its own).
    domain_risk_gateway::install_logger()?;
    let args = Args::parse();
    // Pingora reads its own keys from the file and leaves `gateway:` alone.
    let opt = Opt {
        conf: Some(args.conf.to_string_lossy().into_owned()),
        ..Opt::default()
    };
    let mut server = Server::new(Some(opt))?;
    server.bootstrap();

    // The gateway's section of the same file; a bad table, keys file or state file stops here.
    let risk = DomainRisk::builder(Config::load(&args.conf)?).build(&server.configuration)?;
    let host = Host {
        upstream: args.upstream,
    };
    let mut service = risk.proxy_service(&server.configuration, host);
    service.add_tcp(&args.listen);
    server.add_service(service);

    let shutdown_signal = risk.shutdown_signal();
    let finish = risk.add_services_to(&mut server, None);
    log::info!("host listening on {}", args.listen);
    server.run(RunArgs { shutdown_signal });
    finish.finish();
    Ok(())
}
