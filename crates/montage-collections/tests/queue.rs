//! `Queue`: semantics against `VecDeque`, reopening, a linearizability check of concurrent
//! histories, and recovery of a million elements.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::VecDeque;

use common::{Fifo, QueueOp, linearizable};
use montage_collections::Queue;
use montage_core::{EpochLength, Error, Heap, HeapConfig, SimMode};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `VecDeque` returns, across epochs, and a reopened heap
    /// holds the same elements in the same order.
    #[test]
    fn behaves_like_vecdeque_and_survives_a_reopen(steps in proptest::collection::vec(0u8..4, 1..150)) {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::create(&config).unwrap();
        let queue: Queue<'_, String> = Queue::open(&heap, "q").unwrap();
        let mut model = VecDeque::new();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                0 | 1 => {
                    let value = format!("element {i}");
                    queue.push_back(value.clone()).unwrap();
                    model.push_back(value);
                }
                2 => prop_assert_eq!(queue.pop_front().unwrap(), model.pop_front()),
                _ => {
                    prop_assert_eq!(queue.front().unwrap(), model.front().cloned());
                    heap.advance_epoch().unwrap();
                }
            }
            prop_assert_eq!(queue.len(), model.len());
        }
        prop_assert_eq!(queue.to_vec().unwrap(), model.iter().cloned().collect::<Vec<_>>());
        drop(queue);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(5);
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let queue: Queue<'_, String> = Queue::open(&heap, "q").unwrap();
        prop_assert_eq!(queue.to_vec().unwrap(), model.into_iter().collect::<Vec<_>>());
        // New elements go after the recovered ones.
        queue.push_back("after".to_owned()).unwrap();
        prop_assert_eq!(queue.to_vec().unwrap().pop(), Some("after".to_owned()));
    }
}

#[test]
fn reopening_with_another_element_type_is_a_layout_mismatch() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    Queue::<'_, u64>::open(&heap, "q")
        .unwrap()
        .push_back(3)
        .unwrap();
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let err = Queue::<'_, Vec<u8>>::open(&heap, "q").unwrap_err();
    assert!(matches!(err, Error::LayoutMismatch { .. }), "{err:?}");
}

/// Threads push and pop while the clock advances; the whole history must have a
/// linearization (histories are kept short enough for the exhaustive search).
#[test]
fn concurrent_histories_are_linearizable() {
    for round in 0..30u64 {
        let heap = Heap::create(&HeapConfig::in_memory(4 << 20).epoch_length(EpochLength::Manual))
            .unwrap();
        let queue: Queue<'_, u64> = Queue::open(&heap, "q").unwrap();
        let history = common::record_history(
            &heap,
            round,
            3,
            30,
            |rng, t, i| {
                if rng.next_u64().is_multiple_of(2) {
                    QueueOp::Push((t << 32) | i)
                } else {
                    QueueOp::Pop
                }
            },
            |op| {
                match op {
                    QueueOp::Push(v) => queue.push_back(*v).map(|()| None),
                    QueueOp::Pop => queue.pop_front(),
                }
                .unwrap()
            },
        );
        assert!(
            linearizable::<Fifo>(&VecDeque::new(), &history),
            "round {round}: no linearization of {history:?}"
        );
    }
}

/// One million elements: pushed, synced, closed, reopened from the file, and every one
/// checked in order.
#[test]
fn a_million_elements_are_recovered_in_order() {
    const N: u64 = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("heap")).size(256 << 20);
    let heap = Heap::create(&config).unwrap();
    let queue: Queue<'_, u64> = Queue::open(&heap, "big").unwrap();
    for i in 0..N {
        queue.push_back(i ^ 0x5555).unwrap();
    }
    drop(queue);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let queue: Queue<'_, u64> = Queue::open(&heap, "big").unwrap();
    assert_eq!(queue.len() as u64, N);
    let all = queue.to_vec().unwrap();
    for (i, value) in all.into_iter().enumerate() {
        assert_eq!(value, i as u64 ^ 0x5555, "element {i}");
    }
    assert_eq!(queue.pop_front().unwrap(), Some(0x5555));
}
