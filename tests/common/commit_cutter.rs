//! A TCP proxy on loopback between a gateway and PostgreSQL that, once armed with a marker,
//! breaks the connection of the write that carries it right after passing on its `COMMIT`: the
//! server commits, and the gateway never hears so (a network failure at the worst moment). The
//! write is the transaction whose client sent the marker (a name the test writes: it goes as
//! a bound parameter, also when the statement's text was prepared on that connection before
//! and is not sent again); the `COMMIT` itself is a simple query (`Q`, "COMMIT").
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The marker of the write to cut, until it is cut.
type Armed = Arc<Mutex<Option<Vec<u8>>>>;

pub struct CommitCutter {
    pub addr: SocketAddr,
    armed: Armed,
    cut: Arc<AtomicBool>,
}

impl CommitCutter {
    pub fn start(target: SocketAddr) -> CommitCutter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (armed, cut): (Armed, _) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        let (a, c) = (armed.clone(), cut.clone());
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (a, c) = (a.clone(), c.clone());
                let mute = Arc::new(AtomicBool::new(false));
                let m = mute.clone();
                thread::spawn(move || requests(client, server, a, c, m));
                thread::spawn(move || replies(s2, c2, mute));
            }
        });
        CommitCutter { addr, armed, cut }
    }

    /// The `COMMIT` of the write that sends `marker` is cut.
    pub fn arm(&self, marker: &str) {
        *self.armed.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// Whether a `COMMIT` was cut.
    pub fn cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

/// The client's bytes to the server, watched for a write's `COMMIT`.
fn requests(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: Armed,
    cut: Arc<AtomicBool>,
    mute: Arc<AtomicBool>,
) {
    let mut writing = false;
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let marker = armed.lock().unwrap().clone();
        if marker.is_some_and(|m| contains(chunk, &m)) {
            writing = true;
        }
        let commit = contains(chunk, b"COMMIT\0");
        let cutting = commit && writing && armed.lock().unwrap().take().is_some();
        if cutting {
            // The client hears nothing from here on, the COMMIT's answer included.
            mute.store(true, Ordering::SeqCst);
        }
        if server.write_all(chunk).is_err() {
            break;
        }
        if cutting {
            cut.store(true, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            thread::sleep(Duration::from_millis(500));
            break;
        }
        if commit {
            writing = false;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}

/// The server's bytes back to the client (until either side closes, or the client is muted).
fn replies(mut server: TcpStream, mut client: TcpStream, mute: Arc<AtomicBool>) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if mute.load(Ordering::SeqCst) || client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
