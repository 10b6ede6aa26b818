//! The calls this gateway counted while Redis was unreachable or slow, and has not got into
//! Redis yet, and the calls Redis counts for it that it has not served (its leases' unused part,
//! give-backs not sent yet), kept in a state file beside the quota's
//! (`quota.redis-carried.<pid>.json`, one per process): a restart sends the first and gives back
//! the second instead of forgetting them, the embedded store's crash-safety for the Redis
//! store's local part. Written by the background sync whenever there are any (every
//! `reconcile_interval_ms`, so a `kill -9` misses at most the calls of that interval), removed
//! once there are none. The file of a process that is gone (stopped, upgraded, killed) is adopted by the
//! next gateway of that state folder to look: at its start and at each sync, so the new process
//! of a graceful upgrade takes what the old one left at its end. Batches whose reply never came
//! keep their ids, so Redis still applies each once.
//!
//! A file is named by its process's pid and a random tag (`quota.redis-carried.<pid>-<tag>.json`):
//! a container's gateway runs as pid 1 after every restart, and a file of pid 1 that is not this
//! process's own is a previous incarnation's, to adopt. An adopter claims a file by renaming it
//! (`...json.claimed.<its pid>`) before reading it, so two gateways on one folder never both take
//! it; a claim whose claimer is gone is adopted in turn.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::slots::{Batch, Carried, Slot};
use super::RedisStore;
use crate::access::quota::Month;

/// One key and month's calls Redis may lack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    key: String,
    /// `YYYY-MM`.
    month: String,
    /// Counted here, never sent.
    calls: u64,
    /// Counted in Redis for this process and never served (a lease's unused part): given back.
    #[serde(default, skip_serializing_if = "is_zero")]
    returned: u64,
    /// Sent under an id whose reply never came: `[id, calls, returned]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    unsure: Vec<[u64; 3]>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

const PREFIX: &str = "quota.redis-carried.";
const CLAIMED: &str = ".json.claimed.";

/// The folder the files live in: the quota's `state_file`'s.
pub fn folder_of(state_file: &Path) -> PathBuf {
    state_file
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The pid a carried-calls file name belongs to: its writer's (`<pid>-<tag>.json`, or
/// `<pid>.json` as releases before the tag wrote it), or its claimer's (`...json.claimed.<pid>`).
fn pid_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    if let Some((_, claimer)) = rest.split_once(CLAIMED) {
        return claimer.parse().ok();
    }
    let stem = rest.strip_suffix(".json")?;
    stem.split_once('-')
        .map_or(stem, |(pid, _)| pid)
        .parse()
        .ok()
}

/// Whether process `pid` exists (signal 0: nothing sent).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 sends nothing: it only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether the file at `path` (of process `pid`) is to adopt: not this process's own (`own`,
/// pid `me`), and its pid is gone, or is this process's (a previous incarnation's: a container
/// restarted as pid 1 again).
fn adoptable(own: &Path, me: u32, path: &Path, pid: u32, alive: impl Fn(u32) -> bool) -> bool {
    path != own && (pid == me || !alive(pid))
}

fn entry_of(slot: &Slot) -> Option<Entry> {
    let carried = slot.tally().carried();
    (!carried.is_empty()).then(|| Entry {
        key: slot.key_id().to_owned(),
        month: slot.month.label(),
        calls: carried.calls,
        returned: carried.returned,
        unsure: carried
            .unsure
            .iter()
            .map(|b| [b.id, b.calls, b.returned])
            .collect(),
    })
}

impl RedisStore {
    /// Keeps the carried calls in `folder` (see the module documentation).
    pub fn with_carried_folder(mut self, folder: PathBuf) -> Self {
        let mut tag = [0u8; 4];
        // Without randomness the tag is the time: it only has to differ from a previous
        // incarnation's under the same pid.
        if getrandom::fill(&mut tag).is_err() {
            tag = (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()))
            .to_le_bytes();
        }
        let name = format!("{PREFIX}{}-{}.json", std::process::id(), hex::encode(tag));
        self.carried_file = Some(folder.join(name));
        self
    }

    /// Adopts the files of processes that are gone: their calls join the slots for the next
    /// sync to send, and the files go. How many files.
    pub fn adopt_carried(&self) -> usize {
        let Some(own) = &self.carried_file else {
            return 0;
        };
        let Some(folder) = own.parent() else { return 0 };
        let Ok(dir) = std::fs::read_dir(folder) else {
            return 0;
        };
        let mut taken = Vec::new();
        let me = std::process::id();
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(pid) = entry.file_name().to_str().and_then(pid_of) else {
                continue;
            };
            if !adoptable(own, me, &path, pid, alive) {
                continue;
            }
            // Claimed first: a gateway whose rename fails left it to another.
            let Some(file) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let base = file.split_once(".claimed.").map_or(file, |(b, _)| b);
            let claimed = path.with_file_name(format!("{base}.claimed.{me}"));
            if std::fs::rename(&path, &claimed).is_err() {
                continue;
            }
            self.load_carried(&claimed);
            taken.push(claimed);
        }
        if !taken.is_empty() {
            // Kept in this process's own file before the claimed ones go.
            self.save_carried(&self.slots.all());
        }
        for claimed in &taken {
            let _ = std::fs::remove_file(claimed);
        }
        taken.len()
    }

    /// Takes the calls in `path` into the slots; how many calls. A file that does not parse
    /// is kept aside (`.bad`) and logged.
    fn load_carried(&self, path: &Path) -> u64 {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                log::error!("quota store: {} unreadable: {e}", path.display());
                return 0;
            }
        };
        let entries: Vec<Entry> = match serde_json::from_slice(&text) {
            Ok(e) => e,
            Err(e) => {
                let aside = path.with_extension("json.bad");
                let _ = std::fs::rename(path, &aside);
                log::error!(
                    "quota store: {} is not a list of carried calls ({e}); moved to {}",
                    path.display(),
                    aside.display()
                );
                return 0;
            }
        };
        let (mut total, mut returned) = (0, 0);
        for e in entries {
            let Some(month) = Month::parse_label(&e.month) else {
                continue;
            };
            let unsure: Vec<Batch> = e
                .unsure
                .iter()
                .map(|[id, calls, returned]| Batch {
                    id: *id,
                    calls: *calls,
                    returned: *returned,
                })
                .collect();
            total += e.calls + unsure.iter().map(|b| b.calls).sum::<u64>();
            returned += e.returned;
            self.slots.get(&e.key, month).tally().restore(Carried {
                calls: e.calls,
                returned: e.returned,
                unsure,
            });
        }
        if total > 0 || returned > 0 {
            log::info!(
                "quota store: {total} calls counted before the restart and not yet in Redis are \
                 sent, and {returned} leased calls never served are given back, with the next \
                 sync ({})",
                path.display()
            );
        }
        total
    }

    /// Writes what the slots carry (or removes the file when nothing is carried).
    pub(super) fn save_carried(&self, slots: &[std::sync::Arc<Slot>]) {
        let Some(path) = &self.carried_file else {
            return;
        };
        let entries: Vec<Entry> = slots.iter().filter_map(|s| entry_of(s)).collect();
        let body = if entries.is_empty() {
            Vec::new()
        } else {
            serde_json::to_vec(&entries).unwrap_or_default()
        };
        let mut written = self
            .carried_written
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Unchanged and still there (an operator may have removed it): nothing to write.
        if *written == body && (body.is_empty() || path.exists()) {
            return;
        }
        if let Some(folder) = path.parent() {
            let _ = std::fs::create_dir_all(folder);
        }
        let done = if body.is_empty() {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            crate::infra::fsutil::write_atomic(path, 0o600, &body)
        };
        if done.is_ok() {
            *written = body;
        }
        if let Err(e) = done {
            log::error!(
                "quota store: carried calls not kept in {}: {e}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_name_their_process() {
        assert_eq!(pid_of("quota.redis-carried.4242.json"), Some(4242));
        assert_eq!(pid_of("quota.redis-carried.4242-0a1b2c3d.json"), Some(4242));
        assert_eq!(
            pid_of("quota.redis-carried.4242-0a1b2c3d.json.claimed.77"),
            Some(77)
        );
        assert_eq!(pid_of("quota.redis-carried.json"), None);
        assert_eq!(pid_of("quota.counters"), None);
        assert!(alive(std::process::id()));
    }

    #[test]
    fn a_previous_incarnations_file_under_the_same_pid_is_adopted() {
        let own = Path::new("/s/quota.redis-carried.1-aaaa.json");
        let alive = |pid: u32| pid == 1 || pid == 7;
        // A container's gateway is pid 1 after every restart: another tag is the last one's.
        let before = Path::new("/s/quota.redis-carried.1-bbbb.json");
        assert!(adoptable(own, 1, before, 1, alive));
        assert!(!adoptable(own, 1, own, 1, alive));
        // Another live process's file waits; a gone one's is adopted.
        assert!(!adoptable(
            own,
            1,
            Path::new("/s/quota.redis-carried.7-cccc.json"),
            7,
            alive
        ));
        assert!(adoptable(
            own,
            1,
            Path::new("/s/quota.redis-carried.9-dddd.json"),
            9,
            alive
        ));
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let e = Entry {
            key: "k".into(),
            month: "2026-11".into(),
            calls: 5,
            returned: 0,
            unsure: vec![[7, 2, 0]],
        };
        let text = serde_json::to_string(&[&e]).unwrap();
        assert_eq!(
            text,
            r#"[{"key":"k","month":"2026-11","calls":5,"unsure":[[7,2,0]]}]"#
        );
        let back: Vec<Entry> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, vec![e]);
    }
}
