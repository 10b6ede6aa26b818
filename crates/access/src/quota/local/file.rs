//! The quota store's state file: opening it (created whole under a lock, a legacy JSON file
//! imported once), mapping it, and checking every word of it before any count is trusted.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapOptions;

use super::legacy::{finish_migration, migrated_name, read_legacy};
use super::table::*;
use super::{pack, unpack, LocalStore, StateError, MAX_SLOTS, MIN_SLOTS};
use crate::quota::Month;

impl LocalStore {
    /// A store on the state file `path` with room for `slots` keys (when it creates the file).
    ///
    /// A configured path ending in `.json` (the format before this one) names the legacy file:
    /// the counters live next to it with the extension `.counters`. A legacy JSON file found
    /// (at `path`, or as `<name>.json` next to the counters file) while the counters file does
    /// not exist yet is imported once and kept as `<name>.json.migrated`. A file that exists but
    /// does not check out is an error: counts are never silently reset.
    pub fn open(path: &Path, slots: u32) -> Result<Self, StateError> {
        let io = |source| StateError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let (counters, legacy) = if path.extension().is_some_and(|e| e == "json") {
            (path.with_extension("counters"), path.to_owned())
        } else {
            (path.to_owned(), path.with_extension("json"))
        };
        // Serialises creation and migration between processes starting at once; never held
        // once the store is open.
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(counters.with_extension("lock"))
            .map_err(io)?;
        lock.lock().map_err(io)?;
        match read_head(&counters)? {
            Head::Missing => {
                let legacy = legacy.is_file().then_some(legacy.as_path());
                create(&counters, legacy, slots as usize)?;
            }
            Head::Legacy => create(&counters, Some(&counters), slots as usize)?,
            Head::Counters => {}
        }
        let store = LocalStore::map(&counters)?;
        if counters != legacy && legacy.is_file() {
            if store.table.header(H_FLAGS).load(Ordering::Relaxed) & FLAG_IMPORTED != 0 {
                // A start stopped between the rename of the new file and the old one's.
                finish_migration(&legacy, true)?;
            } else {
                log::warn!(
                    "quota: {} is a legacy state file next to {}, which already holds the counts; it is not imported (move it away)",
                    legacy.display(),
                    counters.display()
                );
            }
        }
        if store.table.slots != slots as usize {
            log::warn!(
                "quota: {} has {} slots; gateway.quota.slots ({slots}) applies only when the file is created",
                counters.display(),
                store.table.slots
            );
        }
        drop(lock);
        log::info!(
            "quota store: counters in {} ({} of {} slots used)",
            counters.display(),
            store.table.used_slots(),
            store.table.slots
        );
        Ok(store)
    }

    /// Maps an existing counters file and checks it whole.
    fn map(path: &Path) -> Result<Self, StateError> {
        let io = |source| StateError::Io {
            path: path.to_owned(),
            source,
        };
        let corrupt = |message: String| StateError::Corrupt {
            path: path.to_owned(),
            message,
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        file.lock_shared().map_err(io)?;
        let mut header = [0u8; HEADER_WORDS * 8];
        let len = file.metadata().map_err(io)?.len();
        (&file).read_exact(&mut header).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                corrupt(format!("{len} bytes, shorter than its header"))
            } else {
                io(e)
            }
        })?;
        let word = |i: usize| u64::from_ne_bytes(header[i * 8..i * 8 + 8].try_into().unwrap());
        if word(H_MAGIC) != MAGIC {
            return Err(corrupt(
                "not a quota counters file (wrong magic)".to_owned(),
            ));
        }
        if word(H_VERSION) != FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {}, this gateway reads {FORMAT_VERSION}",
                word(H_VERSION)
            )));
        }
        let slots = word(H_SLOTS);
        if word(H_SLOT_WORDS) != SLOT_WORDS as u64
            || !(u64::from(MIN_SLOTS)..=u64::from(MAX_SLOTS)).contains(&slots)
        {
            return Err(corrupt(format!(
                "unexpected table shape: {slots} slots of {} words",
                word(H_SLOT_WORDS)
            )));
        }
        let slots = slots as usize;
        if len != Table::bytes(slots) as u64 {
            return Err(corrupt(format!(
                "{len} bytes where its {slots} slots take {}",
                Table::bytes(slots)
            )));
        }
        let table = Table {
            map: MmapOptions::new()
                .len(Table::bytes(slots))
                .map_raw(&file)
                .map_err(io)?,
            slots,
        };
        check_slots(&table).map_err(corrupt)?;
        Ok(LocalStore {
            table,
            state_file: Some(path.to_owned()),
            _file: Some(file),
            refused: AtomicU64::new(0),
            slots_full: AtomicU64::new(0),
            rates: Default::default(),
        })
    }
}

/// What a state file path holds, from its first bytes.
enum Head {
    Missing,
    Counters,
    /// The JSON format before the counters file.
    Legacy,
}

fn read_head(path: &Path) -> Result<Head, StateError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Head::Missing),
        Err(source) => {
            return Err(StateError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(StateError::Io {
                    path: path.to_owned(),
                    source,
                })
            }
        }
    }
    let text = head[..n].trim_ascii_start();
    Ok(if text.first() == Some(&b'{') {
        Head::Legacy
    } else {
        // Checked in full (magic, version, size) when mapped.
        Head::Counters
    })
}

/// Checks every slot of a mapped file: only free, ready or claiming states, ids that are ids,
/// no id twice, months a month label can name.
pub(super) fn check_slots(table: &Table) -> Result<(), String> {
    let mut ids = HashSet::new();
    let last_month = Month {
        year: 9999,
        month: 12,
    }
    .index();
    for i in 0..table.slots {
        let slot = table.slot(i);
        let state = slot[S_STATE].load(Ordering::Acquire);
        match state & STATE_KIND {
            FREE if state == FREE => {}
            READY if state == READY => {
                let id = Table::slot_id(slot)
                    .to_id()
                    .ok_or_else(|| format!("slot {i} holds no valid key id"))?;
                let (month, _) = unpack(slot[S_COUNT].load(Ordering::Relaxed));
                if month > last_month {
                    return Err(format!("slot {i} ('{id}') holds month index {month}"));
                }
                if !ids.insert(id.clone()) {
                    return Err(format!("key id '{id}' holds two slots"));
                }
            }
            CLAIMING => {
                // A process opens its state file once, so a claim carrying its own pid was left
                // by a killed predecessor whose pid it got.
                if !claimer_alive(state) || state == claiming(std::process::id()) {
                    // Its claimer died mid-claim: the slot was never counted in.
                    let _ = slot[S_STATE].compare_exchange(
                        state,
                        FREE,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
            }
            _ => return Err(format!("slot {i} has the unknown state {state:#x}")),
        }
    }
    Ok(())
}

/// Creates the counters file `path` whole (see [`drg_base::infra::fsutil`]), importing `legacy`'s counts
/// when given. Called under the creation lock.
fn create(path: &Path, legacy: Option<&Path>, slots: usize) -> Result<(), StateError> {
    let keys = match legacy {
        Some(l) => read_legacy(l)?,
        None => Vec::new(),
    };
    let slots = slots.clamp(MIN_SLOTS as usize, MAX_SLOTS as usize);
    if keys.len() > slots {
        return Err(StateError::Import {
            path: legacy.unwrap_or(path).to_owned(),
            message: format!(
                "{} keys do not fit in gateway.quota.slots ({slots})",
                keys.len()
            ),
        });
    }
    // Key ids and counts are the operator's business: owner only, whatever the umask.
    drg_base::infra::fsutil::replace_with(path, 0o600, |file| {
        fill_counters(file, path, legacy, &keys, slots)?;
        if let Some(l) = legacy {
            // Kept under its new name before the counters file takes over, so no crash can
            // leave neither.
            let kept = migrated_name(l);
            match std::fs::hard_link(l, &kept) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(StateError::Io { path: kept, source }),
            }
        }
        Ok(())
    })
    .map_err(|e| match e {
        drg_base::infra::fsutil::ReplaceError::Fill(e) => e,
        drg_base::infra::fsutil::ReplaceError::Io(source) => StateError::Io {
            path: path.to_owned(),
            source,
        },
    })?;
    if let Some(l) = legacy {
        log::warn!(
            "quota: imported the counts of {} keys from the legacy state file {} into {}; the old file is kept as {}",
            keys.len(),
            l.display(),
            path.display(),
            migrated_name(l).display()
        );
        if l != path {
            finish_migration(l, false)?;
        }
    }
    Ok(())
}

/// Writes a fresh counters table of `slots` into `file` (the new counters file `path`), with
/// the imported `keys`, and flushes the mapping.
fn fill_counters(
    file: &File,
    path: &Path,
    legacy: Option<&Path>,
    keys: &[(String, Month, u64)],
    slots: usize,
) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.to_owned(),
        source,
    };
    let import = |message: String| StateError::Import {
        path: legacy.unwrap_or(path).to_owned(),
        message,
    };
    // Zeros written, not a sparse hole: a count's first write never has to allocate a block.
    {
        let zeros = vec![0u8; 1 << 16];
        let mut left = Table::bytes(slots);
        let mut w = std::io::BufWriter::new(file);
        while left > 0 {
            let n = left.min(zeros.len());
            w.write_all(&zeros[..n]).map_err(io)?;
            left -= n;
        }
        w.flush().map_err(io)?;
    }
    let table = Table {
        map: MmapOptions::new()
            .len(Table::bytes(slots))
            .map_raw(file)
            .map_err(io)?,
        slots,
    };
    table.init_header();
    for (id, month, used) in keys {
        let words = KeyWords::new(id).ok_or_else(|| {
            import(format!(
                "key id '{id}' is longer than {MAX_KEY_ID_LEN} bytes or empty"
            ))
        })?;
        let slot = table
            .find_blocking(&words, true)
            .map_err(|_| import(format!("no slot for key id '{id}'")))?;
        table.slot(slot)[S_COUNT].store(pack(month.index(), *used), Ordering::Relaxed);
    }
    if legacy.is_some() {
        table
            .header(H_FLAGS)
            .store(FLAG_IMPORTED, Ordering::Relaxed);
    }
    table.map.flush().map_err(io)
}
