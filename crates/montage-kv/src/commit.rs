//! Group commit: connections that must not reply before their writes are durable wait here,
//! and a commit thread runs [`Heap::sync`] for all of them at once.
//!
//! A waiter takes a ticket, the number of the next round to start. A round starts by
//! taking every ticket issued so far, then runs one `sync`; a `sync` covers every operation
//! that ended before it was called, so it covers the writes of every waiter whose ticket
//! was issued before the round began (each waiter's writes ended before it asked). Waiters
//! that arrive while a round runs get the next round's ticket. A later round covers
//! everything an earlier one does, so a waiter is released by the first round numbered at
//! least its ticket to finish.
//!
//! Rounds overlap: with two commit threads, a round can start while the previous one is
//! still advancing the clock. A `sync` needs the clock two epochs past its call; called
//! during the previous round's second advance, it needs only one advance more, so under
//! steady load a round costs about one advance instead of two (on the journal an advance
//! only appends a record and the round ends in one `fdatasync`, shared with the other
//! thread's round if they overlap).
//!
//! The threads are plain threads, not async tasks: `sync` blocks (it writes back and
//! fences), and it must not hold up the runtime's workers, which keep serving reads and
//! other connections' writes meanwhile.
//!
//! Waking a task from another thread costs its event loop a system call (tokio writes to
//! the loop's eventfd). So a commit thread wakes at most one task per event loop: the
//! loop's [relay](Committer::relay), which passes the finished round on to the waiters of
//! its loop from within the loop, where a wake-up is a push onto the loop's own queue. A
//! waiter wakes a commit thread only when one sleeps, and no round is owed yet.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

#[cfg(doc)]
use montage_core::Heap;
use tokio::sync::watch;

/// What the waiters see: the highest round that finished, and whether any round failed.
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
    /// Commit threads asleep, waiting for a round to be owed.
    idle: usize,
    stop: bool,
}

#[derive(Debug)]
struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    done: watch::Sender<Done>,
    /// Rounds finished (a statistic).
    rounds: AtomicU64,
}

/// Commit threads: two, so that a round can start while the previous one finishes.
pub const COMMIT_THREADS: usize = 2;

/// The write-back of a `sync` failed: the writes were not made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the heap could not be synced; writes since the last sync are not durable")]
pub struct SyncFailed;

/// Rounds finished, as a group of waiters watches them: straight from the commit threads
/// ([`Committer::finished`]) or through a relay ([`Committer::relay`]).
#[derive(Debug, Clone)]
pub struct Finished(watch::Receiver<Done>);

/// The group-commit threads and their queue (module docs).
#[derive(Debug)]
pub struct Committer {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl Committer {
    /// Starts [`COMMIT_THREADS`] threads; each round calls `sync` (the heap's
    /// [`Heap::sync`], which may run on several threads at once).
    ///
    /// # Errors
    ///
    /// A thread could not be spawned.
    pub fn start(
        sync: impl Fn() -> montage_core::Result<()> + Send + Sync + 'static,
    ) -> std::io::Result<Committer> {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            wake: Condvar::new(),
            done: watch::channel(Done::default()).0,
            rounds: AtomicU64::new(0),
        });
        let sync = Arc::new(sync);
        let mut committer = Committer {
            inner,
            threads: Vec::with_capacity(COMMIT_THREADS),
        };
        for i in 0..COMMIT_THREADS {
            let inner = Arc::clone(&committer.inner);
            let sync = Arc::clone(&sync);
            let thread = std::thread::Builder::new()
                .name(format!("montage-kv-commit-{i}"))
                .spawn(move || run(&inner, &*sync))?;
            committer.threads.push(thread);
        }
        Ok(committer)
    }

    /// Returns once every write that ended before the call is durable.
    ///
    /// # Errors
    ///
    /// [`SyncFailed`] if the round that covers the call failed, or the committer stopped.
    pub async fn wait(&self) -> Result<(), SyncFailed> {
        self.wait_with(&mut self.finished()).await
    }

    /// [`wait`](Self::wait), hearing of finished rounds from `finished`: the waiter's event
    /// loop's relay, or [`finished`](Self::finished).
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait); also if `finished` is a relay that stopped.
    pub async fn wait_with(&self, finished: &mut Finished) -> Result<(), SyncFailed> {
        let (ticket, wake) = {
            let mut queue = lock(&self.inner.queue);
            if queue.stop {
                return Err(SyncFailed);
            }
            // A commit thread awake, or one already woken for an owed round, takes this
            // round once it looks at the queue again.
            let wake = !queue.owed && queue.idle > 0;
            queue.owed = true;
            (queue.next, wake)
        };
        if wake {
            self.inner.wake.notify_one();
        }
        let seen = finished
            .0
            .wait_for(|d| d.failed || d.round >= ticket)
            .await
            .map_err(|_| SyncFailed)?;
        if seen.failed { Err(SyncFailed) } else { Ok(()) }
    }

    /// Finished rounds, straight from the commit threads: a commit thread wakes each waiter
    /// that watches them itself.
    pub fn finished(&self) -> Finished {
        Finished(self.inner.done.subscribe())
    }

    /// A relay for the waiters of one event loop: what they watch, and the task to run on
    /// that loop. Only the task is woken by the commit threads; it then passes each finished
    /// round on to the waiters from within the loop (module docs). It ends when the
    /// committer is dropped, failing the waiters still there.
    pub fn relay(&self) -> (Finished, impl Future<Output = ()> + Send + 'static) {
        let mut from = self.inner.done.subscribe();
        let (to, watched) = watch::channel(*from.borrow_and_update());
        let relay = async move {
            while from.changed().await.is_ok() {
                let done = *from.borrow_and_update();
                to.send_replace(done);
            }
            // No round will finish any more.
            to.send_modify(|d| d.failed = true);
        };
        (Finished(watched), relay)
    }

    /// Rounds finished so far.
    pub fn rounds(&self) -> u64 {
        // ORDERING: a statistic.
        self.inner.rounds.load(Ordering::Relaxed)
    }

    /// Stops the threads after the rounds they are running (if any) and an owed one;
    /// waiters that arrive afterwards fail. Called by drop.
    pub fn stop(&mut self) {
        lock(&self.inner.queue).stop = true;
        self.inner.wake.notify_all();
        for thread in self.threads.drain(..) {
            // `run` catches a panicking `sync`; a join error would be a bug of its own.
            let _ = thread.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(inner: &Inner, sync: &dyn Fn() -> montage_core::Result<()>) {
    loop {
        let round = {
            let mut queue = lock(&inner.queue);
            while !queue.owed && !queue.stop {
                queue.idle += 1;
                queue = inner
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                queue.idle -= 1;
            }
            if !queue.owed {
                return;
            }
            queue.owed = false;
            queue.next += 1;
            queue.next - 1
        };
        // A panic counts as a failure: its waiters must hear of it, not wait forever.
        let failed = match std::panic::catch_unwind(AssertUnwindSafe(sync)) {
            Ok(Ok(())) => false,
            Ok(Err(e)) => {
                eprintln!("montage-kv: sync failed, writes are no longer acknowledged: {e}");
                true
            }
            Err(_) => {
                eprintln!("montage-kv: sync panicked, writes are no longer acknowledged");
                true
            }
        };
        // ORDERING: a statistic.
        inner.rounds.fetch_add(1, Ordering::Relaxed);
        inner.done.send_modify(|d| {
            // Rounds may finish out of order; a later round covers an earlier one's waiters.
            d.round = d.round.max(round);
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
    use montage_core::sim::SimMode;
    use montage_core::{EpochLength, Heap, HeapConfig};
    use std::time::Duration;

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
        let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
        let syncing = Arc::clone(&heap);
        let committer = Committer::start(move || syncing.sync()).unwrap();
        let runtime = runtime();
        for i in 0..8 {
            map.insert(i, i * 10).unwrap();
            runtime.block_on(committer.wait()).unwrap();
            // Any crash the simulator can make from here keeps every acknowledged write.
            let image = heap.simulator().unwrap().crash(i);
            let recovered = Heap::open_image(image, &config).unwrap();
            let map: HashMap<u64, u64> = HashMap::open(&recovered, "m").unwrap();
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
    fn a_panicking_sync_fails_its_waiters() {
        let committer = Committer::start(|| panic!("a test")).unwrap();
        assert_eq!(runtime().block_on(committer.wait()), Err(SyncFailed));
    }

    #[test]
    fn a_later_round_releases_the_waiters_of_an_earlier_one() {
        // The first round's sync is slow; the second, started while the first runs,
        // finishes first and releases both rounds' waiters (its sync covers both).
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let committer = Arc::new(
            Committer::start(move || {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
                Ok(())
            })
            .unwrap(),
        );
        let runtime = runtime();
        let started = std::time::Instant::now();
        runtime.block_on(async {
            let first = {
                let committer = Arc::clone(&committer);
                tokio::spawn(async move { committer.wait().await })
            };
            // Let the first round start before the second waiter arrives.
            while calls.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            committer.wait().await.unwrap();
            first.await.unwrap().unwrap();
        });
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "the first waiter waited for its own slow round"
        );
    }

    #[test]
    fn waiters_on_a_relay_hear_of_their_rounds_and_fail_once_it_ends() {
        let committer = Committer::start(|| Ok(())).unwrap();
        let (finished, relay) = committer.relay();
        // One event loop, as a server's worker: the relay and its waiters on one thread.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let relay = runtime.spawn(relay);
        let waited = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                for _ in 0..16 {
                    committer.wait_with(&mut finished.clone()).await.unwrap();
                }
            })
            .await
        });
        assert!(waited.is_ok(), "a waiter never heard of its round");
        let rounds = committer.rounds();
        assert!((1..=16).contains(&rounds), "{rounds} rounds");
        // The committer goes: the relay ends, and a waiter on it fails instead of waiting
        // for a round that will never come.
        drop(committer);
        runtime.block_on(relay).unwrap();
        let mut finished = finished;
        let waited = runtime.block_on(finished.0.wait_for(|d| d.failed));
        assert!(waited.is_ok_and(|d| d.failed));
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
