//! The carried-calls files: owned by a lock, adopted once whatever the crash; calls named
//! before they leave, a lease's unused part never served; earlier releases' files handed over.

use std::collections::HashMap;

use super::*;
use crate::quota::SystemClock;
use drg_base::infra::redis::config::RedisConfig;

fn store(folder: &Path) -> RedisStore {
    RedisStore::new(&RedisConfig::default(), Arc::new(SystemClock::default()))
        .unwrap()
        .with_carried_folder(folder.to_path_buf())
}

fn month() -> Month {
    Month::parse_label("2026-11").unwrap()
}

/// Calls counted locally for `key`, and the count read.
fn count(store: &RedisStore, key: &str, calls: u64, seen: u64) {
    let slot = store.slots.get(key, month());
    let mut tally = slot.tally();
    tally.restore(Carried {
        calls,
        seen,
        epoch: 7,
        ..Carried::default()
    });
}

/// The sync's own save of `store`'s file.
fn save(store: &RedisStore) {
    store.save_carried(
        &store.slots.all(),
        Save::Sync {
            shutting_down: false,
        },
    );
}

fn owed(store: &RedisStore, key: &str) -> (u64, u64) {
    let slot = store.slots.get(key, month());
    let carried = slot.tally().carried();
    (carried.calls, carried.seen)
}

fn files(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn names_tell_this_releases_files_from_earlier_ones() {
    assert_eq!(
        kind_of("quota.carried.0a1b2c3d4e5f6789.json"),
        Some(Kind::Locked)
    );
    assert_eq!(kind_of("quota.carried..json"), None);
    assert_eq!(kind_of("quota.carried.0a1b.json.bad"), None);
    assert_eq!(kind_of(".quota.carried.0a1b.json.x1.tmp"), None);
    for legacy in [
        "quota.redis-carried.4242.json",
        "quota.redis-carried.4242-0a1b2c3d.json",
        "quota.redis-carried.4242-0a1b2c3d.json.claimed.77",
    ] {
        assert_eq!(kind_of(legacy), Some(Kind::Legacy), "{legacy}");
    }
    assert_eq!(kind_of("quota.redis-carried.json"), None);
    assert_eq!(kind_of("quota.counters"), None);
}

#[test]
fn a_live_gateways_file_is_never_adopted_whatever_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let a = store(dir.path());
    let b = store(dir.path());
    count(&a, "k", 5, 40);
    save(&a);
    assert_eq!(files(dir.path()).len(), 1);
    // Same process, same pid: only the lock tells that A lives. B leaves it, at every sync.
    for _ in 0..3 {
        assert_eq!(b.adopt_carried(), 0);
    }
    assert_eq!(owed(&b, "k"), (0, 0));
    // A rewrites its file (a new version, locked before it is in place): still A's.
    count(&a, "k", 1, 0);
    save(&a);
    assert_eq!(b.adopt_carried(), 0);
    // A is gone: B takes its calls and its reading, once, and the file goes.
    drop(a);
    assert_eq!(b.adopt_carried(), 1);
    assert_eq!(owed(&b, "k"), (6, 40));
    assert_eq!(b.adopt_carried(), 0);
    assert_eq!(owed(&b, "k"), (6, 40));
    assert_eq!(files(dir.path()).len(), 1, "only B's own file");
}

/// Writes `store`'s file now and returns its name and content (what a crash right after the
/// write leaves), then ends the store.
fn crash_after_write(store: RedisStore) -> (PathBuf, Vec<u8>) {
    let path = store.carried.as_ref().unwrap().path.clone();
    let body = std::fs::read(&path).unwrap();
    drop(store);
    (path, body)
}

#[test]
fn an_adoption_cut_short_by_a_crash_is_not_taken_twice() {
    let dir = tempfile::tempdir().unwrap();
    // T counted 3 calls and died.
    let t = store(dir.path());
    count(&t, "k", 3, 10);
    save(&t);
    let t_file = crash_after_write(t);
    // X (2 calls of its own) adopts T's, writes its file naming T, and dies before T's file
    // is removed.
    let x = store(dir.path());
    count(&x, "k", 2, 0);
    assert_eq!(x.adopt_carried(), 1);
    let x_file = crash_after_write(x);
    std::fs::write(&t_file.0, &t_file.1).unwrap();
    // Z adopts both (T's calls only through X's file), and dies the same way.
    let z = store(dir.path());
    count(&z, "k", 1, 0);
    assert_eq!(z.adopt_carried(), 2);
    assert_eq!(owed(&z, "k"), (6, 10));
    let z_file = crash_after_write(z);
    for (path, body) in [&t_file, &x_file, &z_file] {
        std::fs::write(path, body).unwrap();
    }
    assert_eq!(files(dir.path()).len(), 3);
    // Y finds all three: every call once.
    let y = store(dir.path());
    assert_eq!(y.adopt_carried(), 3);
    assert_eq!(owed(&y, "k"), (6, 10));
    assert_eq!(files(dir.path()).len(), 1, "only Y's own file");
}

/// Releases before the lock named files by pid, and this one took a file whose pid was its own
/// (a container restarted as pid 1) or gone: in containers every gateway is pid 1, and a live
/// old gateway beside it in a rolling upgrade had its file taken and counted twice. None is
/// taken now, whatever its pid; the operator hands one over by renaming it.
#[test]
fn an_earlier_releases_file_is_handed_over_never_taken_by_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let list = |calls: u64| format!(r#"[{{"key":"k","month":"2026-11","calls":{calls}}}]"#);
    let own_pid = format!("quota.redis-carried.{me}-0a1b2c3d.json");
    for (name, calls) in [
        (own_pid.clone(), 5),
        ("quota.redis-carried.4194302.json".to_owned(), 7),
        (format!("quota.redis-carried.1-0a1b.json.claimed.{me}"), 11),
    ] {
        std::fs::write(dir.path().join(name), list(calls)).unwrap();
    }
    let s = store(dir.path());
    for _ in 0..2 {
        assert_eq!(s.adopt_carried(), 0);
    }
    assert_eq!(owed(&s, "k"), (0, 0));
    assert_eq!(files(dir.path()).len(), 3);
    // Handed over: renamed to this release's name, a file nobody holds.
    std::fs::rename(
        dir.path().join(&own_pid),
        dir.path().join("quota.carried.0a1b2c3d.json"),
    )
    .unwrap();
    assert_eq!(s.adopt_carried(), 1);
    assert_eq!(owed(&s, "k"), (5, 0));
    assert_eq!(files(dir.path()).len(), 3, "two left, and this one's own");
}

#[test]
fn a_file_that_does_not_parse_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("quota.carried.0a1b.json"),
        r#"[{"key":"k","month":"2026-11","calls":5,"unsure":[[7,2,0]]}]"#,
    )
    .unwrap();
    std::fs::write(dir.path().join("quota.carried.0badf00d.json"), "{not json").unwrap();
    let s = store(dir.path());
    assert_eq!(s.adopt_carried(), 2);
    let slot = s.slots.get("k", month());
    let carried = slot.tally().carried();
    assert_eq!((carried.calls, carried.unsure.len()), (5, 1));
    let names = files(dir.path());
    assert!(names.contains(&"quota.carried.0badf00d.json.bad".to_owned()));
    assert_eq!(names.len(), 2, "{names:?}");
}

/// One month's count as the script keeps it: the count, and the marker of each id (what a call
/// that ran added, or `=`: settled as a batch).
#[derive(Default)]
struct Redis {
    count: i64,
    markers: HashMap<u64, Option<i64>>,
}

impl Redis {
    /// Runs `carry` as the script does (a sync's call, or one counting `want` calls granted in
    /// full); whether it left a marker.
    fn run(&mut self, carry: &Carry) -> bool {
        for batch in &carry.unsure {
            self.count += match self.markers.insert(batch.id, None) {
                None => batch.delta(),
                Some(Some(ran)) => batch.delta() - ran,
                Some(None) => 0,
            };
        }
        let mine = carry.delta() + i64::try_from(carry.want).unwrap();
        let marked = mine != 0 && !self.markers.contains_key(&carry.id);
        if marked {
            self.markers.insert(carry.id, Some(mine));
            self.count += mine;
        }
        for id in &carry.applied {
            self.markers.remove(id);
        }
        marked
    }

    /// The next sync of `store`: its rounds, each named in its file first, run and answered.
    fn sync(&mut self, store: &RedisStore) {
        let slots = store.slots.all();
        while let Some(mut round) = store.named_round(&slots) {
            while let Some((slot, carry)) = round.0.pop() {
                let marked = self.run(&carry);
                slot.tally().settled(&carry, 0, marked, 1);
            }
        }
        save(store);
    }
}

/// The instants of a sync's call to Redis a process may die at.
#[derive(Debug, Clone, Copy)]
enum Death {
    /// The calls left the pending set; the file is not written yet.
    Taken,
    /// The file names the call; it is not sent.
    Named,
    /// Redis applied the call; its reply is not in.
    Applied,
    /// The reply is in; the file still names the call.
    Answered,
    /// A later file no longer names the call.
    Saved,
    /// Redis forgot the call's id (a later call told it to).
    Forgotten,
}

/// Gateway A counted 100 calls while Redis was away and kept them in its file; its sync carries
/// them to Redis and A dies at `death`; B adopts A's file and syncs.
fn counted_after_death_at(death: Death) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Redis::default();
    let a = store(dir.path());
    count(&a, "k", 100, 0);
    save(&a);
    let slot = a.slots.get("k", month());
    if let Death::Taken = death {
        // Taken into a call, as the sync does before it writes the file.
        slot.tally().carry(a.next_id());
    } else {
        let mut round = a.named_round(&a.slots.all()).unwrap();
        let (slot, carry) = round.0.pop().unwrap();
        if !matches!(death, Death::Named) {
            let marked = redis.run(&carry);
            if !matches!(death, Death::Applied) {
                slot.tally().settled(&carry, 100, marked, 1);
            }
        }
        // Dead: nothing more is written, nothing put back.
    }
    if matches!(death, Death::Saved | Death::Forgotten) {
        save(&a);
    }
    if let Death::Forgotten = death {
        let call = slot.tally().call(a.next_id(), 1);
        assert!(!call.applied.is_empty(), "told to forget");
        redis.run(&call);
        redis.count -= 1;
    }
    drop((slot, a));
    let b = store(dir.path());
    // A process another test forks holds A's lock until it execs: the gateway adopts at its
    // next sync, so the test tries again as it would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while b.adopt_carried() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    redis.sync(&b);
    redis.sync(&b);
    redis.count
}

/// A sync's call took calls counted here under a new id while the file still named them as
/// calls never sent (the file was written at the next sync): a `kill -9` in between left them to
/// the next gateway, which sent them again (100 calls read 201 in an outside review). The call
/// is now named in the file before it leaves: whatever instant A dies at, 100.
#[test]
fn calls_carried_to_redis_are_counted_once_whatever_instant_the_process_dies_at() {
    for death in [
        Death::Taken,
        Death::Named,
        Death::Applied,
        Death::Answered,
        Death::Saved,
        Death::Forgotten,
    ] {
        assert_eq!(counted_after_death_at(death), 100, "died at {death:?}");
    }
}

#[test]
fn a_round_the_file_could_not_name_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("gone"));
    count(&s, "k", 3, 0);
    // The folder cannot be made: a file, where it should be.
    std::fs::write(dir.path().join("gone"), "").unwrap();
    assert!(s.named_round(&s.slots.all()).is_none());
    assert_eq!(owed(&s, "k"), (3, 0), "back in the slot, to send later");
}

/// A lease of 50 in Redis (a call took the first).
fn leased(store: &RedisStore, redis: &mut Redis) -> Arc<Slot> {
    let slot = store.slots.get("k", month());
    redis.count += 50;
    slot.tally().lease.grant(49, Instant::now());
    slot
}

/// Calls served from the lease (of `tries`).
fn serve(slot: &Slot, tries: u64) -> u64 {
    (0..tries)
        .filter(|_| slot.tally().lease.take().is_some())
        .count() as u64
}

/// The file named a lease's unused part as of the last save, and a kill gave all of it back:
/// the calls served from the lease after the save were given back too (counted nowhere). The
/// file now names only a part no call may take: whenever the process dies, a kill gives back
/// no served call.
#[test]
fn a_kill_gives_back_no_call_served_from_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Redis::default();
    let a = store(dir.path());
    let slot = leased(&a, &mut redis);
    let mut served = 1 + serve(&slot, 4);
    // Busy since the last save: nothing of it named; idle since the next: its 45 named.
    save(&a);
    save(&a);
    assert_eq!(a.slots.get("k", month()).tally().carried().returned, 45);
    // Calls after that save: none served from the named part (they ask for a new lease).
    served += serve(&slot, 10);
    assert_eq!(served, 5);
    drop((slot, a));
    let b = store(dir.path());
    // A process another test forks holds A's lock until it execs: the gateway adopts at its
    // next sync, so the test tries again as it would.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while b.adopt_carried() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    redis.sync(&b);
    assert_eq!(redis.count, served as i64);
}

/// A round's save comes a moment before the sync's own: a lease that served no call in
/// between is not idle, and keeps serving.
#[test]
fn only_the_syncs_own_save_keeps_an_idle_lease() {
    let dir = tempfile::tempdir().unwrap();
    let a = store(dir.path());
    let slot = leased(&a, &mut Redis::default());
    assert_eq!(serve(&slot, 1), 1);
    save(&a);
    count(&a, "other", 1, 0);
    drop(a.named_round(&a.slots.all()).unwrap());
    assert_eq!(serve(&slot, 1), 1);
    assert_eq!(slot.tally().carried().returned, 0);
    // A whole sync without a call: kept.
    save(&a);
    save(&a);
    assert_eq!(serve(&slot, 1), 0);
    assert_eq!(slot.tally().carried().returned, 47);
}

/// A kept lease that gets a new grant serves from it; the next save names none of the lease,
/// and only once that file is written does the kept part serve again. A kill at either point
/// gives back no served call (a busy lease's unused part stays counted: high, never low).
#[test]
fn a_kept_part_serves_again_only_once_the_file_no_longer_names_it() {
    for die_before_the_write in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut redis = Redis::default();
        let a = store(dir.path());
        let slot = leased(&a, &mut redis);
        save(&a);
        save(&a);
        // A new lease of 50 beside the kept 49.
        redis.count += 50;
        slot.tally().lease.grant(50, Instant::now());
        let mut served = 1 + serve(&slot, 60);
        assert_eq!(served, 51, "the new lease only");
        if !die_before_the_write {
            save(&a);
            served += serve(&slot, 10);
            assert_eq!(served, 61, "the kept part serves again");
        }
        drop((slot, a));
        let b = store(dir.path());
        b.adopt_carried();
        redis.sync(&b);
        assert!(redis.count >= served as i64, "{} < {served}", redis.count);
        let expected = if die_before_the_write { 51 } else { 100 };
        assert_eq!(redis.count, expected);
    }
}

#[test]
fn an_entry_reads_back_as_written() {
    let e = Entry {
        key: "k".into(),
        month: "2026-11".into(),
        calls: 5,
        returned: 0,
        unsure: vec![[7, 2, 0]],
        seen: 40,
        epoch: 9,
    };
    let (whole, owed) = encode(vec![e.clone()], &BTreeSet::from(["x".to_owned()]));
    assert_eq!(
        String::from_utf8(whole.clone()).unwrap(),
        r#"{"entries":[{"key":"k","month":"2026-11","calls":5,"unsure":[[7,2,0]],"seen":40,"epoch":9}],"absorbed":["x"]}"#
    );
    assert!(!String::from_utf8(owed).unwrap().contains("40"));
    let (back, absorbed) = serde_json::from_slice::<Body>(&whole).unwrap().into_parts();
    assert_eq!(back, vec![e]);
    assert_eq!(absorbed.len(), 1);
}
