//! `Queue`: semantics against `VecDeque`, reopening, a linearizability check of concurrent
//! histories, and recovery of a million elements.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use montage_collections::Queue;
use montage_core::sim::SimMode;
use montage_core::{Error, Heap, HeapConfig};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `VecDeque` returns, across epochs, and a reopened heap
    /// holds the same elements in the same order.
    #[test]
    fn behaves_like_vecdeque_and_survives_a_reopen(steps in proptest::collection::vec(0u8..4, 1..150)) {
        common::check_queue_against_vecdeque(common::open_queue, &steps)?;
    }
}

#[test]
fn front_shows_the_next_element_without_removing_it() {
    let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
    let queue: Queue<String> = Queue::open(&heap, "q").unwrap();
    assert_eq!(queue.front().unwrap(), None);
    queue.push_back("a".to_owned()).unwrap();
    queue.push_back("b".to_owned()).unwrap();
    assert_eq!(queue.front().unwrap().as_deref(), Some("a"));
    assert_eq!(queue.len(), 2);
    assert_eq!(queue.pop_front().unwrap().as_deref(), Some("a"));
    assert_eq!(queue.front().unwrap().as_deref(), Some("b"));
}

#[test]
fn reopening_with_another_element_type_is_a_layout_mismatch() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    Queue::<u64>::open(&heap, "q")
        .unwrap()
        .push_back(3)
        .unwrap();
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let err = Queue::<Vec<u8>>::open(&heap, "q").unwrap_err();
    assert!(matches!(err, Error::LayoutMismatch { .. }), "{err:?}");
}

#[test]
fn concurrent_histories_are_linearizable() {
    common::check_queue_linearizability(common::open_queue);
}

#[test]
fn a_million_elements_are_recovered_in_order() {
    common::check_queue_million(common::open_queue);
}

#[test]
fn threads_pushing_and_popping_lose_and_repeat_nothing() {
    common::check_queue_stress(common::open_queue);
}

/// A queue whose elements come and go within one epoch reuses its own blocks.
#[test]
fn elements_pushed_and_popped_in_one_epoch_reuse_their_blocks() {
    common::check_queue_reuse_in_one_epoch(|heap| {
        montage_collections::Queue::<Vec<u8>>::open(heap, "q").unwrap()
    });
}
