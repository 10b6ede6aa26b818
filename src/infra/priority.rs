//! Lowering the CPU priority of the calling thread, for background work (table builds, the
//! call log's writes) that must run in the gaps of the request path rather than in its place.

/// How far below the workers a background thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// `nice 10`: about a tenth of a busy core's time against a worker at nice 0.
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
        // SAFETY: setpriority only reads its integer arguments; 0 names the calling thread.
        Priority::Low => unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) == 0 },
    }
}

#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread(_priority: Priority) -> bool {
    false
}
