//! A TCP proxy on loopback that holds every chunk `delay` before passing it on, each way: a
//! slow link between the gateway and a server of the test (Redis across a continent).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A running proxy: connect to `addr` to reach the target through the slow link.
pub struct SlowProxy {
    pub addr: SocketAddr,
}

impl SlowProxy {
    pub fn start(target: SocketAddr, delay: Duration) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || pump(client, server, delay));
                thread::spawn(move || pump(s2, c2, delay));
            }
        });
        SlowProxy { addr }
    }
}

/// Copies `from` to `to`, each chunk sent `delay` after it arrived (in order).
fn pump(mut from: TcpStream, to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut out = to;
    let sender = thread::spawn(move || {
        for (at, chunk) in rx {
            thread::sleep(at.saturating_duration_since(Instant::now()));
            if out.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = out.shutdown(Shutdown::Write);
    });
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = sender.join();
}
