//! Heaps that grow: a full heap grows up to its limit and no further, a grown heap file
//! reopens with everything it held, and a heap that grows past its first span table keeps
//! the spans of each later group in that group's own table.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;

use montage_core::limits::{MIN_HEAP_SIZE, SPAN_SIZE};
use montage_core::raw::{self, BlockSpec, Verdict};
use montage_core::sim::SimMode;
use montage_core::{Epoch, Error, Heap, HeapConfig, OwnerId, PBlock, ScanFilter};

/// Allocates payloads of `len` bytes in operations until the heap reports itself full;
/// returns them with their bytes.
fn fill(heap: &Heap, owner: OwnerId, len: usize) -> Vec<(PBlock, Vec<u8>)> {
    let mut blocks = Vec::new();
    loop {
        let payload: Vec<u8> = (0..len).map(|i| (i + blocks.len() * 7) as u8).collect();
        match heap.run_op(|op| op.alloc(owner, 1, &payload)) {
            Ok(block) => blocks.push((block, payload)),
            Err(Error::OutOfSpace { .. }) => return blocks,
            Err(other) => panic!("{other}"),
        }
    }
}

#[test]
fn a_full_heap_grows_to_its_limit_and_no_further() {
    let limit = 16 << 20;
    // The same heap created at its limit: what the grown one must hold as well.
    let at_limit = Heap::create(&HeapConfig::in_memory(limit)).unwrap();
    let expected = fill(&at_limit, at_limit.register("fill").unwrap(), 4000).len();

    let heap = Heap::create(&HeapConfig::in_memory(MIN_HEAP_SIZE).max_size(limit)).unwrap();
    assert_eq!(heap.size(), MIN_HEAP_SIZE);
    assert_eq!(heap.max_size(), limit);
    let owner = heap.register("fill").unwrap();
    let blocks = fill(&heap, owner, 4000);
    let stats = heap.stats();
    assert_eq!(heap.size(), limit);
    assert_eq!(stats.spans, stats.spans_limit);
    assert!(stats.growths >= 5, "{stats:?}");
    assert!(
        blocks.len() + 16 >= expected,
        "{} payloads of 4000 B in the grown heap, {expected} in one created at its limit",
        blocks.len()
    );
    for (block, payload) in &blocks {
        assert_eq!(&heap.read_payload(*block).unwrap(), payload);
    }
    // Created with one span, too small for a delete reserve, it got one as it grew: the
    // full heap can still be emptied.
    assert_eq!(stats.reserve_blocks, 256);
    for (block, _) in &blocks {
        heap.run_op(|op| op.delete(*block)).unwrap();
    }
    // A heap in memory without a limit does not grow.
    let fixed = Heap::create(&HeapConfig::in_memory(MIN_HEAP_SIZE)).unwrap();
    assert_eq!(fixed.max_size(), MIN_HEAP_SIZE);
    fill(&fixed, fixed.register("fill").unwrap(), 4000);
    assert_eq!(fixed.size(), MIN_HEAP_SIZE);
    assert_eq!(fixed.stats().growths, 0);
    // A limit below the size to create is refused.
    let refused = Heap::create(&HeapConfig::in_memory(1 << 20).max_size(1 << 19));
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
}

#[test]
fn a_grown_heap_file_reopens_with_everything_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grown.heap");
    let config = HeapConfig::new(&path).size(MIN_HEAP_SIZE).max_size(8 << 20);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("mixed").unwrap();
    let mut held = BTreeMap::new();
    // Small payloads, then large blocks of several spans, then small ones again: growth
    // for both kinds of allocation.
    for (round, len) in [(0u64, 100), (1, 150_000), (2, 900)] {
        for i in 0..40u64 {
            let payload = vec![(round * 40 + i) as u8; len];
            let block = heap.run_op(|op| op.alloc(owner, 1, &payload)).unwrap();
            held.insert(block, payload);
        }
    }
    let size = heap.size();
    let spans = heap.stats().spans;
    assert!(size > MIN_HEAP_SIZE && heap.stats().growths > 0);
    heap.close().unwrap();

    // Reopened without a limit: as far as the file system has room.
    let heap = Heap::open(&HeapConfig::new(&path)).unwrap();
    assert_eq!(heap.size(), size);
    assert_eq!(heap.stats().spans, spans);
    assert!(heap.stats().spans_limit >= spans);
    let found: BTreeMap<PBlock, Vec<u8>> = heap
        .collect(ScanFilter::all())
        .unwrap()
        .into_iter()
        .map(|info| (info.block, heap.read_payload(info.block).unwrap()))
        .collect();
    assert_eq!(found, held);
    heap.close().unwrap();

    // Reopened with a limit below its size now: it keeps its size and does not grow.
    let heap = Heap::open(&HeapConfig::new(&path).max_size(MIN_HEAP_SIZE)).unwrap();
    assert_eq!(heap.size(), size);
    assert_eq!(heap.stats().spans_limit, spans);
    let more = fill(&heap, owner, 100_000);
    assert_eq!(heap.size(), size);
    assert!(heap.stats().spans_limit == heap.stats().spans);
    drop(more);
}

/// Recovery keeping every valid block (the blocks here carry epochs the test chose).
fn reopen(image: montage_core::sim::CrashImage, config: &HeapConfig) -> Heap {
    raw::open_image_with(image, config, |_| Verdict::Keep).unwrap()
}

#[test]
fn a_heap_grown_past_its_first_span_table_keeps_each_groups_spans_in_the_groups_table() {
    // A heap of one span has room in its first table for 6,144 spans (384 MiB); past them,
    // groups of 8,192 spans begin with their own table. Large blocks of two spans, with
    // nothing written but their headers, fill it to a limit two groups past the first
    // table; the simulator keeps only the pages they touch.
    let first_table = 6144;
    let spans = first_table + 2 * 8192 + 100;
    let limit = MIN_HEAP_SIZE - SPAN_SIZE + spans * SPAN_SIZE;
    let config = HeapConfig::simulated(MIN_HEAP_SIZE, SimMode::Prefix).max_size(limit);
    let heap = Heap::create(&config).unwrap();
    let len = SPAN_SIZE + 1000;
    let mut blocks = Vec::new();
    loop {
        let spec = BlockSpec::new(Epoch::new(1), blocks.len() as u64 + 1);
        match heap.raw().alloc(spec, len) {
            Ok(block) => {
                heap.raw().persist_block(block).unwrap();
                blocks.push(block);
            }
            Err(Error::OutOfSpace { .. }) => break,
            Err(other) => panic!("{other}"),
        }
    }
    let stats = heap.stats();
    assert_eq!(heap.size(), limit);
    // Three spans hold tables (the last group's begins one); the others hold the blocks,
    // but for the delete reserve's span (the heap got one as it grew) and, a block needing
    // two, a span left over in each of the four runs between tables.
    assert_eq!(stats.spans, spans - 3);
    assert_eq!(stats.reserve_spans, 1);
    assert!(
        blocks.len() as u64 * 2 + 5 >= stats.spans,
        "{} blocks",
        blocks.len()
    );
    let table_spans: Vec<u64> = (0..3)
        .map(|g| heap_offset_of_span(first_table + g * 8192))
        .collect();
    for block in &blocks {
        for table in &table_spans {
            assert!(
                block.offset() + 2 * SPAN_SIZE <= *table || block.offset() >= table + SPAN_SIZE,
                "block at {:#x} overlaps the span table at {table:#x}",
                block.offset()
            );
        }
    }
    let sim = heap.simulator().unwrap();
    heap.close().unwrap();
    let heap = reopen(sim.durable(), &config);
    assert_eq!(heap.size(), limit);
    assert_eq!(heap.stats().spans, stats.spans);
    let mut found: Vec<(u64, PBlock)> = heap
        .collect(ScanFilter::all())
        .unwrap()
        .into_iter()
        .map(|info| (info.spec.uid, info.block))
        .collect();
    found.sort_unstable();
    let expected: Vec<(u64, PBlock)> = (1..).zip(blocks.iter().copied()).collect();
    assert_eq!(found.len(), expected.len(), "blocks recovered");
    if let Some(at) = (0..found.len()).find(|&i| found[i] != expected[i]) {
        panic!("recovered {:?}, written {:?}", found[at], expected[at]);
    }
}

/// The offset of span `index` in a heap created at the minimum size (its data starts at
/// one span).
fn heap_offset_of_span(index: u64) -> u64 {
    SPAN_SIZE + index * SPAN_SIZE
}

/// A block of more spans than a group holds fits only below the first group table: a heap
/// too small there refuses it at once instead of growing toward its limit in vain, and one
/// that fits it grows for it.
#[test]
fn a_block_larger_than_a_group_never_grows_the_heap_in_vain() {
    let heap = Heap::create(&HeapConfig::in_memory(MIN_HEAP_SIZE).max_size(2 << 30)).unwrap();
    // 600 MiB: more than the 6,144 spans below the first table of a heap this small.
    let refused = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 1), 600 << 20)
        .unwrap_err();
    assert!(matches!(refused, Error::OutOfSpace { .. }), "{refused}");
    assert_eq!(heap.size(), MIN_HEAP_SIZE);
    assert_eq!(heap.stats().growths, 0);
    // 300 MiB fits below it.
    let block = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 2), 300 << 20)
        .unwrap();
    assert_eq!(heap.info(block).unwrap().spec.uid, 2);
    assert!(heap.size() > 300 << 20 && heap.size() <= MIN_HEAP_SIZE + 6144 * SPAN_SIZE);
}
