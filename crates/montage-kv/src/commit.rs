//! Group commit: connections that must not reply before their writes are durable wait here,
//! and one thread runs [`Heap::sync`] for all of them at once.
//!
//! A waiter takes a ticket, the number of the next round to start. A round starts by
//! taking every ticket issued so far, then runs one `sync`; a `sync` covers every operation
//! that ended before it was called, so it covers the writes of every waiter whose ticket
//! was issued before the round began (each waiter's writes ended before it asked). Waiters
//! that arrive while a round runs get the next round's ticket. However many connections are
//! waiting, at most one `sync` is running and at most one more is owed.
//!
//! The thread is a plain thread, not an async task: `sync` blocks (it writes back and
//! fences), and it must not hold up the runtime's workers, which keep serving reads and
//! other connections' writes meanwhile.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

#[cfg(doc)]
use montage_core::Heap;
use tokio::sync::watch;

/// What the waiters see: the last round that finished, and whether any round failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Done {
    round: u64,
    /// A `sync` failed: the heap's clock has stopped and no later write can be made
    /// durable, so every waiter from then on fails too.
    failed: bool,
}

#[derive(Debug, Default)]
struct Queue {
    /// The ticket the next waiter gets: the number of the next round to start.
    next: u64,
    /// A waiter holds ticket `next`.
    owed: bool,
    stop: bool,
}

#[derive(Debug)]
struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    done: watch::Sender<Done>,
}

/// The write-back of a `sync` failed: the writes were not made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the heap could not be synced; writes since the last sync are not durable")]
pub struct SyncFailed;

/// The group-commit thread and its queue (module docs).
#[derive(Debug)]
pub struct Committer {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// Starts the thread; each round calls `sync` (the heap's [`Heap::sync`]).
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn start(
        sync: impl Fn() -> montage_core::Result<()> + Send + 'static,
    ) -> std::io::Result<Committer> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            wake: Condvar::new(),
            done: watch::channel(Done::default()).0,
        });
        let for_thread = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("montage-kv-commit".to_owned())
            .spawn(move || run(&for_thread, &sync))?;
        Ok(Committer {
            inner,
            thread: Some(thread),
        })
    }

    /// Returns once every write that ended before the call is durable.
    ///
    /// # Errors
    ///
    /// [`SyncFailed`] if the round that covers the call failed, or the committer stopped.
    pub async fn wait(&self) -> Result<(), SyncFailed> {
        let mut done = self.inner.done.subscribe();
        let ticket = {
            let mut queue = lock(&self.inner.queue);
            if queue.stop {
                return Err(SyncFailed);
            }
            queue.owed = true;
            queue.next
        };
        self.inner.wake.notify_one();
        let seen = done
            .wait_for(|d| d.failed || d.round >= ticket)
            .await
            .map_err(|_| SyncFailed)?;
        if seen.failed { Err(SyncFailed) } else { Ok(()) }
    }

    /// Rounds run so far.
    pub fn rounds(&self) -> u64 {
        self.inner.done.borrow().round
    }

    /// Stops the thread after the round it is running (if any) and an owed one; waiters
    /// that arrive afterwards fail. Called by drop.
    pub fn stop(&mut self) {
        lock(&self.inner.queue).stop = true;
        self.inner.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A panic in the thread has already failed its waiters (the sender dropped).
            let _ = thread.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(inner: &Inner, sync: &impl Fn() -> montage_core::Result<()>) {
    loop {
        let round = {
            let mut queue = lock(&inner.queue);
            while !queue.owed && !queue.stop {
                queue = inner
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if !queue.owed {
                return;
            }
            queue.owed = false;
            queue.next += 1;
            queue.next - 1
        };
        let failed = match sync() {
            Ok(()) => false,
            Err(e) => {
                eprintln!("montage-kv: sync failed, writes are no longer acknowledged: {e}");
                true
            }
        };
        inner.done.send_modify(|d| {
            d.round = round;
            d.failed |= failed;
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use montage_collections::HashMap;
    use montage_core::{EpochLength, Heap, HeapConfig, SimMode};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap()
    }

    #[test]
    fn a_write_is_durable_when_its_wait_returns() {
        // No background clock: only the committer's syncs make anything durable.
        let config =
            HeapConfig::simulated(4 << 20, SimMode::Prefix).epoch_length(EpochLength::Manual);
        let heap = Arc::new(Heap::create(&config).unwrap());
        let map: HashMap<'_, u64, u64> = HashMap::open(&heap, "m").unwrap();
        let syncing = Arc::clone(&heap);
        let committer = Committer::start(move || syncing.sync()).unwrap();
        let runtime = runtime();
        for i in 0..8 {
            map.insert(i, i * 10).unwrap();
            runtime.block_on(committer.wait()).unwrap();
            // Any crash the simulator can make from here keeps every acknowledged write.
            let image = heap.simulator().unwrap().crash(i);
            let recovered = Heap::open_image(image, &config).unwrap();
            let map: HashMap<'_, u64, u64> = HashMap::open(&recovered, "m").unwrap();
            for j in 0..=i {
                assert_eq!(map.get(&j).unwrap(), Some(j * 10), "key {j} after wait {i}");
            }
        }
    }

    #[test]
    fn concurrent_waiters_all_return_and_rounds_are_owed_ones() {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Arc::new(Heap::create(&config).unwrap());
        let syncing = Arc::clone(&heap);
        let committer = Arc::new(Committer::start(move || syncing.sync()).unwrap());
        let waits = 64;
        runtime().block_on(async {
            let tasks: Vec<_> = (0..waits)
                .map(|_| {
                    let committer = Arc::clone(&committer);
                    tokio::spawn(async move { committer.wait().await })
                })
                .collect();
            for task in tasks {
                task.await.unwrap().unwrap();
            }
        });
        let rounds = committer.rounds();
        assert!((1..=waits).contains(&rounds), "{rounds} rounds");
    }

    #[test]
    fn a_failed_sync_fails_its_waiters_and_every_later_one() {
        let committer =
            Committer::start(|| Err(montage_core::Error::ClockStopped { reason: "a test" }))
                .unwrap();
        let runtime = runtime();
        assert_eq!(runtime.block_on(committer.wait()), Err(SyncFailed));
        assert_eq!(runtime.block_on(committer.wait()), Err(SyncFailed));
    }

    #[test]
    fn waiters_after_stop_fail() {
        let mut committer = Committer::start(|| Ok(())).unwrap();
        let runtime = runtime();
        runtime.block_on(committer.wait()).unwrap();
        committer.stop();
        assert_eq!(runtime.block_on(committer.wait()), Err(SyncFailed));
    }
}
