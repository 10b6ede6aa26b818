//! The harness itself, under the test command's concurrency: the ports `free_port` hands out are
//! never the kernel's to hand out (a released `bind(0)` port went to another test's `bind(0)` or
//! to an outgoing connection before its server bound it), never the same twice, and gateways
//! started four at a time each serve on their own; a pair of ports (a Redis Cluster node and its
//! bus) is kept whole.

use crate::common;

use common::*;
use std::collections::HashSet;
use std::net::TcpListener;
use std::thread;

#[test]
fn free_ports_are_never_ephemeral_and_never_handed_out_twice() {
    let pickers: Vec<_> = (0..4)
        .map(|_| thread::spawn(|| (0..50).map(|_| free_port()).collect::<Vec<u16>>()))
        .collect();
    // Meanwhile the kernel hands out ports of its own, as other tests' servers and connections
    // make it do.
    let theirs: Vec<TcpListener> = (0..200)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ours: Vec<u16> = pickers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    let distinct: HashSet<u16> = ours.iter().copied().collect();
    assert_eq!(distinct.len(), ours.len(), "a port handed out twice");
    let start = ephemeral_ports_start();
    assert!(
        ours.iter().all(|p| *p < start),
        "ports from the kernel's ephemeral range (from {start}): {ours:?}"
    );
    for l in &theirs {
        assert!(!distinct.contains(&l.local_addr().unwrap().port()));
    }
    // Each is free to bind, now.
    for p in &ours {
        TcpListener::bind(("127.0.0.1", *p)).unwrap();
    }
}

#[test]
fn gateways_started_four_at_a_time_each_serve_on_their_own_port() {
    let started: Vec<_> = (0..4)
        .map(|_| {
            thread::spawn(|| {
                (0..2)
                    .map(|_| {
                        let gw = Gateway::builder().start();
                        assert_eq!(gw.get("/healthz").status, 200);
                        gw
                    })
                    .collect::<Vec<Gateway>>()
            })
        })
        .collect();
    let gateways: Vec<Gateway> = started
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let ports: HashSet<u16> = gateways.iter().map(|g| g.addr.port()).collect();
    assert_eq!(ports.len(), gateways.len());
}

#[test]
fn a_pair_of_ports_is_kept_whole_and_never_handed_out_again() {
    let pairs: Vec<u16> = (0..5).map(|_| free_port_pair(10_000)).collect();
    let singles: HashSet<u16> = (0..100).map(|_| free_port()).collect();
    let start = ephemeral_ports_start();
    for p in pairs {
        let bus = p + 10_000;
        assert!(
            bus < start,
            "{bus} is in the ephemeral range (from {start})"
        );
        assert!(!singles.contains(&p) && !singles.contains(&bus), "{p}");
        // Kept: no test, of this process or another, is given either.
        assert!(!reserve(p) && !reserve(bus), "{p} or {bus} not kept");
        // And free to bind for the server that is to use them.
        TcpListener::bind(("127.0.0.1", p)).unwrap();
        TcpListener::bind(("127.0.0.1", bus)).unwrap();
    }
}
