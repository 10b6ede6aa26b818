//! The quota's Redis link, one per thread that runs a single-threaded runtime (a Pingora worker
//! without work stealing): the link's driver task then runs on the thread that calls, so a lease
//! refill asked from a worker wakes no other thread on the worker's core.
//!
//! A link is made on a thread's first call and kept for the thread's life (a worker's is the
//! process's). Elsewhere (a work-stealing runtime, Cluster, Sentinel) one link serves all.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::runtime::{Handle, RuntimeFlavor};

use drg_base::infra::redis::RedisLink;

thread_local! {
    /// This thread's links, by the id of the store that made each.
    static LINKS: RefCell<Vec<(u64, RedisLink)>> = const { RefCell::new(Vec::new()) };
}

/// Store ids: a store dropped and another made at its address must not find its links.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One store's links on the threads that called it.
pub struct ThreadLinks {
    id: u64,
}

impl Default for ThreadLinks {
    fn default() -> Self {
        ThreadLinks {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl ThreadLinks {
    /// Whether the calling thread should have a link of its own: it runs a single-threaded
    /// runtime, whose tasks (the link's driver among them) never leave it.
    pub fn wanted_here() -> bool {
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
    }

    /// The calling thread's link, made with `make` on its first call here.
    pub fn get_or_make<E>(
        &self,
        make: impl FnOnce() -> Result<RedisLink, E>,
    ) -> Result<RedisLink, E> {
        LINKS.with_borrow_mut(|links| {
            if let Some((_, link)) = links.iter().find(|(id, _)| *id == self.id) {
                return Ok(link.clone());
            }
            let link = make()?;
            links.push((self.id, link.clone()));
            Ok(link)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_base::infra::redis::config::RedisConfig;
    use std::cell::Cell;

    fn lazy_link() -> Result<RedisLink, redis::RedisError> {
        // Lazy: nothing connects to this port unless a command is sent.
        let config = RedisConfig {
            url: "redis://127.0.0.1:1/".into(),
            ..RedisConfig::default()
        };
        RedisLink::connect_lazy(&config)
    }

    #[tokio::test]
    async fn a_store_makes_one_link_a_thread_and_stores_do_not_share() {
        assert!(ThreadLinks::wanted_here(), "#[tokio::test] runs one thread");
        let made = Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            lazy_link()
        };
        let (a, b) = (ThreadLinks::default(), ThreadLinks::default());
        a.get_or_make(make).unwrap();
        a.get_or_make(make).unwrap();
        assert_eq!(made.get(), 1, "kept for the thread");
        b.get_or_make(make).unwrap();
        assert_eq!(made.get(), 2, "another store, another link");
        // Another thread (its own single-threaded runtime) makes its own.
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut here = 0;
                    a.get_or_make(|| {
                        here += 1;
                        lazy_link()
                    })
                    .unwrap();
                    assert_eq!(here, 1);
                });
            });
        });
        assert_eq!(made.get(), 2);
    }

    #[test]
    fn no_link_of_its_own_outside_a_single_threaded_runtime() {
        assert!(!ThreadLinks::wanted_here(), "no runtime");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert!(!rt.block_on(async { ThreadLinks::wanted_here() }));
    }
}
