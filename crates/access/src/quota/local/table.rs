//! The quota store's slot table: its layout in the mapping (header, 64-byte slots of state,
//! month|count and key id), and the lock-free search that finds, and claims once across
//! processes, a key's slot (waiting on claims in progress, undoing those of dead processes).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapRaw;

/// "DRGQUOTA": what the file's first word holds (native byte order: a file carried to a host of
/// the other byte order is refused, not misread).
pub(super) const MAGIC: u64 = u64::from_ne_bytes(*b"DRGQUOTA");
pub(super) const FORMAT_VERSION: u64 = 1;
/// Header words: magic, version, slot count, words per slot, flags, then reserved.
pub(super) const HEADER_WORDS: usize = 8;
pub(super) const H_MAGIC: usize = 0;
pub(super) const H_VERSION: usize = 1;
pub(super) const H_SLOTS: usize = 2;
pub(super) const H_SLOT_WORDS: usize = 3;
pub(super) const H_FLAGS: usize = 4;
/// The file's counts were imported from a legacy JSON state file.
pub(super) const FLAG_IMPORTED: u64 = 1;

/// A slot: state, month|count, then the key id. 64 bytes: one cache line, so two hot keys never
/// share one.
pub(super) const SLOT_WORDS: usize = 8;
pub(super) const S_STATE: usize = 0;
pub(super) const S_COUNT: usize = 1;
pub(super) const S_ID: usize = 2;
pub(super) const ID_WORDS: usize = SLOT_WORDS - S_ID;
/// The longest key id a slot holds, in bytes (key ids are ASCII; `keys.yaml` validation refuses
/// longer ones).
pub const MAX_KEY_ID_LEN: usize = ID_WORDS * 8;

/// The longest search: no key is placed farther from its home slot, so no search has to look
/// farther (a table this crowded counts as full). Bounds the cost of a call of a key that has no
/// slot in a full table. Fixed by the format: every process on the file must agree.
pub(super) const MAX_PROBES: usize = 4096;

/// Slot states. A claim holds the claimer's pid, so a claim left by a killed process is undone.
pub(super) const FREE: u64 = 0;
pub(super) const READY: u64 = 2;
pub(super) const CLAIMING: u64 = 1;
pub(super) const STATE_KIND: u64 = 0xff;

pub(super) fn claiming(pid: u32) -> u64 {
    (u64::from(pid) << 8) | CLAIMING
}

/// A claim normally completes within a few stores: spins this many times on it before the
/// search hands the wait to its caller (a claimer descheduled mid-claim takes longer).
pub(super) const CLAIM_SPINS: u32 = 100;
/// A claim normally completes within a few stores; past this, its claimer may be dead.
pub(super) const CLAIM_CHECK_AFTER: Duration = Duration::from_millis(50);
/// A claimer that is alive (or whose pid was reused) yet never completes: stop waiting and
/// refuse the call rather than hold the request.
pub(super) const CLAIM_GIVE_UP: Duration = Duration::from_secs(1);
/// Between two looks at a claim in progress, the waiting task sleeps this long.
pub(super) const CLAIM_POLL: Duration = Duration::from_millis(1);

/// A key id as the words a slot stores: its bytes, zero-padded (ids never contain NUL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeyWords(pub(super) [u64; ID_WORDS]);

impl KeyWords {
    pub(super) fn new(id: &str) -> Option<KeyWords> {
        let bytes = id.as_bytes();
        if bytes.is_empty() || bytes.len() > MAX_KEY_ID_LEN || bytes.contains(&0) {
            return None;
        }
        let mut words = [0u64; ID_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_le_bytes(b);
        }
        Some(KeyWords(words))
    }

    pub(super) fn to_id(self) -> Option<String> {
        let bytes: Vec<u8> = self.0.iter().flat_map(|w| w.to_le_bytes()).collect();
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        // Padding must be all zeros and the id printable ASCII, else the slot is not ours.
        if len == 0 || bytes[len..].iter().any(|&b| b != 0) {
            return None;
        }
        let id = std::str::from_utf8(&bytes[..len]).ok()?;
        id.bytes()
            .all(|b| b.is_ascii_graphic())
            .then(|| id.to_owned())
    }

    /// The slot a search starts at. The mix is fixed by this file format (a library hasher may
    /// change between versions, and every process on the file must probe the same slots).
    pub(super) fn home(&self, slots: usize) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for w in self.0 {
            h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
        }
        (h % slots as u64) as usize
    }
}

/// Why a key has no slot to count in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoSlot {
    /// Not claimed yet (only when not asked to claim).
    Absent,
    /// Every slot holds another key.
    Full,
    /// A claim on the way never completed.
    Stuck,
    /// Slot `slot` is being claimed (its state word holds `state`): wait, then search again.
    Busy { slot: usize, state: u64 },
    /// The id cannot be stored (too long, empty).
    BadId,
}

/// The slot table, in a mapping: a file's (shared with other processes) or anonymous.
pub(super) struct Table {
    pub(super) map: MmapRaw,
    pub(super) slots: usize,
}

impl Table {
    pub(super) fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned (so 8-byte aligned), at least HEADER_WORDS words
        // long (checked before it is made), and lives as long as `self.map`; its length is a
        // multiple of 8. `MmapRaw` hands out no references, so the only views of this memory
        // are these atomics (here and in other processes mapping the same file), which allow
        // shared mutation. The file is never truncated while mapped: this process holds a
        // shared flock on it and the gateway never shrinks or rewrites an existing file (an
        // operator truncating it by hand would get SIGBUS, not wrong counts).
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8)
        }
    }

    pub(super) fn header(&self, word: usize) -> &AtomicU64 {
        &self.words()[word]
    }

    pub(super) fn slot(&self, i: usize) -> &[AtomicU64] {
        let start = HEADER_WORDS + i * SLOT_WORDS;
        &self.words()[start..start + SLOT_WORDS]
    }

    pub(super) fn bytes(slots: usize) -> usize {
        (HEADER_WORDS + slots * SLOT_WORDS) * 8
    }

    /// Writes the header of a fresh (all-zero) table.
    pub(super) fn init_header(&self) {
        self.header(H_VERSION)
            .store(FORMAT_VERSION, Ordering::Relaxed);
        self.header(H_SLOTS)
            .store(self.slots as u64, Ordering::Relaxed);
        self.header(H_SLOT_WORDS)
            .store(SLOT_WORDS as u64, Ordering::Relaxed);
        self.header(H_MAGIC).store(MAGIC, Ordering::Release);
    }

    pub(super) fn slot_id(slot: &[AtomicU64]) -> KeyWords {
        let mut words = [0u64; ID_WORDS];
        for (w, a) in words.iter_mut().zip(&slot[S_ID..]) {
            *w = a.load(Ordering::Relaxed);
        }
        KeyWords(words)
    }

    /// The slot of `id`, claiming a free one for it when `claim` is set. Lock-free and never
    /// blocks: meeting another thread's or process's claim of a slot on the way, it spins
    /// briefly (a claim takes a few stores), then returns [`NoSlot::Busy`] for its caller to
    /// wait on ([`Table::find_waiting`], [`Table::find_blocking`]).
    pub(super) fn find(&self, id: &KeyWords, claim: bool) -> Result<usize, NoSlot> {
        let home = id.home(self.slots);
        let mut probe = 0;
        while probe < self.slots.min(MAX_PROBES) {
            let i = (home + probe) % self.slots;
            let slot = self.slot(i);
            let state = slot[S_STATE].load(Ordering::Acquire);
            if state == FREE {
                if !claim {
                    return Err(NoSlot::Absent);
                }
                // Read here, not per search: `getpid` is a system call (glibc caches no pid),
                // and a key's slot is claimed once in its life, found on every request.
                let me = claiming(std::process::id());
                if slot[S_STATE]
                    .compare_exchange(FREE, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    continue; // Look at this slot again.
                }
                for (a, w) in slot[S_ID..].iter().zip(id.0) {
                    a.store(w, Ordering::Relaxed);
                }
                slot[S_COUNT].store(0, Ordering::Relaxed);
                // Publishes the id with the state: a reader that sees READY sees the id. A
                // claim undone meanwhile (its claimer taken for dead) is not published.
                if slot[S_STATE]
                    .compare_exchange(me, READY, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(i);
                }
                continue;
            }
            if state & STATE_KIND == CLAIMING {
                if spin_on_claim(&slot[S_STATE], state) {
                    continue;
                }
                return Err(NoSlot::Busy { slot: i, state });
            }
            if state == READY && Table::slot_id(slot) == *id {
                return Ok(i);
            }
            // Another key's slot (opening the file checks that it holds no other state).
            probe += 1;
        }
        Err(if claim { NoSlot::Full } else { NoSlot::Absent })
    }

    /// [`Table::find`], waiting on a claim in progress by sleeping the task (never the worker
    /// thread): the request path's search.
    pub(super) async fn find_waiting(&self, id: &KeyWords, claim: bool) -> Result<usize, NoSlot> {
        let mut wait = ClaimWait::default();
        loop {
            match self.find(id, claim) {
                Err(NoSlot::Busy { slot, state }) => {
                    match wait.step(&self.slot(slot)[S_STATE], state) {
                        WaitStep::Retry => {}
                        WaitStep::Pause => tokio::time::sleep(CLAIM_POLL).await,
                        WaitStep::GiveUp => return Err(NoSlot::Stuck),
                    }
                }
                found => return found,
            }
        }
    }

    /// [`Table::find`], waiting on a claim in progress by sleeping the thread: only off the
    /// request path (creating the file, tests).
    pub(super) fn find_blocking(&self, id: &KeyWords, claim: bool) -> Result<usize, NoSlot> {
        let mut wait = ClaimWait::default();
        loop {
            match self.find(id, claim) {
                Err(NoSlot::Busy { slot, state }) => {
                    match wait.step(&self.slot(slot)[S_STATE], state) {
                        WaitStep::Retry => {}
                        WaitStep::Pause => std::thread::sleep(CLAIM_POLL),
                        WaitStep::GiveUp => return Err(NoSlot::Stuck),
                    }
                }
                found => return found,
            }
        }
    }

    /// Slots a project holds. One pass over the state words (`/readyz` and `/metrics` ask on
    /// every poll, 65,536 slots by default), without a slot's slice each; a plain stride, not
    /// a chain of iterator adapters: unoptimised (the tests' builds poll `/metrics` every 20
    /// ms), the chain made this 40% of the admin thread's time.
    pub(super) fn used_slots(&self) -> usize {
        let states = &self.words()[HEADER_WORDS + S_STATE..];
        let mut used = 0;
        let mut i = 0;
        while i < self.slots * SLOT_WORDS {
            used += usize::from(states[i].load(Ordering::Relaxed) != FREE);
            i += SLOT_WORDS;
        }
        used
    }
}

/// Spins a little on a claim (`state`, claiming) in progress: whether it changed meanwhile.
pub(super) fn spin_on_claim(word: &AtomicU64, state: u64) -> bool {
    for _ in 0..CLAIM_SPINS {
        std::hint::spin_loop();
        if word.load(Ordering::Acquire) != state {
            return true;
        }
    }
    false
}

/// What a search waiting on a claim in progress does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WaitStep {
    /// The claim changed (completed, or undone): search again.
    Retry,
    /// Still claimed: look again after [`CLAIM_POLL`].
    Pause,
    /// Claimed for longer than [`CLAIM_GIVE_UP`] by a live process.
    GiveUp,
}

/// One search's wait on claims in progress: how the waiting is paced is its caller's (a task
/// sleeps, a thread sleeps), what to do after each look is this.
#[derive(Debug, Default)]
pub(super) struct ClaimWait {
    since: Option<Instant>,
}

impl ClaimWait {
    /// Looks at the claim (`state`) on `word` once. Undoes the claim of a process that died
    /// mid-claim.
    pub(super) fn step(&mut self, word: &AtomicU64, state: u64) -> WaitStep {
        if word.load(Ordering::Acquire) != state {
            return WaitStep::Retry;
        }
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        if waited > CLAIM_CHECK_AFTER && !claimer_alive(state) {
            // Whoever wins this compare-and-swap (or another waiter) frees the slot.
            let _ = word.compare_exchange(state, FREE, Ordering::AcqRel, Ordering::Acquire);
            return WaitStep::Retry;
        }
        if waited > CLAIM_GIVE_UP {
            return WaitStep::GiveUp;
        }
        WaitStep::Pause
    }
}

/// Whether the process holding claim `state` still runs (Linux `/proc`; elsewhere assumed, so
/// a live claim is never taken away).
pub(super) fn claimer_alive(state: u64) -> bool {
    let pid = state >> 8;
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new(&format!("/proc/{pid}")).exists()
}
