//! `NbQueue`: semantics against `VecDeque` across epochs and a crash-reopen, opening what
//! `Queue` wrote, a linearizability check of concurrent histories, and recovery of a
//! million elements.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use montage_collections::{NbQueue, Queue, together};
use montage_core::sim::SimMode;
use montage_core::{Heap, HeapConfig};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `VecDeque` returns, across epochs, and a reopened heap
    /// holds the same elements in the same order.
    #[test]
    fn behaves_like_vecdeque_and_survives_a_reopen(steps in proptest::collection::vec(0u8..4, 1..150)) {
        common::check_queue_against_vecdeque(common::open_nb_queue, &steps)?;
    }
}

/// Both queues, and a queue in a `together`, take borrowed forms (`&[u8]` for `Vec<u8>`,
/// `&str` for `String`) and owned ones alike; each reads what the other pushed after a
/// crash.
#[test]
fn borrowed_values_are_pushed_as_their_owned_forms() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let bytes: Queue<Vec<u8>> = Queue::open(&heap, "bytes").unwrap();
    let text: Queue<String> = Queue::open(&heap, "text").unwrap();
    bytes.push_back_ref(&b"queue, borrowed"[..]).unwrap();
    bytes.push_back(b"queue, owned".to_vec()).unwrap();
    text.push_back_ref("queue, borrowed").unwrap();
    together(&heap, |tx| tx.queue(&text, |q| q.push_back_ref("together"))).unwrap();
    drop((bytes, text));
    let heap = common::reopen_after_synced_crash(heap, &config);
    let bytes: NbQueue<Vec<u8>> = NbQueue::open(&heap, "bytes").unwrap();
    let text: NbQueue<String> = NbQueue::open(&heap, "text").unwrap();
    bytes.push_back_ref(&b"nb, borrowed"[..]).unwrap();
    text.push_back_ref(&"nb, owned".to_owned()).unwrap();
    text.push_back_ref("nb, borrowed").unwrap();
    drop((bytes, text));
    let heap = common::reopen_after_synced_crash(heap, &config);
    let bytes: Queue<Vec<u8>> = Queue::open(&heap, "bytes").unwrap();
    let text: Queue<String> = Queue::open(&heap, "text").unwrap();
    assert_eq!(
        bytes.to_vec().unwrap(),
        [&b"queue, borrowed"[..], b"queue, owned", b"nb, borrowed"].map(<[u8]>::to_vec)
    );
    assert_eq!(
        text.to_vec().unwrap(),
        ["queue, borrowed", "together", "nb, owned", "nb, borrowed"].map(str::to_owned)
    );
}

#[test]
fn either_queue_opens_what_the_other_wrote() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let queue: Queue<u64> = Queue::open(&heap, "q").unwrap();
    for i in 0..5 {
        queue.push_back(i).unwrap();
    }
    drop(queue);
    let heap = common::reopen_after_synced_crash(heap, &config);
    let queue: NbQueue<u64> = NbQueue::open(&heap, "q").unwrap();
    assert_eq!(queue.pop_front().unwrap(), Some(0));
    queue.push_back(5).unwrap();
    assert_eq!(queue.to_vec().unwrap(), vec![1, 2, 3, 4, 5]);
}

#[test]
fn concurrent_histories_are_linearizable() {
    common::check_queue_linearizability(common::open_nb_queue);
}

#[test]
fn a_million_elements_are_recovered_in_order() {
    common::check_queue_million(common::open_nb_queue);
}

#[test]
fn threads_pushing_and_popping_lose_and_repeat_nothing() {
    common::check_queue_stress(common::open_nb_queue);
}
