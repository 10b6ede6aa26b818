//! The carried-calls files: owned by a lock, adopted once whatever the crash.

use std::sync::Arc;

use super::*;
use crate::quota::redis::RedisConfig;
use crate::quota::SystemClock;

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
    assert_eq!(
        kind_of("quota.redis-carried.4242.json"),
        Some(Kind::Legacy(4242))
    );
    assert_eq!(
        kind_of("quota.redis-carried.4242-0a1b2c3d.json"),
        Some(Kind::Legacy(4242))
    );
    assert_eq!(
        kind_of("quota.redis-carried.4242-0a1b2c3d.json.claimed.77"),
        Some(Kind::Legacy(77))
    );
    assert_eq!(kind_of("quota.counters"), None);
    assert!(alive(std::process::id()));
    // Earlier releases' files: a gone pid's, or this process's own (a container's pid 1).
    let alive = |pid: u32| pid == 1 || pid == 7;
    assert!(legacy_adoptable(1, 1, alive));
    assert!(!legacy_adoptable(1, 7, alive));
    assert!(legacy_adoptable(1, 9, alive));
}

#[test]
fn a_live_gateways_file_is_never_adopted_whatever_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let a = store(dir.path());
    let b = store(dir.path());
    count(&a, "k", 5, 40);
    a.save_carried(&a.slots.all(), true);
    assert_eq!(files(dir.path()).len(), 1);
    // Same process, same pid: only the lock tells that A lives. B leaves it, at every sync.
    for _ in 0..3 {
        assert_eq!(b.adopt_carried(), 0);
    }
    assert_eq!(owed(&b, "k"), (0, 0));
    // A rewrites its file (a new version, locked before it is in place): still A's.
    count(&a, "k", 1, 0);
    a.save_carried(&a.slots.all(), true);
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
    t.save_carried(&t.slots.all(), true);
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

#[test]
fn an_earlier_releases_list_is_adopted_and_a_bad_file_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("quota.redis-carried.4194302-0a1b2c3d.json"),
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
