//! `NbQueue`: semantics against `VecDeque` across epochs and a crash-reopen, opening what
//! `Queue` wrote, a linearizability check of concurrent histories, and recovery of a
//! million elements.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use montage_collections::{NbQueue, Queue, together};
use montage_core::sim::SimMode;
use montage_core::sim::{QueuePoint, pause_queue_reads_at};
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

/// A queue whose elements come and go within one epoch reuses its own blocks.
#[test]
fn elements_pushed_and_popped_in_one_epoch_reuse_their_blocks() {
    common::check_queue_reuse_in_one_epoch(|heap| {
        montage_collections::NbQueue::<Vec<u8>>::open(heap, "q").unwrap()
    });
}

/// A value that says who pushed it and when, and checks itself: `len` bytes (at least 16)
/// of the producer and index, then a pattern derived from them.
fn stamped(producer: u64, index: u64, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&producer.to_le_bytes());
    bytes.extend_from_slice(&index.to_le_bytes());
    let mut x = producer.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index;
    while bytes.len() < len {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        bytes.push((x >> 56) as u8);
    }
    bytes
}

/// The producer and index of a value `stamped` made, checking every byte.
fn unstamp(bytes: &[u8]) -> (u64, u64) {
    let producer = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let index = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    assert_eq!(
        bytes,
        stamped(producer, index, bytes.len()),
        "a torn or foreign value"
    );
    (producer, index)
}

/// Pops race for the head while popped blocks are handed out again at once, to pushes of
/// this queue and to a map on the same heap whose values have the same size, and while
/// traversals read the queue: no call fails, every value read is whole and this queue's,
/// each producer's values come out in order (in pops and in each traversal), and none is
/// lost or repeated.
#[test]
fn racing_pops_never_act_on_a_block_handed_out_again() {
    const PRODUCERS: u64 = 3;
    const PAIRS: u64 = 20_000;
    const LEN: usize = 200;
    let config = HeapConfig::in_memory(64 << 20).epoch_length(montage_core::EpochLength::Every(
        std::time::Duration::from_millis(5),
    ));
    let heap = Heap::create(&config).unwrap();
    let queue: NbQueue<Vec<u8>> = NbQueue::open(&heap, "q").unwrap();
    let map: montage_collections::HashMap<u64, Vec<u8>> =
        montage_collections::HashMap::open(&heap, "m").unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let check_order = |values: &[Vec<u8>], what: &str| {
        let mut last = [None; PRODUCERS as usize];
        for value in values {
            let (producer, index) = unstamp(value);
            let slot = &mut last[usize::try_from(producer).unwrap()];
            assert!(
                *slot < Some(index),
                "{what}: {producer}/{index} after {slot:?}"
            );
            *slot = Some(index);
        }
    };
    let popped: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let (queue, map, done) = (&queue, &map, &done);
        let churn = s.spawn(move || {
            let mut i = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                map.put_ref(i % 8, &stamped(99, i, LEN)[..]).unwrap();
                map.delete(&(i % 8)).unwrap();
                i += 1;
            }
        });
        let traverse = s.spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                check_order(&queue.to_vec().unwrap(), "a traversal");
            }
        });
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                s.spawn(move || {
                    let mut seen = Vec::new();
                    for i in 0..PAIRS {
                        queue.push_back_ref(&stamped(p, i, LEN)[..]).unwrap();
                        seen.extend(queue.pop_front().unwrap());
                    }
                    seen
                })
            })
            .collect();
        let popped = producers.into_iter().map(|t| t.join().unwrap()).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        traverse.join().unwrap();
        popped
    });
    for seen in &popped {
        check_order(seen, "one thread's pops");
    }
    let mut all: Vec<(u64, u64)> = popped.concat().iter().map(|v| unstamp(v)).collect();
    all.extend(queue.to_vec().unwrap().iter().map(|v| unstamp(v)));
    all.sort_unstable();
    let pushed: Vec<(u64, u64)> = (0..PRODUCERS)
        .flat_map(|p| (0..PAIRS).map(move |i| (p, i)))
        .collect();
    assert_eq!(all, pushed, "an element was lost or popped twice");
}

/// The live blocks of `heap`, by offset.
fn live_blocks(heap: &Heap) -> std::collections::BTreeSet<u64> {
    heap.collect(montage_core::ScanFilter::all().live())
        .unwrap()
        .into_iter()
        .map(|info| info.block.offset())
        .collect()
}

/// A pop stopped after it read the head, while another thread pops the same element and
/// its block goes to a map on the same heap: the stopped pop neither claims the map's entry
/// (a delete of it, run while the pop is stopped a second time, completes at once) nor
/// fails, and pops the next element.
#[test]
fn a_stale_pop_leaves_a_block_handed_to_another_structure_alone() {
    use std::sync::Arc;
    use std::time::Duration;
    let config = HeapConfig::in_memory(1 << 20).epoch_length(montage_core::EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let queue: Arc<NbQueue<Vec<u8>>> = Arc::new(NbQueue::open(&heap, "q").unwrap());
    let map: Arc<montage_collections::HashMap<u64, Vec<u8>>> =
        Arc::new(montage_collections::HashMap::open(&heap, "m").unwrap());
    let (first, second) = (vec![1u8; 100], vec![2u8; 100]);
    queue.push_back(first.clone()).unwrap();
    queue.push_back(second.clone()).unwrap();
    let before = live_blocks(&heap);
    let (q, m, h, f) = (
        Arc::clone(&queue),
        Arc::clone(&map),
        heap.clone(),
        first.clone(),
    );
    let mut reads = 0;
    let mut delete_finished_in_time = Vec::new();
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = Arc::clone(&finished);
    pause_queue_reads_at(Some(Box::new(move |point| match point {
        QueuePoint::DequeueRead => {
            reads += 1;
            if reads == 1 {
                let (q, m, h, f) = (Arc::clone(&q), Arc::clone(&m), h.clone(), f.clone());
                let before = before.clone();
                std::thread::spawn(move || {
                    assert_eq!(q.pop_front().unwrap(), Some(f));
                    // The entry is the popped element's size: it takes the element's block.
                    m.put_ref(7, &[3u8; 91][..]).unwrap();
                    assert_eq!(
                        live_blocks(&h),
                        before,
                        "the map reused the element's block"
                    );
                })
                .join()
                .unwrap();
            }
        }
        QueuePoint::DequeueTook => {
            // Whatever this pop claimed, it holds now: a delete of the map's entry must not
            // wait for it.
            let m = Arc::clone(&m);
            let (done, waiter) = std::sync::mpsc::channel();
            let deleter = std::thread::spawn(move || {
                let deleted = m.delete(&7).unwrap();
                let _ = done.send(deleted);
            });
            let in_time = waiter.recv_timeout(Duration::from_secs(2)).is_ok();
            record.lock().unwrap().push(in_time);
            if in_time {
                deleter.join().unwrap();
            } else {
                // Let this pop go on (and roll back), then collect the delete.
                std::thread::spawn(move || deleter.join().unwrap());
            }
        }
        QueuePoint::TraversalCollected => {}
    })));
    let popped = queue.pop_front();
    pause_queue_reads_at(None);
    delete_finished_in_time.extend(finished.lock().unwrap().iter().copied());
    assert_eq!(popped.unwrap(), Some(second));
    assert_eq!(
        delete_finished_in_time,
        vec![true],
        "the stale pop held the map's entry"
    );
    assert_eq!(map.get(&7).unwrap(), None);
    assert_eq!(queue.pop_front().unwrap(), None);
}

/// A queue holding the elements `[1; 100]` and `[2; 100]`, and a hook that, the first time
/// this thread reaches `point`, has another thread pop the first element and push `[3;
/// 100]`, which takes the popped element's block.
fn pop_and_reuse_at(point: QueuePoint) -> (Heap, std::sync::Arc<NbQueue<Vec<u8>>>) {
    use std::sync::Arc;
    let config = HeapConfig::in_memory(1 << 20).epoch_length(montage_core::EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let queue: Arc<NbQueue<Vec<u8>>> = Arc::new(NbQueue::open(&heap, "q").unwrap());
    queue.push_back(vec![1; 100]).unwrap();
    queue.push_back(vec![2; 100]).unwrap();
    let before = live_blocks(&heap);
    let (q, h) = (Arc::clone(&queue), heap.clone());
    let mut reached = false;
    pause_queue_reads_at(Some(Box::new(move |at| {
        if at == point && !reached {
            reached = true;
            let (q, h, before) = (Arc::clone(&q), h.clone(), before.clone());
            std::thread::spawn(move || {
                assert_eq!(q.pop_front().unwrap(), Some(vec![1; 100]));
                q.push_back(vec![3; 100]).unwrap();
                assert_eq!(live_blocks(&h), before, "the push reused the popped block");
            })
            .join()
            .unwrap();
        }
    })));
    (heap, queue)
}

/// A traversal stopped after it collected the elements, while another thread pops the
/// front element and pushes a new one into its block: the traversal returns the element
/// still queued, not the new one in the old one's place.
#[test]
fn a_traversal_drops_an_element_popped_while_it_read() {
    let (_heap, queue) = pop_and_reuse_at(QueuePoint::TraversalCollected);
    let seen = queue.to_vec();
    pause_queue_reads_at(None);
    assert_eq!(seen.unwrap(), vec![vec![2; 100]]);
    assert_eq!(queue.to_vec().unwrap(), vec![vec![2; 100], vec![3; 100]]);
}

/// A pop stopped after it read the head, while another thread pops the same element and
/// pushes a new one into its block: the stopped pop claims the new element for a moment
/// (it is this queue's), fails its swap, gives the claim back, and pops the next element;
/// the new one then pops as usual.
#[test]
fn a_stale_pop_gives_back_a_new_element_it_claimed() {
    let (_heap, queue) = pop_and_reuse_at(QueuePoint::DequeueRead);
    let popped = queue.pop_front();
    pause_queue_reads_at(None);
    assert_eq!(popped.unwrap(), Some(vec![2; 100]));
    assert_eq!(queue.pop_front().unwrap(), Some(vec![3; 100]));
    assert_eq!(queue.pop_front().unwrap(), None);
}

/// A pop stopped after it read the head, while another thread pops the same element and
/// writes, into its block, a payload of this queue's owner and type that does not decode
/// (a block of the queue's kind whose bytes are no `String`): the stopped pop's read of it
/// fails, but the head has moved past the element it read, so the pop runs again and pops
/// the next element instead of reporting damage.
#[test]
fn a_stale_pop_that_cannot_decode_what_it_read_pops_again() {
    use std::sync::Arc;
    let config = HeapConfig::in_memory(1 << 20).epoch_length(montage_core::EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let queue: Arc<NbQueue<String>> = Arc::new(NbQueue::open(&heap, "q").unwrap());
    let (first, second) = ("a".repeat(100), "b".repeat(100));
    queue.push_back(first.clone()).unwrap();
    queue.push_back(second.clone()).unwrap();
    let owner = heap.register("q").unwrap();
    let elements = heap
        .collect(montage_core::ScanFilter::all().owner(owner))
        .unwrap();
    let front = elements
        .iter()
        .min_by_key(|info| info.spec.uid)
        .copied()
        .unwrap();
    // A sequence number, then bytes that are no UTF-8, as long as the first element's.
    let garbage = [&[0u8; 8][..], &[0xff; 100]].concat();
    let (q, h) = (Arc::clone(&queue), heap.clone());
    let mut reached = false;
    pause_queue_reads_at(Some(Box::new(move |at| {
        if at == QueuePoint::DequeueRead && !reached {
            reached = true;
            let (q, h, first, garbage) =
                (Arc::clone(&q), h.clone(), first.clone(), garbage.clone());
            std::thread::spawn(move || {
                assert_eq!(q.pop_front().unwrap(), Some(first));
                let written = h
                    .run_op(|op| op.alloc(owner, front.spec.type_id, &garbage))
                    .unwrap();
                assert_eq!(
                    written, front.block,
                    "the popped element's block was reused"
                );
            })
            .join()
            .unwrap();
        }
    })));
    let popped = queue.pop_front();
    pause_queue_reads_at(None);
    assert_eq!(popped.unwrap(), Some(second));
    assert_eq!(queue.pop_front().unwrap(), None);
}
