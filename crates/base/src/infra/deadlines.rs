//! The timer wheel that holds the request path's deadlines: a runtime of its own, on a thread of
//! its own (`drg-deadlines`), as Pingora keeps its read timeouts off the workers on its own timer
//! thread. The client connections' header and idle deadlines, an MX lookup's budget and
//! deadline, a DNS question's retry and deadline, a registry age's budget.
//!
//! A tokio runtime with any timer in its wheel looks at the wheel and reads the clock twice each
//! time its thread parks: ~360 instructions a park that a worker holding no timer does not pay
//! (callgrind: 1,118 a park against the bare Pingora floor's 757). A worker that is not busy
//! parks about once a request, so a timer held anywhere on it is paid by every request. Here a
//! deadline wakes its task on the worker only when it passes; setting one wakes this thread only
//! when it is the wheel's earliest.
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio::time::{Instant, Sleep};

/// A wait that ran out before what it waited for was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline has elapsed")]
pub struct Elapsed;

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

/// A sleep of `wait` on the deadlines' wheel.
pub fn sleep(wait: Duration) -> Sleep {
    sleep_until(Instant::now() + wait)
}

pin_project_lite::pin_project! {
    /// `future` with a deadline on the deadlines' wheel: its output, or [`Elapsed`] once the
    /// deadline passes first (`tokio::time::Timeout`, its timer off the workers). A struct,
    /// not an `async fn`: an async wrapper would copy the future it waits on into its own
    /// state at every layer (~260 instructions a request for the MX lookup's).
    #[must_use = "futures do nothing unless polled"]
    pub struct Timeout<F> {
        #[pin]
        future: F,
        #[pin]
        sleep: Sleep,
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The future first, so one ready at the deadline is not lost.
        if let Poll::Ready(out) = this.future.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        this.sleep.poll(cx).map(|()| Err(Elapsed))
    }
}

/// `future` until `deadline` (see [`Timeout`]).
pub fn timeout_at<F: IntoFuture>(deadline: Instant, future: F) -> Timeout<F::IntoFuture> {
    Timeout {
        future: future.into_future(),
        sleep: sleep_until(deadline),
    }
}

/// [`timeout_at`] `wait` from now.
pub fn timeout<F: IntoFuture>(wait: Duration, future: F) -> Timeout<F::IntoFuture> {
    timeout_at(Instant::now() + wait, future)
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

    #[test]
    fn a_timeout_gives_the_output_or_elapsed_and_a_ready_future_wins_at_the_deadline() {
        let worker = Builder::new_current_thread().enable_all().build().unwrap();
        worker.block_on(async {
            let started = Instant::now();
            let late = timeout(Duration::from_millis(30), std::future::pending::<()>()).await;
            assert_eq!(late, Err(Elapsed));
            assert!(started.elapsed() >= Duration::from_millis(30));
            let quick = timeout(Duration::from_secs(5), async { 7 }).await;
            assert_eq!(quick, Ok(7));
            // Past its deadline already, a ready future still gives its output.
            let past = timeout_at(started, async { 8 }).await;
            assert_eq!(past, Ok(8));
            let slept = Instant::now();
            sleep(Duration::from_millis(20)).await;
            assert!(slept.elapsed() >= Duration::from_millis(20));
        });
    }
}
