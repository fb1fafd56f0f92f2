//! Damaged and misused heaps, through the public API only: a full heap can still be emptied,
//! impossible epoch words and uids are refused, a structure cannot be opened twice, and a
//! damaged directory entry is reported rather than dropped.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use montage_collections::{HashMap, NbHashMap, NbQueue, Queue, SortedMap};
use montage_core::raw::BlockSpec;
use montage_core::{BackendKind, Epoch, EpochLength, Error, Heap, HeapConfig, QuarantineReason};

const MIB: u64 = 1 << 20;

/// A file heap whose bytes are all in the file: the `Pmem` backend (on an ordinary file it
/// flushes lines as it would on persistent memory). The journal backend would repair some of
/// the damage these tests make from its journal.
fn file_config(path: &Path, size: u64) -> HeapConfig {
    HeapConfig::new(path)
        .size(size)
        .max_size(size)
        .backend(BackendKind::Pmem)
}

fn read_word(path: &Path, offset: u64) -> u64 {
    let mut file = std::fs::File::open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut word = [0u8; 8];
    file.read_exact(&mut word).unwrap();
    u64::from_le_bytes(word)
}

fn write_word(path: &Path, offset: u64, value: u64) {
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&value.to_le_bytes()).unwrap();
}

fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The epoch word's place in the superblock (`docs/design.md`, "Superblock").
const EPOCH_WORD: u64 = 0x40;
/// The first directory entry, and its valid word.
const DIRECTORY: u64 = 0x1000;

/// Fills `map` with 100-byte values until the heap refuses; returns how many went in.
fn fill(map: &HashMap<u64, Vec<u8>>) -> u64 {
    let mut count = 0;
    loop {
        match map.put(count, vec![7; 100]) {
            Ok(_) => count += 1,
            Err(Error::OutOfSpace { .. }) => return count,
            Err(other) => panic!("unexpected error while filling: {other}"),
        }
    }
}

#[test]
fn a_full_heap_can_be_emptied_and_refilled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.heap");
    let heap = Heap::create(&file_config(&path, MIB)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
    let count = fill(&map);
    assert!(count > 1000, "a 1 MiB heap holds more than {count} entries");
    heap.sync().unwrap();
    // Every entry can be removed, at once and without waiting for anything in between.
    for key in 0..count {
        assert_eq!(map.remove(&key).unwrap(), Some(vec![7; 100]), "key {key}");
    }
    assert!(map.is_empty());
    heap.sync().unwrap();
    heap.sync().unwrap();
    // The space comes back: the heap takes as many entries again.
    let again = fill(&map);
    assert!(again + 32 >= count, "refilled {again} of {count}");
    drop(map);
    heap.close().unwrap();
}

#[test]
fn a_full_heap_can_be_emptied_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.heap");
    let count = {
        let heap = Heap::create(&file_config(&path, MIB)).unwrap();
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
        let queue: Queue<String> = Queue::open(&heap, "q").unwrap();
        let count = fill(&map);
        while queue.push_back("x".repeat(100)).is_ok() {}
        heap.sync().unwrap();
        drop((map, queue));
        heap.close().unwrap();
        count
    };
    let heap = Heap::open(&file_config(&path, MIB)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
    let queue: Queue<String> = Queue::open(&heap, "q").unwrap();
    assert_eq!(map.len() as u64, count);
    let queued = queue.len();
    for _ in 0..queued {
        assert_eq!(queue.pop_front().unwrap(), Some("x".repeat(100)));
    }
    for key in 0..count {
        assert!(map.delete(&key).unwrap(), "key {key}");
    }
    heap.sync().unwrap();
    drop((map, queue));
    heap.close().unwrap();
    let heap = Heap::open(&file_config(&path, MIB)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
    assert!(map.is_empty());
    assert!(fill(&map) + 32 >= count);
}

/// Fills a heap through `insert` (which returns false once the heap is full), then empties it
/// through `remove` in `threads` threads at once, twice over.
fn fill_and_empty_concurrently(
    threads: u64,
    insert: impl Fn(u64) -> bool + Sync,
    remove: impl Fn(u64) -> bool + Sync,
) {
    for round in 0..2 {
        let mut count = 0;
        while insert(count) {
            count += 1;
        }
        assert!(count > 1000, "round {round}: only {count} entries fit");
        std::thread::scope(|scope| {
            for t in 0..threads {
                let remove = &remove;
                scope.spawn(move || {
                    for key in (t..count).step_by(threads as usize) {
                        assert!(remove(key), "round {round}: key {key}");
                    }
                });
            }
        });
    }
}

fn out_of_space(result: montage_core::Result<()>) -> bool {
    match result {
        Ok(()) => true,
        Err(Error::OutOfSpace { .. }) => false,
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn every_structure_can_empty_a_full_heap_from_several_threads() {
    let heap = Heap::create(&HeapConfig::in_memory(MIB)).unwrap();
    let value = || vec![3u8; 100];
    {
        let map: NbHashMap<u64, Vec<u8>> = NbHashMap::open(&heap, "nb").unwrap();
        fill_and_empty_concurrently(
            4,
            |k| out_of_space(map.insert(k, value()).map(drop)),
            |k| map.remove(&k).unwrap().is_some(),
        );
    }
    {
        let map: SortedMap<u64, Vec<u8>> = SortedMap::open(&heap, "sorted").unwrap();
        fill_and_empty_concurrently(
            4,
            |k| out_of_space(map.insert(k, value()).map(drop)),
            |k| map.remove(&k).unwrap().is_some(),
        );
    }
    {
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "hash").unwrap();
        fill_and_empty_concurrently(
            4,
            |k| out_of_space(map.insert(k, value()).map(drop)),
            |k| map.remove(&k).unwrap().is_some(),
        );
    }
    {
        let queue: NbQueue<Vec<u8>> = NbQueue::open(&heap, "nbq").unwrap();
        fill_and_empty_concurrently(
            4,
            |_| out_of_space(queue.push_back(value())),
            |_| queue.pop_front().unwrap().is_some(),
        );
        assert!(queue.is_empty());
    }
}

#[test]
fn out_of_space_names_the_request_and_the_free_space() {
    let heap = Heap::create(&HeapConfig::in_memory(MIB)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
    fill(&map);
    match map.put(u64::MAX, vec![1; 100]) {
        Err(Error::OutOfSpace {
            requested,
            free_spans,
            ..
        }) => {
            // The entry's payload: its encoded key and value, never zero.
            assert!(requested >= 100, "requested {requested}");
            assert_eq!(free_spans, 0);
        }
        other => panic!("expected OutOfSpace, got {other:?}"),
    }
}

/// A heap with one map entry per key in `keys`, each written in an epoch of its own, closed
/// cleanly right after the last one: its newest block is as new as a clean close allows
/// (two epochs behind the word).
fn closed_heap(path: &Path, keys: std::ops::Range<u64>) {
    let config = file_config(path, MIB).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    for key in keys {
        heap.advance_epoch().unwrap();
        map.put(key, key * 10).unwrap();
    }
    drop(map);
    heap.close().unwrap();
}

fn expect_corrupted(result: montage_core::Result<Heap>, offset: u64, case: &str) {
    match result {
        Err(Error::Corrupted { offset: at, .. }) => assert_eq!(at, offset, "{case}"),
        Err(other) => panic!("{case}: expected Corrupted, got {other}"),
        Ok(_) => panic!("{case}: a damaged heap was opened"),
    }
}

#[test]
fn an_impossible_epoch_word_is_refused_and_the_file_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("epoch.heap");
    closed_heap(&path, 0..20);
    let good = read_word(&path, EPOCH_WORD);
    assert!(good > 20);
    for (case, word) in [
        ("raised past any reachable epoch", 0xFFFF_FFFF_FFFF_FFFE),
        ("lowered below the blocks' epochs", 2),
        ("lowered by one on a clean heap", good - 1),
        ("zero", 0),
    ] {
        write_word(&path, EPOCH_WORD, word);
        let before = file_bytes(&path);
        expect_corrupted(Heap::open(&file_config(&path, MIB)), EPOCH_WORD, case);
        assert_eq!(file_bytes(&path), before, "{case}: the file was changed");
    }
    // Put back, the heap opens with everything in it.
    write_word(&path, EPOCH_WORD, good);
    let heap = Heap::open(&file_config(&path, MIB)).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    assert_eq!(map.len(), 20);
    assert_eq!(map.get(&19).unwrap(), Some(190));
}

#[test]
fn a_raised_epoch_word_still_advances_and_keeps_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raised.heap");
    closed_heap(&path, 0..3);
    // Far above what the heap reached, but an epoch a heap can still run from.
    write_word(&path, EPOCH_WORD, 1 << 40);
    {
        let heap = Heap::open(&file_config(&path, MIB)).unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
        assert_eq!(map.len(), 3);
        map.put(100, 1000).unwrap();
        heap.sync().unwrap();
        assert!(heap.epoch() > Epoch::new(1 << 40), "epoch {}", heap.epoch());
        drop(map);
        heap.close().unwrap();
    }
    let heap = Heap::open(&file_config(&path, MIB)).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    assert_eq!(map.get(&100).unwrap(), Some(1000));
}

#[test]
fn a_block_with_an_impossible_uid_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("uid.heap");
    let offset = {
        let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        for _ in 0..3 {
            heap.advance_epoch().unwrap();
        }
        let raw = heap.raw();
        // Of an epoch the clock has left behind, so only its uid is wrong.
        let block = raw
            .alloc_bytes(BlockSpec::new(Epoch::FIRST, u64::MAX), b"max")
            .unwrap();
        raw.persist_block(block).unwrap();
        heap.close().unwrap();
        block.offset()
    };
    let before = file_bytes(&path);
    expect_corrupted(Heap::open(&file_config(&path, MIB)), offset, "uid u64::MAX");
    assert_eq!(file_bytes(&path), before);
}

#[test]
fn a_structure_open_twice_is_refused_until_the_first_handle_is_dropped() {
    let config = HeapConfig::in_memory(4 * MIB).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    for key in 0..100 {
        map.put(key, key).unwrap();
    }
    // Deletes and updates of an older epoch leave their old versions valid, retired, until
    // reclamation: a structure opened again must not take them for live entries.
    heap.advance_epoch().unwrap();
    for key in 0..50 {
        map.delete(&key).unwrap();
    }
    for key in 60..70 {
        map.put(key, key + 1000).unwrap();
    }
    match HashMap::<u64, u64>::open(&heap, "m") {
        Err(Error::StructureOpen { name }) => assert_eq!(name, "m"),
        Err(other) => panic!("expected StructureOpen, got {other}"),
        Ok(_) => panic!("a live structure was opened a second time"),
    }
    // Another kind of structure under the same name is refused the same way.
    assert!(matches!(
        Queue::<u64>::open(&heap, "m"),
        Err(Error::StructureOpen { .. })
    ));
    drop(map);
    // Once the first handle is gone, the name opens again and sees exactly the live state.
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    assert_eq!(map.len(), 50);
    assert_eq!(map.get(&10).unwrap(), None);
    assert_eq!(map.get(&55).unwrap(), Some(55));
    assert_eq!(map.get(&60).unwrap(), Some(1060));
    map.put(10, 1).unwrap();
    assert_eq!(map.get(&10).unwrap(), Some(1));
}

#[test]
fn a_damaged_directory_entry_is_reported_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dir.heap");
    {
        let heap = Heap::create(&file_config(&path, MIB)).unwrap();
        let a: HashMap<u64, u64> = HashMap::open(&heap, "a").unwrap();
        let b: HashMap<u64, u64> = HashMap::open(&heap, "b").unwrap();
        for key in 0..10 {
            a.put(key, key).unwrap();
            b.put(key, key + 1).unwrap();
        }
        heap.sync().unwrap();
        drop((a, b));
        heap.close().unwrap();
    }
    let pristine = file_bytes(&path);
    // One flipped bit anywhere in entry 0 (the name, the owner id, the reserved bytes or
    // the valid word) is reported.
    for bit in (0..512).step_by(7) {
        let mut bytes = pristine.clone();
        bytes[DIRECTORY as usize + bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&path, &bytes).unwrap();
        match Heap::open(&file_config(&path, MIB)) {
            Err(Error::Corrupted { offset, .. }) => {
                assert_eq!(offset, DIRECTORY, "bit {bit}");
            }
            Err(other) => panic!("bit {bit}: expected Corrupted, got {other}"),
            Ok(_) => panic!("bit {bit}: a damaged directory entry was accepted"),
        }
        assert_eq!(file_bytes(&path), bytes, "bit {bit}: the file was changed");
    }
    // An entry cleared outright (its valid word zeroed) leaves payloads without an owner:
    // reported too, so its owner id is never handed to a new structure.
    let mut bytes = pristine.clone();
    bytes[DIRECTORY as usize + 0x38..DIRECTORY as usize + 0x40].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    expect_corrupted(
        Heap::open(&file_config(&path, MIB)),
        DIRECTORY,
        "a cleared entry",
    );
    std::fs::write(&path, &pristine).unwrap();
    let heap = Heap::open(&file_config(&path, MIB)).unwrap();
    let a: HashMap<u64, u64> = HashMap::open(&heap, "a").unwrap();
    assert_eq!(a.get(&3).unwrap(), Some(3));
    let c: HashMap<u64, u64> = HashMap::open(&heap, "c").unwrap();
    assert!(c.is_empty());
}

/// What a heap of three structures holds, read back through them.
#[derive(Debug, PartialEq)]
struct Contents {
    map: Vec<(Vec<u8>, Vec<u8>)>,
    sorted: Vec<(u64, u64)>,
    queue: Vec<String>,
}

fn contents(heap: &Heap) -> montage_core::Result<Contents> {
    let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(heap, "map")?;
    let sorted: SortedMap<u64, u64> = SortedMap::open(heap, "sorted")?;
    let queue: Queue<String> = Queue::open(heap, "queue")?;
    let mut map: Vec<_> = map.iter().collect::<montage_core::Result<_>>()?;
    map.sort();
    Ok(Contents {
        map,
        sorted: sorted.iter().collect::<montage_core::Result<_>>()?,
        queue: queue.to_vec()?,
    })
}

/// Damage to the metadata (the superblock's words, the directory, the type registry, the
/// span table: everything before the first span) never gives wrong data: a flipped bit in any
/// of its non-zero bytes ends in the exact contents or in a typed error that leaves the file
/// as it was. Every such bit is tried. It also checks that a structure opened again on a
/// running heap sees exactly its live state.
#[test]
fn metadata_damage_never_gives_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    let want = {
        let heap = Heap::create(&config).unwrap();
        {
            let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
            let sorted: SortedMap<u64, u64> = SortedMap::open(&heap, "sorted").unwrap();
            let queue: Queue<String> = Queue::open(&heap, "queue").unwrap();
            for i in 0..150u64 {
                map.insert(
                    format!("k{i}").into_bytes(),
                    vec![i as u8; (i % 50) as usize],
                )
                .unwrap();
                sorted.insert(i * 3, i).unwrap();
                queue.push_back(format!("e{i}")).unwrap();
                if i % 10 == 0 {
                    heap.advance_epoch().unwrap();
                }
            }
            for i in (0..150u64).step_by(7) {
                map.remove(format!("k{i}").as_bytes()).unwrap();
                sorted.remove(&(i * 3)).unwrap();
                queue.pop_front().unwrap();
            }
        }
        let want = contents(&heap).unwrap();
        heap.close().unwrap();
        want
    };
    let pristine = file_bytes(&path);
    let data_offset = 0x10000; // a 1 MiB heap's first span
    let bits: Vec<usize> = (0..data_offset)
        .filter(|&at| pristine[at] != 0)
        .flat_map(|at| (0..8).map(move |bit| at * 8 + bit))
        .collect();
    // The superblock, three directory entries and the span entries of the carved spans.
    assert!(bits.len() > 400, "only {} metadata bits", bits.len());
    let (mut exact, mut refused) = (0, 0);
    for &bit in &bits {
        let mut bytes = pristine.clone();
        bytes[bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(got) = Heap::open(&config).and_then(|heap| contents(&heap)) {
            assert!(
                got == want,
                "bit {bit:#x}: wrong data without an error: {} map entries of {}, {} \
                     sorted of {}, {} queued of {}",
                got.map.len(),
                want.map.len(),
                got.sorted.len(),
                want.sorted.len(),
                got.queue.len(),
                want.queue.len()
            );
            exact += 1;
        } else {
            assert_eq!(
                file_bytes(&path),
                bytes,
                "bit {bit:#x}: a refused heap was changed"
            );
            refused += 1;
        }
    }
    eprintln!(
        "{} metadata bits flipped: {exact} exact, {refused} refused",
        bits.len()
    );
}

/// Creates a heap holding a map of eight entries, `key -> [key; 30 + key]`, closes it, and
/// returns the map's blocks.
fn eight_entries(config: &HeapConfig) -> Vec<montage_core::BlockInfo> {
    let heap = Heap::create(config).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    for key in 0..8u64 {
        map.put(key, vec![key as u8; 30 + key as usize]).unwrap();
    }
    drop(map);
    heap.close().unwrap();
    let heap = Heap::open(config).unwrap();
    let owner = heap.lookup("map").unwrap();
    let blocks = heap
        .collect(montage_core::ScanFilter::all().owner(owner))
        .unwrap();
    heap.close().unwrap();
    assert_eq!(blocks.len(), 8);
    blocks
}

/// The clean-shutdown flag's place in the superblock.
const CLEAN_FLAG: u64 = 0x80;
/// Bits of a block header (`docs/design.md`, "Block header").
const HEADER_BITS: u64 = 40 * 8;
/// The meta word's retired bit, which no checksum covers and recovery ignores.
const RETIRED_BIT: u64 = 32;
/// The meta word's copy of the low 20 bits of the header's epoch.
const META_EPOCH_BITS: std::ops::Range<u64> = 36..56;
/// The owner id, in the header's fifth word.
const OWNER_BITS: std::ops::Range<u64> = 0x20 * 8..0x24 * 8;

/// Damage to a durable block's header is never taken for free space: open fails with
/// `DamagedHeader`, naming the block (and the structure, unless the damage hit the owner
/// id), and leaves the file as it was. Every bit of every header of the map is tried, on a
/// heap closed cleanly and on the same heap marked as a crash leaves it. After a crash
/// recovery must drop, silently, a header the crash tore, which is one of an epoch that
/// was not durable yet: so there, and only there, a flip of the meta word's epoch bits
/// that names such an epoch loses the entry (the limit of the format, `docs/design.md`
/// INV-HDR-2); the test counts those and checks that nothing else is lost.
#[test]
fn a_damaged_header_is_reported_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("header.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    let blocks = eight_entries(&config);
    let closed = file_bytes(&path);
    let word = read_word(&path, EPOCH_WORD);
    let want: Vec<(u64, Vec<u8>)> = (0..8u64)
        .map(|key| (key, vec![key as u8; 30 + key as usize]))
        .collect();
    for clean in [true, false] {
        let mut pristine = closed.clone();
        if !clean {
            pristine[CLEAN_FLAG as usize] = 0;
        }
        let mut dropped = 0;
        for info in &blocks {
            let start = info.block.offset();
            for bit in 0..HEADER_BITS {
                let case = format!("clean {clean}, block {start:#x}, bit {bit}");
                let mut bytes = pristine.clone();
                bytes[(start + bit / 8) as usize] ^= 1 << (bit % 8);
                std::fs::write(&path, &bytes).unwrap();
                match Heap::open(&config) {
                    Err(Error::DamagedHeader { offset, structure }) => {
                        assert_eq!(offset, start, "{case}");
                        if !OWNER_BITS.contains(&bit) {
                            assert_eq!(structure, "map", "{case}");
                        }
                        assert_eq!(file_bytes(&path), bytes, "{case}: the file was changed");
                    }
                    Err(other) => panic!("{case}: expected DamagedHeader, got {other}"),
                    Ok(heap) => {
                        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
                        let mut got: Vec<_> = map.iter().map(Result::unwrap).collect();
                        got.sort();
                        if bit == RETIRED_BIT {
                            assert_eq!(got, want, "{case}");
                            continue;
                        }
                        // Only a header that could be a torn write may be dropped: after
                        // a crash, with its meta word naming an epoch past the durable cut.
                        let meta = u64::from_le_bytes(
                            bytes[start as usize..start as usize + 8]
                                .try_into()
                                .unwrap(),
                        );
                        let bits = (meta >> META_EPOCH_BITS.start) & 0xF_FFFF;
                        assert!(
                            !clean
                                && META_EPOCH_BITS.contains(&bit)
                                && (word - 1..=word).any(|e| e & 0xF_FFFF == bits),
                            "{case}: a damaged header was dropped silently"
                        );
                        assert_eq!(got.len(), want.len() - 1, "{case}");
                        assert!(got.iter().all(|entry| want.contains(entry)), "{case}");
                        dropped += 1;
                    }
                }
            }
        }
        eprintln!(
            "clean {clean}: {} header bits flipped, {dropped} taken for a torn write",
            blocks.len() as u64 * HEADER_BITS
        );
        // At most the two epoch bits whose flip names one of the two epochs past the cut.
        assert!(
            dropped <= 2 * blocks.len(),
            "clean {clean}: {dropped} dropped"
        );
    }
}

/// Damage to a durable payload, or to the checksum beside it, is never returned as data:
/// open fails with `DamagedPayload`, naming the structure and the block, and leaves the file
/// as it was. Every payload byte and trailer byte of every entry of the map is tried.
#[test]
fn a_damaged_payload_is_reported_with_its_structure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payload.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    let blocks = eight_entries(&config);
    let pristine = file_bytes(&path);
    let trailer = montage_core::limits::TRAILER_LEN;
    for info in &blocks {
        let start = info.block.payload_offset();
        for at in start..start + u64::from(info.len) + trailer {
            let mut bytes = pristine.clone();
            bytes[at as usize] ^= 0x10;
            std::fs::write(&path, &bytes).unwrap();
            match Heap::open(&config) {
                Err(Error::DamagedPayload { offset, structure }) => {
                    assert_eq!(offset, info.block.offset(), "byte {at:#x}");
                    assert_eq!(structure, "map");
                }
                Err(other) => panic!("byte {at:#x}: expected DamagedPayload, got {other}"),
                Ok(_) => panic!("byte {at:#x}: a damaged payload was accepted"),
            }
            assert_eq!(
                file_bytes(&path),
                bytes,
                "byte {at:#x}: the file was changed"
            );
        }
    }
    std::fs::write(&path, &pristine).unwrap();
    let heap = Heap::open(&config).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    assert_eq!(map.get(&7).unwrap(), Some(vec![7; 37]));
}

/// A payload changed in part, in place (by `write` or a field setter), gets its checksum
/// again with its epoch's write-back: the heap reopens with the changed bytes.
#[test]
fn a_payload_written_in_place_keeps_a_valid_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in-place.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    {
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("bytes").unwrap();
        heap.run_op(|op| {
            let block = op.alloc(owner, 0, b"hello, world")?;
            op.write(block, 0, b"J")?;
            op.write(block, 7, b"W")
        })
        .unwrap();
        heap.close().unwrap();
    }
    let heap = Heap::open(&config).unwrap();
    let owner = heap.lookup("bytes").unwrap();
    let blocks = heap
        .collect(montage_core::ScanFilter::all().owner(owner))
        .unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(heap.read_payload(blocks[0].block).unwrap(), b"Jello, World");
}

/// With `verify_reads`, a payload changed in part, in place, reads back at every epoch
/// after the change, in and out of operations: its checksum is stale until its epoch is
/// written back, and reads do not check it before then.
#[test]
fn verify_reads_never_flags_a_payload_changed_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in-place-verified.heap");
    let config = file_config(&path, MIB)
        .epoch_length(EpochLength::Manual)
        .verify_reads(true);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("bytes").unwrap();
    for round in 0..4u8 {
        let block = heap
            .run_op(|op| {
                let block = op.alloc(owner, 0, b"hello, world")?;
                op.write(block, 0, &[b'a' + round])?;
                Ok(block)
            })
            .unwrap();
        let mut want = b"hello, world".to_vec();
        want[0] = b'a' + round;
        for _ in 0..4 {
            assert_eq!(heap.read_payload(block).unwrap(), want);
            assert_eq!(heap.run_op(|op| op.read(block)).unwrap(), want);
            heap.advance_epoch().unwrap();
        }
    }
}

/// With `quarantine_damaged`, a heap with a damaged payload and a damaged header opens: the
/// map holds every other entry exactly, the report lists both blocks under the map's name,
/// the damaged bytes stay as they were, and later writes survive a reopen beside them.
#[test]
fn quarantine_opens_without_the_damaged_blocks_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quarantine.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    let blocks = eight_entries(&config);
    let mut bytes = file_bytes(&path);
    let (payload_block, header_block) = (&blocks[2], &blocks[5]);
    bytes[payload_block.block.payload_offset() as usize + 3] ^= 0x40;
    // The uid word of the header, changed to a uid no payload has (a change to another
    // live uid would quarantine that payload too, as a possible version of this one).
    bytes[header_block.block.offset() as usize + 0x15] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Heap::open(&config),
        Err(Error::DamagedHeader { .. } | Error::DamagedPayload { .. })
    ));
    let lost = |heap: &Heap| -> Vec<(u64, QuarantineReason)> {
        heap.recovery_report()
            .quarantined_in("map")
            .map(|q| (q.offset, q.why))
            .collect()
    };
    let want_lost = {
        let mut lost = vec![
            (
                payload_block.block.offset(),
                QuarantineReason::DamagedPayload,
            ),
            (header_block.block.offset(), QuarantineReason::DamagedHeader),
        ];
        lost.sort_unstable_by_key(|l| l.0);
        lost
    };
    let quarantine = config.clone().quarantine_damaged(true);
    {
        let heap = Heap::open(&quarantine).unwrap();
        assert_eq!(lost(&heap), want_lost);
        assert_eq!(heap.recovery_report().quarantined.len(), 2);
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
        let named: Vec<_> = map
            .quarantined()
            .iter()
            .map(|q| (q.offset, q.why))
            .collect();
        assert_eq!(named, want_lost);
        assert_eq!(map.len(), 6);
        for key in 0..8u64 {
            if let Some(value) = map.get(&key).unwrap() {
                assert_eq!(value, vec![key as u8; 30 + key as usize]);
            }
        }
        for key in 100..150u64 {
            map.put(key, vec![1; 40]).unwrap();
        }
        drop(map);
        heap.close().unwrap();
    }
    let after = file_bytes(&path);
    for block in [payload_block, header_block] {
        let range = block.block.offset() as usize..block.block.payload_offset() as usize + 40;
        assert_eq!(
            after[range.clone()],
            bytes[range],
            "a quarantined block was changed"
        );
    }
    let heap = Heap::open(&quarantine).unwrap();
    assert_eq!(lost(&heap), want_lost);
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    assert_eq!(map.len(), 56);
    assert_eq!(map.get(&120).unwrap(), Some(vec![1; 40]));
}

/// A quarantined payload takes every other version of itself out with it: after an update
/// whose old version is still on the media, damage to the new version must not bring the
/// old value back as if it were current.
#[test]
fn quarantine_does_not_return_an_older_version_of_a_damaged_payload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("versions.heap");
    let copy = dir.path().join("copy.heap");
    let config = file_config(&path, MIB).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    map.put(1, vec![1; 30]).unwrap();
    map.put(2, vec![2; 30]).unwrap();
    heap.advance_epoch().unwrap();
    heap.advance_epoch().unwrap();
    map.put(1, vec![9; 30]).unwrap();
    heap.advance_epoch().unwrap();
    heap.advance_epoch().unwrap();
    let owner = heap.lookup("map").unwrap();
    let versions = heap
        .collect(montage_core::ScanFilter::all().owner(owner))
        .unwrap();
    // Both versions of key 1 are on the media with valid headers: the old one waits for
    // reclamation, which needs more advances.
    assert_eq!(versions.len(), 3, "the old version was reclaimed already");
    let updated = versions
        .iter()
        .find(|a| {
            versions
                .iter()
                .any(|b| b.spec.uid == a.spec.uid && b.block != a.block)
        })
        .unwrap()
        .spec
        .uid;
    let newest = versions
        .iter()
        .filter(|info| info.spec.uid == updated)
        .max_by_key(|info| info.spec.epoch)
        .unwrap()
        .block;
    let mut bytes = file_bytes(&path);
    bytes[newest.payload_offset() as usize + 20] ^= 0x01;
    std::fs::write(&copy, &bytes).unwrap();
    drop(map);
    drop(heap);
    let heap = Heap::open(&file_config(&copy, MIB).quarantine_damaged(true)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    assert_eq!(map.get(&2).unwrap(), Some(vec![2; 30]));
    assert_eq!(map.get(&1).unwrap(), None, "a stale version came back");
    let why: Vec<_> = heap
        .recovery_report()
        .quarantined_in("map")
        .map(|q| q.why)
        .collect();
    assert!(why.contains(&QuarantineReason::DamagedPayload), "{why:?}");
    assert!(why.contains(&QuarantineReason::SameUid), "{why:?}");
}

/// With `verify_reads`, a payload damaged while the heap is open is an error when read,
/// naming the map, instead of wrong bytes; without it the damage is returned as data (which
/// is what the option is for). Payloads written and rewritten in the current epochs read
/// back without a false alarm.
#[test]
fn verify_reads_catches_damage_while_the_heap_is_open() {
    for verify in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("verify.heap");
        let config = file_config(&path, MIB)
            .epoch_length(EpochLength::Manual)
            .verify_reads(verify);
        let heap = Heap::create(&config).unwrap();
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
        let value = |key: u64| vec![key as u8; 40];
        for key in 0..8 {
            map.put(key, value(key)).unwrap();
            // Rewritten in place, in the same epoch: its checksum is rewritten with it.
            map.put(key, value(key)).unwrap();
        }
        for _ in 0..3 {
            heap.advance_epoch().unwrap();
        }
        let owner = heap.lookup("map").unwrap();
        let blocks = heap
            .collect(montage_core::ScanFilter::all().owner(owner))
            .unwrap();
        assert_eq!(blocks.len(), 8);
        // The last byte of one payload, changed behind the heap's back in the file it maps.
        let victim = &blocks[3];
        let at = victim.block.payload_offset() + u64::from(victim.len) - 1;
        let byte = file_bytes(&path)[at as usize];
        {
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(at)).unwrap();
            file.write_all(&[byte ^ 0x20]).unwrap();
        }
        let mut damaged = 0;
        for key in 0..8 {
            match map.get(&key) {
                Ok(Some(got)) if got == value(key) => {}
                Ok(other) => {
                    assert!(
                        !verify,
                        "key {key}: wrong data with verify_reads: {other:?}"
                    );
                    damaged += 1;
                }
                Err(Error::DamagedPayload { offset, structure }) => {
                    assert!(verify, "key {key}: an error without verify_reads");
                    assert_eq!(offset, victim.block.offset());
                    assert_eq!(structure, "map");
                    damaged += 1;
                }
                Err(other) => panic!("key {key}: {other}"),
            }
        }
        assert_eq!(damaged, 1, "verify {verify}");
        // New writes of the current epoch read back without a false alarm.
        for key in 100..110 {
            map.put(key, value(key)).unwrap();
            assert_eq!(map.get(&key).unwrap(), Some(value(key)));
        }
    }
}
