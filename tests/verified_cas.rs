//! Stress tests of the two epoch-verified swaps of words: `VerifiedAtomic` (DRAM, a DCSS
//! against the clock) and `cas_<field>` on a payload (persistent, verified by the clock's
//! handshake). Threads
//! increment one counter by swaps while another thread moves the epoch clock as fast as it
//! can. Every successful swap records the value it wrote and its operation's epoch; then:
//!
//! * no value is lost or written twice: the successes wrote exactly `1..=n`, and the
//!   counter ends at `n`;
//! * no swap succeeded after the clock moved past its operation: in value order, the
//!   epochs never decrease (a swap of epoch `e` after one of `e + 1` would break this).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::sync::Mutex;

use common::{Counter, CounterFields, try_increment};
use montage::verified::{CasErrorKind, VerifiedAtomic};
use montage::{EpochLength, Heap, HeapConfig};
use montage_testkit::run_with_clock;

const WORKERS: usize = 3;
const SWAPS_PER_WORKER: usize = 3_000;
/// Workers keep going until the clock has moved at least this often.
const MIN_ADVANCES: u64 = 200;

fn heap() -> Heap {
    Heap::create(&HeapConfig::in_memory(8 << 20).epoch_length(EpochLength::Manual)).unwrap()
}

/// Runs `swap_once` (one attempt in one operation: `Ok(Some((epoch, written)))` on success,
/// `Ok(None)` to retry) on the workers while the clock is moved; returns every success.
fn race(
    heap: &Heap,
    swap_once: impl Fn() -> montage::Result<Option<(u64, u64)>> + Sync,
) -> Vec<(u64, u64)> {
    let successes = Mutex::new(Vec::new());
    let mut advances = 0u64;
    let tick = || {
        heap.advance_epoch().unwrap();
        advances += 1;
        // Epochs long enough for swaps to succeed in most of them, short enough for many
        // swaps to meet a boundary.
        std::thread::sleep(std::time::Duration::from_micros(20));
    };
    run_with_clock(WORKERS, tick, |_| {
        let mut mine = Vec::new();
        while mine.len() < SWAPS_PER_WORKER || heap.advances() < MIN_ADVANCES {
            if let Some(success) = swap_once().unwrap() {
                mine.push(success);
            }
        }
        successes.lock().unwrap().extend(mine);
    });
    assert!(advances >= MIN_ADVANCES);
    successes.into_inner().unwrap()
}

/// The two properties of the module docs.
fn check(mut successes: Vec<(u64, u64)>, last: u64) {
    successes.sort_by_key(|&(_, value)| value);
    let n = successes.len() as u64;
    assert_eq!(last, n, "the counter does not match the successful swaps");
    for (i, &(_, value)) in successes.iter().enumerate() {
        assert_eq!(value, i as u64 + 1, "a value was lost or written twice");
    }
    for pair in successes.windows(2) {
        assert!(
            pair[0].0 <= pair[1].0,
            "value {} was written in epoch {} after value {} in epoch {}",
            pair[1].1,
            pair[1].0,
            pair[0].1,
            pair[0].0
        );
    }
    let first = successes.first().unwrap().0;
    let last_epoch = successes.last().unwrap().0;
    assert!(last_epoch > first, "the clock never moved during the swaps");
}

#[test]
fn verified_atomic_loses_nothing_and_keeps_epoch_order() {
    let heap = heap();
    let word = VerifiedAtomic::new(0u64);
    let successes = race(&heap, || {
        let op = heap.begin_op()?;
        let current = word.load(&op);
        match word.compare_exchange(&op, current, current + 1) {
            Ok(previous) => {
                assert_eq!(previous, current);
                Ok(Some((op.epoch().get(), current + 1)))
            }
            Err(err) if err.kind == CasErrorKind::Mismatch => {
                assert_ne!(err.current, current);
                Ok(None)
            }
            Err(err) => {
                assert_eq!(err.kind, CasErrorKind::EpochAdvanced);
                assert!(heap.epoch() > op.epoch());
                Ok(None)
            }
        }
    });
    let last = heap.run_op(|op| Ok(word.load(op))).unwrap();
    check(successes, last);
}

#[test]
fn payload_cas_loses_nothing_and_keeps_epoch_order() {
    let heap = heap();
    let owner = heap.register("counter").unwrap();
    // The structure's synchronization for copy-on-write: the current handle, replaced
    // under its lock when the payload must move into a newer epoch.
    let current = Mutex::new(
        heap.run_op(|op| op.alloc_payload(owner, &Counter { id: 0, value: 0 }))
            .unwrap(),
    );
    let successes = race(&heap, || try_increment(&heap, &current));
    let handle = *current.lock().unwrap();
    let last = heap.run_op(|op| handle.get_value(op)).unwrap();
    check(successes, last);
}
