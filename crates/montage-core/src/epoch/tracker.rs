//! The announcement handshake between operations and the advancer (INV-EP-1): the clock,
//! and per thread slot four counters of running operations indexed by epoch mod 4.
//!
//! An operation reads the clock `e`, increments counter `e % 4` of its slot, and re-reads
//! the clock; if it moved, it undoes the increment and tries again. The advancer publishes
//! `e + 1` before it ever checks counter `e % 4` (at the next advance). All four steps are
//! sequentially consistent, so in their single total order either the increment comes
//! before the advancer's check (which then sees it and waits) or after it, in which case
//! the re-read comes after the publish and sees `e + 1`: no operation runs in an epoch the
//! advancer has found quiescent. Four counters suffice because only epochs `e - 1` and `e`
//! can have running operations while the clock reads `e`.
//!
//! The same pattern makes epoch-verified writes possible (INV-EP-4): a thread about to make
//! a write that must land in epoch `e` increments its slot's `verifying` counter and then
//! reads `closing`, the last epoch the advancer has begun to close; the advancer stores
//! `closing = e` and then waits for every `verifying` counter to drain before it publishes
//! `e + 1`. Either the writer sees `closing >= e` and gives up, or the advancer sees its
//! increment and waits for the write to finish: a verified write of epoch `e` happens before
//! any operation of `e + 1` begins.

use crossbeam_utils::CachePadded;

use crate::base::epoch::Epoch;
use crate::primitive::{
    AtomicBool, AtomicU32, AtomicU64, Ordering, after_seqcst_rmw, fence, yield_now,
};
use crate::thread_id::index_in;

/// The clock and the running-operation counters.
#[derive(Debug)]
pub(crate) struct Tracker {
    current: CachePadded<AtomicU64>,
    /// The newest epoch the advancer has begun to close: verified writes of it or older fail.
    closing: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<SlotCounters>]>,
    /// Set once, when the heap closes: no operation begins after it (see [`close`]).
    ///
    /// [`close`]: Tracker::close_heap
    heap_closed: AtomicBool,
}

/// One thread slot's counters.
#[derive(Debug)]
struct SlotCounters {
    /// Running operations, by epoch mod 4.
    running: [AtomicU32; 4],
    /// Verified writes in progress.
    verifying: AtomicU32,
}

impl Tracker {
    pub(crate) fn new(epoch: Epoch, slots: usize) -> Tracker {
        Tracker {
            current: CachePadded::new(AtomicU64::new(epoch.get())),
            closing: CachePadded::new(AtomicU64::new(epoch.minus(1).get())),
            slots: (0..slots.max(1))
                .map(|_| {
                    CachePadded::new(SlotCounters {
                        running: std::array::from_fn(|_| AtomicU32::new(0)),
                        verifying: AtomicU32::new(0),
                    })
                })
                .collect(),
            heap_closed: AtomicBool::new(false),
        }
    }

    /// The epoch new operations join.
    pub(crate) fn current(&self) -> Epoch {
        // ORDERING: SeqCst, part of the handshake (module docs).
        Epoch::new(self.current.load(Ordering::SeqCst))
    }

    fn counter(&self, slot: usize, epoch: Epoch) -> &AtomicU32 {
        &self.slots[index_in(slot, self.slots.len())].running[epoch.slot4()]
    }

    /// Announces an operation in `slot`; returns the epoch it runs in, or `None` once the
    /// tracker is [closed](Self::close_heap).
    pub(crate) fn announce(&self, slot: usize) -> Option<Epoch> {
        loop {
            let epoch = self.current();
            // ORDERING: SeqCst, part of the handshake (module docs).
            self.counter(slot, epoch).fetch_add(1, Ordering::SeqCst);
            // ORDERING: the store-load half of the handshake (a Dekker pattern): the SeqCst
            // increment precedes the SeqCst re-read in the single total order; loom needs a
            // fence to see that (see `after_seqcst_rmw`).
            after_seqcst_rmw();
            // ORDERING: SeqCst, the operation's half of the closing handshake (see `close_heap`):
            // read after the increment, so either `close_heap` sees the increment or this sees
            // the flag.
            if self.heap_closed.load(Ordering::SeqCst) {
                // ORDERING: Release, as in `leave`; this operation never ran.
                self.counter(slot, epoch).fetch_sub(1, Ordering::Release);
                return None;
            }
            if self.current() == epoch {
                return Some(epoch);
            }
            // ORDERING: withdrawing our own increment; an advancer that saw it waits a little
            // longer, which is harmless.
            self.counter(slot, epoch).fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Refuses every later [`announce`](Self::announce) and waits until the operations
    /// already announced have left. Returns `false` (and waits for nothing) if the tracker
    /// was closed already.
    ///
    /// The same store-load handshake as between `announce` and the advancer: the flag is
    /// stored before the counters are read, and an operation's increment before its read of
    /// the flag, so an operation that did not see the flag is counted here and waited for.
    pub(crate) fn close_heap(&self) -> bool {
        // ORDERING: SeqCst, the closer's half of the handshake.
        if self.heap_closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        // ORDERING: store-load: the flag is ordered before the reads of the counters.
        fence(Ordering::SeqCst);
        // No operation can begin now, so each counter only drains (a refused announce's
        // increment is withdrawn at once).
        for epoch in 0..4 {
            self.wait_quiescent(Epoch::new(epoch));
        }
        true
    }

    /// Whether [`close_heap`](Self::close_heap) has been called.
    pub(crate) fn is_heap_closed(&self) -> bool {
        // ORDERING: Acquire: a caller that sees the flag sees what the closer did before it.
        self.heap_closed.load(Ordering::Acquire)
    }

    /// Withdraws an operation of `epoch` from `slot`.
    pub(crate) fn leave(&self, slot: usize, epoch: Epoch) {
        // ORDERING: Release: what the operation handed to the advancer before leaving
        // happens-before the advancer's SeqCst (hence Acquire) read of a drained counter.
        self.counter(slot, epoch).fetch_sub(1, Ordering::Release);
    }

    /// Runs `f` if no advance past `epoch` has begun, holding the next publish back until
    /// `f` returns (module docs); `None` if the advancer has begun to close `epoch`.
    pub(crate) fn verify<R>(&self, slot: usize, epoch: Epoch, f: impl FnOnce() -> R) -> Option<R> {
        /// Withdraws the increment even if `f` unwinds, so that the advancer is never stuck.
        struct Leave<'a>(&'a AtomicU32);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                // ORDERING: Release: the verified write happens-before the advancer's
                // SeqCst read of the drained counter, and so before the publish.
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        let counter = &self.slots[index_in(slot, self.slots.len())].verifying;
        // ORDERING: SeqCst, the writer's half of the handshake (module docs).
        counter.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(counter);
        // ORDERING: store-load: the SeqCst increment is ordered before the SeqCst read of
        // `closing`, as in `announce`.
        after_seqcst_rmw();
        // ORDERING: SeqCst, part of the handshake (module docs).
        if self.closing.load(Ordering::SeqCst) >= epoch.get() {
            return None;
        }
        Some(f())
    }

    /// Makes `epoch` the clock's value, after every verified write of the epoch it closes
    /// has finished (module docs).
    pub(crate) fn publish(&self, epoch: Epoch) {
        // ORDERING: SeqCst, the advancer's half of the verified-write handshake.
        self.closing.store(epoch.minus(1).get(), Ordering::SeqCst);
        // ORDERING: store-load: `closing` is ordered before the reads of the counters.
        fence(Ordering::SeqCst);
        let mut spins = 0u32;
        // ORDERING: SeqCst, part of the handshake; pairs with the Release in `verify`.
        while self
            .slots
            .iter()
            .any(|slot| slot.verifying.load(Ordering::SeqCst) != 0)
        {
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                yield_now();
            }
        }
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.current.store(epoch.get(), Ordering::SeqCst);
        // ORDERING: the other store-load half: the publish is ordered before every later
        // check of the counters (see `announce`).
        fence(Ordering::SeqCst);
    }

    /// Whether no operation of `epoch` is running, in one pass over the slots.
    pub(crate) fn is_quiescent(&self, epoch: Epoch) -> bool {
        let index = epoch.slot4();
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.slots
            .iter()
            .all(|slot| slot.running[index].load(Ordering::SeqCst) == 0)
    }

    /// Waits until no operation of `epoch` is running.
    pub(crate) fn wait_quiescent(&self, epoch: Epoch) {
        let mut spins = 0u32;
        while !self.is_quiescent(epoch) {
            spins = spins.saturating_add(1);
            if cfg!(montage_loom) || (64..1024).contains(&spins) {
                // Under loom, every wait is a scheduling point.
                yield_now();
            } else if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

#[cfg(all(test, montage_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64 as Flag;

    /// An operation announces while the advancer publishes the next epoch and checks the old
    /// one: if the advancer finds epoch 1 quiescent, the operation is not running in it.
    #[test]
    fn an_epoch_found_quiescent_has_no_running_operation() {
        loom::model(|| {
            let tracker = Arc::new(Tracker::new(Epoch::new(1), 1));
            // The epoch the operation is running in, 0 when none.
            let running_in = Arc::new(Flag::new(0));
            let op = {
                let (tracker, running_in) = (tracker.clone(), running_in.clone());
                loom::thread::spawn(move || {
                    let epoch = tracker.announce(0).unwrap();
                    running_in.store(epoch.get(), Ordering::SeqCst);
                    running_in.store(0, Ordering::SeqCst);
                    tracker.leave(0, epoch);
                })
            };
            tracker.publish(Epoch::new(2));
            if tracker.is_quiescent(Epoch::new(1)) {
                assert_ne!(running_in.load(Ordering::SeqCst), 1);
            }
            op.join().unwrap();
        });
    }

    /// Two operations in two slots and an advancer that moves the clock twice: whenever it
    /// finds an epoch quiescent, neither operation runs in it.
    #[test]
    fn two_slots_and_two_advances() {
        loom::model(|| {
            let tracker = Arc::new(Tracker::new(Epoch::new(1), 2));
            let running: Arc<[Flag; 2]> = Arc::new([Flag::new(0), Flag::new(0)]);
            let ops: Vec<_> = (0..2)
                .map(|slot| {
                    let (tracker, running) = (tracker.clone(), running.clone());
                    loom::thread::spawn(move || {
                        let epoch = tracker.announce(slot).unwrap();
                        running[slot].store(epoch.get(), Ordering::SeqCst);
                        running[slot].store(0, Ordering::SeqCst);
                        tracker.leave(slot, epoch);
                    })
                })
                .collect();
            for next in [2u64, 3] {
                tracker.publish(Epoch::new(next));
                if tracker.is_quiescent(Epoch::new(next - 1)) {
                    for flag in running.iter() {
                        assert_ne!(flag.load(Ordering::SeqCst), next - 1);
                    }
                }
            }
            for op in ops {
                op.join().unwrap();
            }
        });
    }

    /// A verified write of epoch 1 races with the publish of epoch 2: if it succeeded, it is
    /// visible to whoever reads after the publish returns (so to every operation of epoch
    /// 2); if the publish came first, it fails.
    #[test]
    fn a_verified_write_happens_before_the_next_epoch() {
        loom::model(|| {
            let tracker = Arc::new(Tracker::new(Epoch::new(1), 1));
            let word = Arc::new(Flag::new(0));
            let writer = {
                let (tracker, word) = (tracker.clone(), word.clone());
                loom::thread::spawn(move || {
                    tracker
                        .verify(0, Epoch::new(1), || word.store(1, Ordering::Relaxed))
                        .is_some()
                })
            };
            tracker.publish(Epoch::new(2));
            let seen = word.load(Ordering::Relaxed);
            let wrote = writer.join().unwrap();
            if wrote {
                assert_eq!(
                    seen, 1,
                    "a verified write of epoch 1 landed after epoch 2 began"
                );
            } else {
                assert_eq!(word.load(Ordering::Relaxed), 0);
            }
            // After the publish, nothing of epoch 1 is verified any more.
            assert!(tracker.verify(0, Epoch::new(1), || ()).is_none());
        });
    }

    /// An operation announces while the heap closes: when `close` returns, the operation was
    /// either refused or has left; it never runs after the closer goes on.
    #[test]
    fn no_operation_runs_after_close_returns() {
        loom::model(|| {
            let tracker = Arc::new(Tracker::new(Epoch::new(1), 1));
            // 1 while the operation runs.
            let running = Arc::new(Flag::new(0));
            let op = {
                let (tracker, running) = (tracker.clone(), running.clone());
                loom::thread::spawn(move || {
                    if let Some(epoch) = tracker.announce(0) {
                        running.store(1, Ordering::SeqCst);
                        running.store(0, Ordering::SeqCst);
                        tracker.leave(0, epoch);
                    }
                })
            };
            assert!(tracker.close_heap());
            assert_eq!(running.load(Ordering::SeqCst), 0);
            assert!(
                !tracker.close_heap(),
                "a second close reported it closed the tracker"
            );
            op.join().unwrap();
            assert!(tracker.announce(0).is_none());
        });
    }
}
