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

use crossbeam_utils::CachePadded;

use crate::primitive::{AtomicU32, AtomicU64, Ordering, fence, yield_now};

/// The clock and the running-operation counters.
#[derive(Debug)]
pub(crate) struct Tracker {
    current: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<[AtomicU32; 4]>]>,
}

impl Tracker {
    pub(crate) fn new(epoch: u64, slots: usize) -> Tracker {
        Tracker {
            current: CachePadded::new(AtomicU64::new(epoch)),
            slots: (0..slots.max(1))
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU32::new(0))))
                .collect(),
        }
    }

    /// The epoch new operations join.
    pub(crate) fn current(&self) -> u64 {
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.current.load(Ordering::SeqCst)
    }

    fn counter(&self, slot: usize, epoch: u64) -> &AtomicU32 {
        &self.slots[slot % self.slots.len()][(epoch % 4) as usize]
    }

    /// Announces an operation in `slot`; returns the epoch it runs in.
    pub(crate) fn announce(&self, slot: usize) -> u64 {
        loop {
            let epoch = self.current();
            // ORDERING: SeqCst, part of the handshake (module docs).
            self.counter(slot, epoch).fetch_add(1, Ordering::SeqCst);
            // ORDERING: the store-load half of the handshake (a Dekker pattern): the fence
            // orders the increment before the re-read even for models, like loom's, that
            // treat SeqCst accesses as acquire/release. On x86 it costs one `mfence` beside
            // the locked add.
            fence(Ordering::SeqCst);
            if self.current() == epoch {
                return epoch;
            }
            // ORDERING: withdrawing our own increment; an advancer that saw it waits a little
            // longer, which is harmless.
            self.counter(slot, epoch).fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Withdraws an operation of `epoch` from `slot`.
    pub(crate) fn leave(&self, slot: usize, epoch: u64) {
        // ORDERING: Release: what the operation handed to the advancer before leaving
        // happens-before the advancer's SeqCst (hence Acquire) read of a drained counter.
        self.counter(slot, epoch).fetch_sub(1, Ordering::Release);
    }

    /// Makes `epoch` the clock's value.
    pub(crate) fn publish(&self, epoch: u64) {
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.current.store(epoch, Ordering::SeqCst);
        // ORDERING: the other store-load half: the publish is ordered before every later
        // check of the counters (see `announce`).
        fence(Ordering::SeqCst);
    }

    /// Whether no operation of `epoch` is running, in one pass over the slots.
    pub(crate) fn is_quiescent(&self, epoch: u64) -> bool {
        let index = (epoch % 4) as usize;
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.slots
            .iter()
            .all(|slot| slot[index].load(Ordering::SeqCst) == 0)
    }

    /// Waits until no operation of `epoch` is running.
    pub(crate) fn wait_quiescent(&self, epoch: u64) {
        let mut spins = 0u32;
        while !self.is_quiescent(epoch) {
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 1024 {
                yield_now();
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
            let tracker = Arc::new(Tracker::new(1, 1));
            // The epoch the operation is running in, 0 when none.
            let running_in = Arc::new(Flag::new(0));
            let op = {
                let (tracker, running_in) = (tracker.clone(), running_in.clone());
                loom::thread::spawn(move || {
                    let epoch = tracker.announce(0);
                    running_in.store(epoch, Ordering::SeqCst);
                    running_in.store(0, Ordering::SeqCst);
                    tracker.leave(0, epoch);
                })
            };
            tracker.publish(2);
            if tracker.is_quiescent(1) {
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
            let tracker = Arc::new(Tracker::new(1, 2));
            let running: Arc<[Flag; 2]> = Arc::new([Flag::new(0), Flag::new(0)]);
            let ops: Vec<_> = (0..2)
                .map(|slot| {
                    let (tracker, running) = (tracker.clone(), running.clone());
                    loom::thread::spawn(move || {
                        let epoch = tracker.announce(slot);
                        running[slot].store(epoch, Ordering::SeqCst);
                        running[slot].store(0, Ordering::SeqCst);
                        tracker.leave(slot, epoch);
                    })
                })
                .collect();
            for next in [2u64, 3] {
                tracker.publish(next);
                if tracker.is_quiescent(next - 1) {
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
}
