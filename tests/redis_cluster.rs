//! The shared quota on scaled-out Redis: a real 3-master Redis Cluster (keys of different projects
//! on different masters, exact counting across two gateways, exact and batched), and a master with
//! a replica behind Sentinel (a failover under load: every call served, no counted call lost).

use crate::common;
use crate::redis_server;

use common::*;
use redis_server::{RedisCluster, RedisSentinel};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const LOOKUP: &str = "/v1/public/domain/example.org";

/// Project ids whose hash tags fall in the three slot ranges `redis-cli --cluster create` gives
/// three masters (slots 8579, 12706 and 449): one project per master.
const PROJECTS: [&str; 3] = ["k0", "k1", "k2"];

fn secret(project: &str) -> String {
    format!("drg_{project}_{}", "d".repeat(40))
}

fn month_key(project: &str) -> String {
    format!("q:{{{project}}}:{}", chrono::Utc::now().format("%Y-%m"))
}

/// The `nodes:` list of the `redis:` block, as YAML lines (no commas: the builder splits on them).
fn yaml_list(key: &str, indent: usize, urls: &[String]) -> String {
    let items: String = urls
        .iter()
        .map(|u| format!("\n{}- {u}", " ".repeat(indent)))
        .collect();
    format!("{key}:{items}")
}

fn cluster_gateway(cluster: &RedisCluster, limit: u64, extra: &str) -> Gateway {
    let mut b = Gateway::builder().plan("shared", limit);
    for p in PROJECTS {
        b = b.key(p, &secret(p), "shared", &[]);
    }
    let nodes = yaml_list("nodes", 8, &cluster.seeds());
    b.redis_with(
        &cluster.masters[0].url(),
        "fail_open",
        &format!("mode: cluster, {nodes}, {extra}"),
    )
    .start()
}

/// Each project's calls from 16 clients over both gateways at once.
fn hammer_all(addrs: &[SocketAddr], per_client: usize) -> Vec<BTreeMap<u16, usize>> {
    let runs: Vec<_> = PROJECTS
        .iter()
        .map(|p| {
            let (addrs, secret) = (addrs.to_vec(), secret(p));
            thread::spawn(move || hammer(&addrs, &secret, LOOKUP, 16, per_client))
        })
        .collect();
    runs.into_iter().map(|r| r.join().unwrap()).collect()
}

#[test]
fn two_gateways_count_exactly_on_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let gws = [
        cluster_gateway(&cluster, 200, ""),
        cluster_gateway(&cluster, 200, ""),
    ];
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    for counts in hammer_all(&addrs, 16) {
        assert_eq!(counts, [(200, 200), (429, 256 - 200)].into());
    }
    // Each project's count and markers live on its own master: the script's keys share a slot.
    let mut masters: Vec<u16> = PROJECTS
        .iter()
        .map(|p| {
            assert_eq!(cluster.int_get(&month_key(p)), Some(200), "{p}");
            cluster.master_of(&month_key(p)).port
        })
        .collect();
    masters.sort();
    masters.dedup();
    assert_eq!(masters.len(), 3, "the projects' counts are on {masters:?}");
    for gw in &gws {
        for p in PROJECTS {
            let u = gw
                .conn_as(Some(&secret(p)))
                .get("/v1/usage")
                .unwrap()
                .json();
            assert_eq!(u["used"], 200, "{p}");
        }
        let q = gw.admin_get("/readyz").json()["quota"].clone();
        assert_eq!(q["connected"], true, "{q}");
        assert_eq!(q["pending_local_counts"], 0, "{q}");
    }
    // The call logs and daily stats live on the cluster too (each project's keys on its own
    // master): both gateways' answered calls add up, whichever gateway is asked.
    for p in PROJECTS {
        let today = |gw: &Gateway| {
            let r = gw.conn_as(Some(&secret(p))).get("/v1/stats").unwrap();
            assert_eq!(r.status, 200, "{p}: {}", String::from_utf8_lossy(&r.body));
            let chart = r.json()["chart"].as_array().unwrap().clone();
            chart.last().unwrap()["total_requests"].as_u64().unwrap()
        };
        wait_until(Duration::from_secs(10), || today(&gws[0]) == 200);
        assert_eq!(today(&gws[1]), 200, "{p}");
        let logs = gws[1]
            .conn_as(Some(&secret(p)))
            .get("/v1/logs?limit=100")
            .unwrap()
            .json();
        assert_eq!(logs["items"].as_array().unwrap().len(), 100, "{p}: {logs}");
        assert_eq!(logs["items"][0]["email_domain"], "example.org", "{p}");
    }
}

#[test]
fn batched_counting_on_the_cluster_never_overshoots_and_settles_exactly() {
    let cluster = RedisCluster::start();
    let extra = "sync_interval_ms: 50, batch_max: 10";
    let gws = [
        cluster_gateway(&cluster, 300, extra),
        cluster_gateway(&cluster, 300, extra),
    ];
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    for (p, counts) in PROJECTS.iter().zip(hammer_all(&addrs, 32)) {
        let ok = counts.get(&200).copied().unwrap_or(0);
        assert_eq!(
            ok + counts.get(&429).copied().unwrap_or(0),
            512,
            "{counts:?}"
        );
        // Never over the limit; unused leases may refuse up to gateways x 1.5 x batch_max early
        // (the hammer's calls past the limit use them up here).
        assert!((280..=300).contains(&ok), "{p}: {ok} successes");
        // Once unused leases are given back, the cluster holds exactly the admitted calls.
        wait_until(Duration::from_secs(5), || {
            cluster.int_get(&month_key(p)) == Some(ok as i64)
        });
    }
}

#[test]
fn a_gateway_starts_while_the_cluster_is_down_and_adds_its_counts_when_it_is_back() {
    let mut cluster = RedisCluster::start();
    for m in &mut cluster.masters {
        m.kill();
    }
    let gw = cluster_gateway(&cluster, 1_000, "");
    let s = secret(PROJECTS[0]);
    for _ in 0..3 {
        assert_eq!(gw.conn_as(Some(&s)).get(LOOKUP).unwrap().status, 200);
    }
    let q = gw.admin_get("/readyz").json()["quota"].clone();
    assert_eq!(q["connected"], false, "{q}");
    assert_eq!(q["pending_local_counts"], 3, "{q}");
    // The nodes come back with their cluster config (nodes.conf in their data folders).
    for m in &mut cluster.masters {
        m.restart();
    }
    cluster.wait_ok();
    wait_until(Duration::from_secs(20), || {
        gw.admin_get("/readyz").json()["quota"]["pending_local_counts"] == 0
    });
    assert_eq!(cluster.int_get(&month_key(PROJECTS[0])), Some(3));
    assert_eq!(gw.conn_as(Some(&s)).get(LOOKUP).unwrap().status, 200);
    assert_eq!(cluster.int_get(&month_key(PROJECTS[0])), Some(4));
}

/// What the load clients saw.
#[derive(Debug, Default)]
struct Seen {
    statuses: BTreeMap<u16, usize>,
    failed: usize,
}

#[test]
fn a_sentinel_failover_under_load_serves_every_call_and_loses_no_count() {
    let deployment = RedisSentinel::start(1);
    let project = "k0";
    let secret = secret(project);
    let first_master = deployment.master_port();
    let sentinels = yaml_list("nodes", 10, &deployment.sentinel_urls());
    let gateway = || {
        Gateway::builder()
            .plan("big", 1_000_000)
            .key(project, &secret, "big", &[])
            .redis_with(
                &deployment.servers[0].url(),
                "fail_open",
                &format!(
                    "mode: sentinel, sentinel:\n        master_name: {}\n        {sentinels}",
                    deployment.name
                ),
            )
            .start()
    };
    let gws = [gateway(), gateway()];
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (addr, secret, stop) = (gws[i % 2].addr, secret.clone(), stop.clone());
            thread::spawn(move || {
                let mut seen = Seen::default();
                let mut conn = Conn::open_as(addr, Some(&secret)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match conn.get(LOOKUP) {
                        Ok(r) => *seen.statuses.entry(r.status).or_default() += 1,
                        Err(_) => {
                            seen.failed += 1;
                            conn = Conn::open_as(addr, Some(&secret)).unwrap();
                        }
                    }
                }
                seen
            })
        })
        .collect();
    let count = |port: u16| {
        let server = deployment.servers.iter().find(|s| s.port == port).unwrap();
        server.int(&["GET", &month_key(project)]).unwrap_or(0)
    };
    wait_until(Duration::from_secs(20), || count(first_master) >= 200);
    deployment.failover();
    let new_master = deployment.master_port();
    assert_ne!(new_master, first_master);
    // Both gateways follow the sentinels to the new master while the load goes on, and count
    // there (the old master keeps taking writes for seconds, until Sentinel demotes it).
    let followed = format!("the sentinels name 127.0.0.1:{new_master} as master");
    wait_until(Duration::from_secs(30), || {
        gws.iter().all(|g| g.log().contains(&followed))
    });
    let at_switch = count(new_master);
    wait_until(Duration::from_secs(60), || {
        count(new_master) >= at_switch + 200
    });
    stop.store(true, Ordering::Relaxed);
    let mut seen = Seen::default();
    for c in clients {
        let s = c.join().unwrap();
        seen.failed += s.failed;
        for (status, n) in s.statuses {
            *seen.statuses.entry(status).or_default() += n;
        }
    }
    // Serving never stopped: fail_open answers every call, far below the limit, with 200.
    assert_eq!(seen.failed, 0, "{seen:?}");
    assert_eq!(
        seen.statuses.keys().copied().collect::<Vec<_>>(),
        [200],
        "{seen:?}"
    );
    let served = seen.statuses[&200] as i64;
    // The policy loses no count: what did not reach the replica in time (counts the old master
    // took after the switch among them) is settled on the new master by its ids, once the new
    // master has a replica again (Sentinel makes the old master its replica).
    let settled = || {
        gws.iter()
            .all(|g| g.admin_get("/readyz").json()["quota"]["pending_local_counts"] == 0)
            && count(deployment.master_port()) == served
    };
    // Polled rather than `wait_until`, so that a lost count fails with the numbers and logs.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !settled() && std::time::Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        count(deployment.master_port()),
        served,
        "{seen:?}; gateway logs:\n{}\n{}",
        gws[0].log(),
        gws[1].log()
    );
}
