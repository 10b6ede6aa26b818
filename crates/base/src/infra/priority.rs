//! Lowering the CPU priority of the calling thread, for background work (table builds, the
//! call log's writes) that must run in the gaps of the request path rather than in its place.

/// How far below the workers a background thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// `nice 10`: about a tenth of a busy core's time against a worker at nice 0, in the
    /// shortest time slices the kernel gives (Linux 6.12 and later).
    Low,
    /// `SCHED_IDLE`: only what the workers leave.
    Idle,
}

/// Lowers the calling thread's priority; `false` when the system refused. Only on Linux, where
/// both calls act on the calling thread; elsewhere they would act on the whole process,
/// workers included, so nothing is done. A thread cannot raise its priority back without
/// privileges: call it on threads of its own, never on a shared pool's.
#[cfg(target_os = "linux")]
pub fn lower_this_thread(priority: Priority) -> bool {
    match priority {
        Priority::Idle => {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param for the call; pid 0 names this thread.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
        }
        Priority::Low => {
            // Short slices first: a kernel without them (before 6.12) refuses nothing here and
            // just ignores the request, so the nice value is what always takes effect.
            if set_fair_attributes(LOW_NICE, SHORT_SLICE_NS) {
                return true;
            }
            // SAFETY: setpriority only reads its integer arguments; 0 names the calling thread.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, LOW_NICE) == 0 }
        }
    }
}

/// The nice value of [`Priority::Low`].
#[cfg(target_os = "linux")]
const LOW_NICE: i32 = 10;

/// The time slice a low thread asks for, the kernel's shortest: when it preempts a worker it
/// gives the core back after at most this long (the default slice is a few milliseconds, which
/// is what a request waiting behind it would see).
#[cfg(target_os = "linux")]
const SHORT_SLICE_NS: u64 = 100_000;

/// The kernel's `struct sched_attr` (its first, 48-byte version), which the libc crate does not
/// define.
#[cfg(target_os = "linux")]
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// `sched_setattr` on the calling thread: the normal policy at `nice`, asking for time slices of
/// `slice_ns` (EEVDF reads a normal thread's `runtime` as its slice).
#[cfg(target_os = "linux")]
fn set_fair_attributes(nice: i32, slice_ns: u64) -> bool {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice_ns,
        deadline: 0,
        period: 0,
    };
    // SAFETY: `attr` is a valid, fully initialised sched_attr of the size it declares; pid 0
    // names the calling thread; the kernel only reads it.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) == 0 }
}

#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread(_priority: Priority) -> bool {
    false
}
