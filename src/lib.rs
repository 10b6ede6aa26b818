//! domain-risk-gateway: answers domain-risk lookups from a hot-reloaded in-memory table and
//! guards an email-check backend, as a standalone Pingora gateway or inside your own Pingora proxy.
//!
//! # Embedding
//!
//! A Pingora proxy mounts the domain-risk routes (`/v1/...`: lookups, batches, top-domains,
//! `/v1/check`, usage, logs, stats, keys, OpenAPI) in front of its own [`ProxyHttp`] with
//! [`DomainRisk`]: every `/v1/` request is checked (API key, origin, per-second rate, monthly
//! quota) and answered by the gateway; every other request goes through the host's callbacks
//! untouched.
//!
//! ```no_run
//! use pingora::prelude::*;
//! use pingora::server::RunArgs;
//! use domain_risk_gateway::{Config, DomainRisk};
//!
//! # struct MyProxy;
//! # #[async_trait::async_trait]
//! # impl ProxyHttp for MyProxy {
//! #     type CTX = ();
//! #     fn new_ctx(&self) {}
//! #     async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
//! #         Ok(Box::new(HttpPeer::new("127.0.0.1:3000", false, String::new())))
//! #     }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut server = Server::new(None)?;
//! server.bootstrap();
//! let config = Config::load("conf/gateway.yaml")?; // its `gateway:` section
//! let risk = DomainRisk::builder(config).build(&server.configuration)?;
//! let mut service = risk.proxy_service(&server.configuration, MyProxy);
//! service.add_tcp("0.0.0.0:8080");
//! server.add_service(service);
//! let shutdown_signal = risk.shutdown_signal();
//! let finish = risk.add_services_to(&mut server, None); // reloaders, writers, admin listener
//! server.run(RunArgs { shutdown_signal });
//! finish.finish();
//! # Ok(())
//! # }
//! ```
//!
//! `docs/embedding.md` covers what the host provides, which config keys apply, what it costs
//! and the stability promise: the items at this crate's root follow semver.
//! `examples/embed.rs` is a complete host. The gateway itself is the workspace's `drg-gateway`
//! crate (its modules are not part of this API and follow no promise).
//!
//! [`ProxyHttp`]: pingora::proxy::ProxyHttp

pub use drg_gateway::edge::middleware::{Ctx, WithDomainRisk};
pub use drg_gateway::embed::{install_logger, Builder, Config, DomainRisk, Error, Finish};
