//! The guard at send time: the webhook client's resolver. It resolves the receiver's host as ureq
//! would, checks every address with the [`Policy`], and hands ureq only the addresses that
//! passed, so the connection goes to one of them (ureq does not resolve again) and a name cannot
//! be re-pointed at a refused address after `check-config` (DNS rebinding).
//!
//! ureq's resolver trait is under its `unversioned` module (it may change in a minor release):
//! Cargo.lock pins the version, and a change shows as a build error here.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;

use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

use crate::guard::{Policy, Refused};

/// Whether `ip` is one of this host's addresses: binding a socket to it succeeds only then (no
/// packet is sent). Asked only for an address on a port of a listener bound to every address.
pub fn this_host_has(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Every address a receiver's host resolved to was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no address of '{host}' may receive webhooks: {}", list(.refused))]
pub struct Unreachable {
    pub host: String,
    pub refused: Vec<Refused>,
}

fn list(refused: &[Refused]) -> String {
    let texts: Vec<String> = refused.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

/// The resolver of the webhook client's ureq agent (see the module documentation).
#[derive(Debug)]
pub struct GuardedResolver {
    pub policy: Arc<Policy>,
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = DefaultResolver::default().resolve(uri, config, timeout)?;
        let mut passed = self.empty();
        let mut refused = Vec::new();
        for addr in resolved.iter() {
            match self.policy.check(*addr, &this_host_has) {
                Ok(()) => passed.push(*addr),
                Err(e) => refused.push(e),
            }
        }
        if passed.is_empty() {
            let host = uri.host().unwrap_or_default().to_owned();
            let why = Unreachable { host, refused };
            // Told apart from other I/O errors by its type (`deliver::post`).
            return Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                why,
            )));
        }
        Ok(passed)
    }
}
