//! `serve` refuses to start on an address another process listens on: Pingora would retry,
//! then lose that listener's thread and keep the process serving without it.

use std::net::TcpListener;
use std::os::unix::net::UnixStream;

use crate::config::GatewayConfig;

/// A listener's address another process holds.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot listen on {address} ({key}): {why}. Another gateway on this config? \
     Give this one its own address with {flag}"
)]
pub struct AddressTaken {
    address: String,
    /// The config key the address comes from.
    key: &'static str,
    /// The `serve` flag that replaces it.
    flag: &'static str,
    why: String,
}

/// The first listener whose address is taken, if one is: the key it comes from and the flag
/// that moves it.
pub fn refuse_taken(gateway: &GatewayConfig) -> Result<(), AddressTaken> {
    let public = ("gateway.listen", "--listen", gateway.listen.as_str());
    let admin = gateway.admin.listen.as_deref();
    let admin = admin.map(|a| ("gateway.admin.listen", "--admin-listen", a));
    for (key, flag, address) in std::iter::once(public).chain(admin) {
        if let Some(why) = taken(address) {
            return Err(AddressTaken {
                address: address.to_owned(),
                key,
                flag,
                why,
            });
        }
    }
    Ok(())
}

/// Why `address` cannot be listened on, if it cannot.
fn taken(address: &str) -> Option<String> {
    match address.strip_prefix("unix:") {
        // Pingora removes a socket file before binding, so a live one would be taken over
        // silently from the gateway answering on it.
        Some(path) => UnixStream::connect(path)
            .ok()
            .map(|_| "a process answers on this socket".to_owned()),
        // Bound and released at once (with SO_REUSEADDR, as Pingora binds).
        None => TcpListener::bind(address).err().map(|e| e.to_string()),
    }
}
