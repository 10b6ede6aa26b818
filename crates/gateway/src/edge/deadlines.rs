//! The timer wheel that holds the client connections' header and idle deadlines: a runtime of
//! its own, on a thread of its own (`drg-deadlines`), as Pingora keeps its read timeouts off
//! the workers on its own timer thread.
//!
//! A tokio runtime with any timer in its wheel looks at the wheel and reads the clock twice each
//! time its thread parks: ~360 instructions a park that a worker holding no timer does not pay
//! (callgrind: 1,118 a park against the bare Pingora floor's 757). Every kept-alive connection
//! holds a deadline, so a worker serving a request at a time parked once a request with that
//! cost. Here the deadlines only wake a connection's task when one passes (rare: each
//! connection's timer is set again only when its deadline comes earlier, see
//! `downstream::LimitedStream`).

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};
use tokio::time::{Instant, Sleep};

/// A sleep until `deadline` on the deadlines' wheel, or on the current runtime's when that
/// thread could not be started (logged once).
pub fn sleep_until(deadline: Instant) -> Sleep {
    match handle() {
        Some(handle) => {
            let _on = handle.enter();
            tokio::time::sleep_until(deadline)
        }
        None => tokio::time::sleep_until(deadline),
    }
}

fn handle() -> Option<&'static Handle> {
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match start() {
            Ok(handle) => Some(handle),
            Err(e) => {
                log::warn!(
                    "connection deadlines: no thread of their own ({e}); kept on the workers"
                );
                None
            }
        })
        .as_ref()
}

fn start() -> std::io::Result<Handle> {
    let runtime = Builder::new_current_thread().enable_time().build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("drg-deadlines".into())
        // Drives the wheel for the process's life: its timers wake tasks on the workers.
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_deadline_wakes_a_task_on_another_runtime_when_it_passes() {
        let worker = Builder::new_current_thread().enable_all().build().unwrap();
        worker.block_on(async {
            let started = Instant::now();
            sleep_until(started + Duration::from_millis(50)).await;
            assert!(started.elapsed() >= Duration::from_millis(50));
            // And set again, earlier than it was, from the worker.
            let mut sleep = Box::pin(sleep_until(started + Duration::from_secs(3600)));
            sleep
                .as_mut()
                .reset(Instant::now() + Duration::from_millis(20));
            sleep.await;
        });
        assert!(handle().is_some(), "the deadlines' thread runs");
    }
}
