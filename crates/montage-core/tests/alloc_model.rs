//! Property and stress tests of the allocator: random alloc/write/free/reopen sequences
//! against a model (no overlap, nothing lost across close and reopen), and several threads
//! allocating and freeing at once.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::path::Path;

use montage_core::Epoch;
use montage_core::limits::HEADER_LEN;
use montage_core::raw;
use montage_core::raw::BlockSpec;
use montage_core::sim::SplitMix64;
use montage_core::{Error, Heap, HeapConfig, PBlock, ScanFilter};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc { len: u64 },
    Write { pick: usize, seed: u64 },
    Free { pick: usize },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![1u64..200, 200u64..3000, 3000u64..20_000, 60_000u64..140_000]
            .prop_map(|len| Op::Alloc { len }),
        3 => (any::<usize>(), any::<u64>()).prop_map(|(pick, seed)| Op::Write { pick, seed }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::Reopen),
    ]
}

fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn test_dir() -> tempfile::TempDir {
    // tmpfs keeps the file's flushes cheap; any directory gives the same results.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Every live block's extent, checked for overlap with every other.
fn assert_no_overlap(heap: &Heap, live: &BTreeMap<PBlock, (u64, Vec<u8>)>) {
    let mut extents: Vec<(u64, u64)> = live
        .keys()
        .map(|b| {
            let info = heap.info(*b).unwrap();
            (b.offset(), b.offset() + HEADER_LEN + info.capacity)
        })
        .collect();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "overlap: {pair:?}");
    }
}

fn run(ops: &[Op]) {
    let dir = test_dir();
    let config = HeapConfig::new(dir.path().join("model.heap"))
        .size(2 << 20)
        .max_size(2 << 20);
    let mut heap = Heap::create(&config).unwrap();
    // The model: block -> (uid, payload).
    let mut live: BTreeMap<PBlock, (u64, Vec<u8>)> = BTreeMap::new();
    let mut next_uid = 1;
    for op in ops {
        match *op {
            Op::Alloc { len } => {
                let data = bytes(next_uid, len);
                match heap
                    .raw()
                    .alloc_bytes(BlockSpec::new(Epoch::new(1), next_uid), &data)
                {
                    Ok(block) => {
                        heap.raw().persist_block(block).unwrap();
                        assert!(!live.contains_key(&block), "handed out a live block");
                        live.insert(block, (next_uid, data));
                        next_uid += 1;
                    }
                    Err(Error::OutOfSpace { .. }) => {}
                    Err(e) => panic!("alloc: {e}"),
                }
            }
            Op::Write { pick, seed } if !live.is_empty() => {
                let count = live.len();
                let (block, (_, data)) = live.iter_mut().nth(pick % count).unwrap();
                *data = bytes(seed, data.len() as u64);
                heap.raw().write(*block, 0, data).unwrap();
                heap.raw().persist_block(*block).unwrap();
            }
            Op::Free { pick } if !live.is_empty() => {
                let block = *live.keys().nth(pick % live.len()).unwrap();
                heap.raw().free(block).unwrap();
                live.remove(&block);
            }
            Op::Reopen => {
                heap.close().unwrap();
                heap = raw::open_with(&config, |_| montage_core::raw::Verdict::Keep).unwrap();
                let found: BTreeMap<PBlock, (u64, Vec<u8>)> = heap
                    .collect(ScanFilter::all())
                    .unwrap()
                    .into_iter()
                    .map(|info| {
                        (
                            info.block,
                            (info.spec.uid, heap.read_payload(info.block).unwrap()),
                        )
                    })
                    .collect();
                assert_eq!(found, live, "reopen changed the heap's contents");
            }
            _ => {}
        }
        assert_no_overlap(&heap, &live);
        for (block, (uid, data)) in &live {
            assert_eq!(heap.info(*block).unwrap().spec.uid, *uid);
            assert_eq!(&heap.read_payload(*block).unwrap(), data);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
    ))]

    #[test]
    fn random_alloc_free_sequences_never_overlap_and_survive_reopen(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        run(&ops);
    }
}

/// Several threads allocate, fill, check and free at once; a block handed to two threads
/// at once shows up as a payload overwritten by the other thread's pattern.
fn stress(config: &HeapConfig, threads: u64, ops: u64) {
    let heap = Heap::create(config).unwrap();
    let kept: Vec<Vec<(PBlock, Vec<u8>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let heap = &heap;
                s.spawn(move || {
                    let mut rng = SplitMix64::new(t);
                    let mut mine: Vec<(PBlock, Vec<u8>)> = Vec::new();
                    for i in 0..ops {
                        if mine.len() < 64 && !rng.next_u64().is_multiple_of(3) {
                            let len = if rng.next_u64().is_multiple_of(50) {
                                70_000
                            } else {
                                1 + rng.next_u64() % 600
                            };
                            let data = bytes(t << 32 | i, len);
                            match heap
                                .raw()
                                .alloc_bytes(BlockSpec::new(Epoch::new(1), t << 32 | i), &data)
                            {
                                Ok(block) => mine.push((block, data)),
                                Err(Error::OutOfSpace { .. }) => {}
                                Err(e) => panic!("alloc: {e}"),
                            }
                        } else if !mine.is_empty() {
                            let at = (rng.next_u64() % mine.len() as u64) as usize;
                            let (block, data) = mine.swap_remove(at);
                            assert_eq!(
                                heap.read_payload(block).unwrap(),
                                data,
                                "block shared by two owners"
                            );
                            heap.raw().free(block).unwrap();
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<(PBlock, Vec<u8>)> = kept.into_iter().flatten().collect();
    all.sort_unstable_by_key(|(b, _)| *b);
    let found = heap.collect(ScanFilter::all()).unwrap();
    assert_eq!(
        found.iter().map(|i| i.block).collect::<Vec<_>>(),
        all.iter().map(|(b, _)| *b).collect::<Vec<_>>()
    );
    for (block, data) in &all {
        assert_eq!(&heap.read_payload(*block).unwrap(), data);
    }
}

#[test]
fn concurrent_alloc_and_free_never_share_a_block() {
    stress(&HeapConfig::in_memory(32 << 20), 4, 20_000);
}

#[test]
fn concurrent_alloc_and_free_on_a_nearly_full_heap_never_share_a_block() {
    // Small enough that threads run out of spans and steal from each other's caches.
    stress(&HeapConfig::in_memory(1 << 20).thread_slots(2), 4, 5_000);
}

#[test]
fn concurrent_alloc_and_free_on_the_simulator_never_share_a_block() {
    stress(
        &HeapConfig::simulated(4 << 20, montage_core::sim::SimMode::Prefix),
        2,
        2_000,
    );
}

/// How many 64-byte payloads operations on the calling thread can allocate in `heap` before
/// it reports itself full.
fn fill_with_ops(heap: &Heap) -> usize {
    let owner = heap.register("fill").unwrap();
    let mut count = 0;
    loop {
        let op = heap.begin_op().unwrap();
        match op.alloc(owner, 1, &[7u8; 64]) {
            Ok(_) => count += 1,
            Err(Error::OutOfSpace { .. }) => return count,
            Err(other) => panic!("{other}"),
        }
    }
}

/// A thread that allocated once keeps the rest of the span it carved in its own cache. When
/// it then idles and another thread fills the heap, the other thread takes those blocks from
/// the idle thread's cache (an owned slot, frozen while it is used): the heap holds exactly
/// one block fewer for it than it does with no other thread at all.
#[test]
fn an_idle_threads_cached_blocks_go_to_a_thread_that_needs_them() {
    // Slots enough that every thread of the test process owns one.
    let config = HeapConfig::in_memory(1 << 20).thread_slots(4096);
    let alone = fill_with_ops(&Heap::create(&config).unwrap());

    let heap = Heap::create(&config).unwrap();
    let (idle_tx, idle_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = {
        let heap = heap.clone();
        std::thread::spawn(move || {
            let owner = heap.register("other").unwrap();
            let op = heap.begin_op().unwrap();
            op.alloc(owner, 1, &[1u8; 64]).unwrap();
            drop(op);
            // Alive, with the span's other blocks in its cache, and idle.
            idle_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        })
    };
    idle_rx.recv().unwrap();
    let beside_an_idle_thread = fill_with_ops(&heap);
    done_tx.send(()).unwrap();
    other.join().unwrap();
    assert!(
        alone > 1024,
        "the heap should hold more than one span of blocks: {alone}"
    );
    assert_eq!(
        beside_an_idle_thread,
        alone - 1,
        "blocks cached by an idle thread were not given to the thread that needed them"
    );
}

/// An update may fill a new block before it reads the old block's header (so that its miss
/// overlaps the stores); when the update turns out to be in place, or fails, that block goes
/// back. Were it lost, these loops would take the heap's free blocks (a few thousand) several
/// times over, and the fill at the end would find fewer than a fresh heap holds.
#[test]
fn updates_in_place_and_failed_updates_give_their_spare_block_back() {
    let config = HeapConfig::in_memory(1 << 20).epoch_length(montage_core::EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("spares").unwrap();
    let payload = |i: u32| i.to_le_bytes().repeat(25);
    let mut block = heap.run_op(|op| op.alloc(owner, 1, &payload(0))).unwrap();
    for i in 0..20_000u32 {
        heap.advance_epoch().unwrap();
        // A new version (the block is of an older epoch) keeps the thread filling first...
        block = heap.run_op(|op| op.update(block, &payload(i))).unwrap();
        // ...so the next update, in place (the block is of this epoch), fills one too and
        // gives it back.
        let same = heap.run_op(|op| op.update(block, &payload(i + 1))).unwrap();
        assert_eq!(same, block);
    }
    // Failed: the block was deleted, so every update is refused.
    heap.run_op(|op| op.delete(block)).unwrap();
    for i in 0..20_000u32 {
        let refused = heap.begin_op().unwrap().update(block, &payload(i));
        assert!(
            matches!(
                refused,
                Err(Error::InvalidBlock { .. } | Error::Retired { .. })
            ),
            "{refused:?}"
        );
    }
    // The space is all there: as many blocks fit as in a fresh heap of the same size, once
    // the old versions are reclaimed.
    for _ in 0..4 {
        heap.advance_epoch().unwrap();
    }
    let fill = |heap: &Heap| {
        let owner = heap.register("fill").unwrap();
        let mut n = 0usize;
        while heap.run_op(|op| op.alloc(owner, 1, &payload(1))).is_ok() {
            n += 1;
        }
        n
    };
    let expected = fill(&Heap::create(&config).unwrap());
    assert!(fill(&heap) + 2 >= expected, "blocks were lost");
}

/// Allocates payloads of `len` bytes in operations until the heap reports itself full;
/// returns them.
fn fill_with(heap: &Heap, owner: montage_core::OwnerId, len: usize) -> Vec<PBlock> {
    let payload = vec![0x5a; len];
    let mut blocks = Vec::new();
    loop {
        match heap.run_op(|op| op.alloc(owner, 1, &payload)) {
            Ok(block) => blocks.push(block),
            Err(Error::OutOfSpace { .. }) => return blocks,
            Err(other) => panic!("{other}"),
        }
    }
}

/// A workload whose value sizes shift: the heap is filled with 64-byte payloads, they are all
/// deleted, and then it is filled with 4 KiB ones. The heap cannot hold both at once, so the
/// second fill needs the spans the first one carved; they go back to the free spans while the
/// heap runs, and the second fill gets (nearly) all the space a fresh heap gives it. Then
/// the sizes shift back the other way, through the same path for a large value.
#[test]
fn spans_whose_blocks_are_all_free_are_carved_again_for_another_size() {
    for config in [
        HeapConfig::in_memory(4 << 20),
        HeapConfig::in_memory(4 << 20).thread_slots(1),
    ] {
        let fresh = |len| {
            let heap = Heap::create(&config).unwrap();
            fill_with(&heap, heap.register("fresh").unwrap(), len).len()
        };
        let (small_alone, big_alone, large_alone) = (fresh(24), fresh(4000), fresh(70_000));

        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("shift").unwrap();
        for (from, to, alone) in [(24, 4000, big_alone), (4000, 70_000, large_alone)] {
            let first = fill_with(&heap, owner, from);
            assert!(!first.is_empty());
            for block in first {
                heap.run_op(|op| op.delete(block)).unwrap();
            }
            let released = heap.stats().spans_released;
            let second = fill_with(&heap, owner, to);
            assert!(
                second.len() + 2 >= alone,
                "{from} B then {to} B: {} payloads of {to} B fit, a fresh heap holds {alone}",
                second.len()
            );
            assert!(heap.stats().spans_released > released);
            for block in second {
                heap.run_op(|op| op.delete(block)).unwrap();
            }
        }
        // And back to the smallest size: everything is free again.
        assert!(fill_with(&heap, owner, 24).len() + 512 >= small_alone);
    }
}
