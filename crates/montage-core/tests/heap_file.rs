//! File heaps: create, reopen, lock, and every bad input a user can hand to `open` or
//! `create`, each of which must be a typed error that leaves the file untouched.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::path::{Path, PathBuf};

use montage_core::Epoch;
use montage_core::limits::{DIRECTORY_CAPACITY, MIN_HEAP_SIZE, NAME_MAX};
use montage_core::raw;
use montage_core::raw::BlockSpec;
use montage_core::{Error, Heap, HeapConfig, OwnerId, ScanFilter};

const SIZE: u64 = 4 << 20;

/// These tests exercise the file and the raw block layer, whose blocks carry epochs the test
/// chose: recover keeping every valid block rather than applying the epoch rule.
fn open_raw(config: &HeapConfig) -> montage_core::Result<Heap> {
    raw::open_with(config, |_| montage_core::raw::Verdict::Keep)
}

fn heap_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("test.heap")
}

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path).size(SIZE)
}

/// A closed heap file holding three persisted payloads.
fn make_heap(path: &Path) {
    let heap = Heap::create(&config(path)).unwrap();
    let owner = heap.register("things").unwrap();
    for uid in 1..=3u64 {
        let payload = vec![uid as u8; uid as usize * 10];
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::new(1), uid).owner(owner), &payload)
            .unwrap();
        heap.raw().persist_block(block).unwrap();
    }
    heap.close().unwrap();
}

fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn reopened_heap_has_every_persisted_payload_and_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let heap = open_raw(&config(&path)).unwrap();
    assert!(heap.recovery_report().clean_shutdown);
    let owner = heap.lookup("things").unwrap();
    let blocks = heap.collect(ScanFilter::all().owner(owner)).unwrap();
    let got: Vec<(u64, Vec<u8>)> = blocks
        .iter()
        .map(|b| (b.spec.uid, heap.read_payload(b.block).unwrap()))
        .collect();
    let want: Vec<(u64, Vec<u8>)> = (1..=3u64)
        .map(|uid| (uid, vec![uid as u8; uid as usize * 10]))
        .collect();
    assert_eq!(got, want);
    assert_eq!(heap.structures(), vec![("things".to_owned(), owner)]);
}

#[test]
fn create_refuses_an_existing_file_and_leaves_it_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    std::fs::write(&path, b"precious user data").unwrap();
    let err = Heap::create(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    assert_eq!(file_bytes(&path), b"precious user data");
}

#[test]
fn open_rejects_random_bytes_as_bad_magic_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let mut rng = montage_core::sim::SplitMix64::new(7);
    let bytes: Vec<u8> = (0..SIZE).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::BadMagic), "{err}");
    assert_eq!(file_bytes(&path), bytes);
}

#[test]
fn open_rejects_an_empty_file_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    std::fs::write(&path, b"").unwrap();
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }), "{err}");
    assert!(file_bytes(&path).is_empty());
}

#[test]
fn open_rejects_a_truncated_heap_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(SIZE / 2).unwrap();
    drop(file);
    let before = file_bytes(&path);
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(
        matches!(err, Error::Truncated { expected, actual } if expected == SIZE && actual == SIZE / 2),
        "{err}"
    );
    assert_eq!(file_bytes(&path), before);
}

/// A heap written by a build of format 3 (no span count word) opens, keeps what it holds,
/// and stays at its size.
#[test]
fn a_version_3_heap_opens_at_its_size_and_does_not_grow() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let mut bytes = file_bytes(&path);
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    bytes[12..16].fill(0);
    let sum = crc32c::crc32c(&bytes[..0x40]);
    bytes[12..16].copy_from_slice(&sum.to_le_bytes());
    bytes[0x100..0x108].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let heap = open_raw(&HeapConfig::new(&path).max_size(4 * SIZE)).unwrap();
    let mut found: Vec<Vec<u8>> = heap
        .collect(ScanFilter::all())
        .unwrap()
        .into_iter()
        .map(|info| heap.read_payload(info.block).unwrap())
        .collect();
    found.sort();
    let expected: Vec<Vec<u8>> = (1..=3u64)
        .map(|uid| vec![uid as u8; uid as usize * 10])
        .collect();
    assert_eq!(found, expected);
    let stats = heap.stats();
    assert_eq!(stats.spans_limit, stats.spans);
    while heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 1000), 50_000)
        .is_ok()
    {}
    assert_eq!(heap.size(), SIZE);
    assert_eq!(heap.stats().growths, 0);
}

#[test]
fn open_rejects_another_format_version_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    // Version 1 (no payload checksums), version 2 (no epoch bits in the meta word) and a
    // future version alike.
    for version in [1u32, 2, 5] {
        let mut bytes = file_bytes(&path);
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = open_raw(&config(&path)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::FormatVersion { found, supported: 4 } if found == version
            ),
            "{err}"
        );
        assert_eq!(file_bytes(&path), bytes);
    }
}

#[test]
fn open_rejects_a_damaged_superblock_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let mut bytes = file_bytes(&path);
    bytes[0x28] ^= 0x01; // span count
    std::fs::write(&path, &bytes).unwrap();
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Corrupted { .. }), "{err}");
    assert_eq!(file_bytes(&path), bytes);
}

#[test]
fn open_rejects_a_damaged_span_table_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let mut bytes = file_bytes(&path);
    bytes[0x4000] ^= 0x10; // the first span's entry
    std::fs::write(&path, &bytes).unwrap();
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(
        matches!(err, Error::Corrupted { offset: 0x4000, .. }),
        "{err}"
    );
    assert_eq!(file_bytes(&path), bytes);
}

#[test]
fn create_rejects_sizes_that_do_not_fit_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    for size in [0, 4096, MIN_HEAP_SIZE - 4096, MIN_HEAP_SIZE + 1, u64::MAX] {
        let err = Heap::create(&HeapConfig::new(&path).size(size)).unwrap_err();
        assert!(matches!(err, Error::BadSize { .. }), "{size}: {err}");
        assert!(!path.exists());
    }
    assert!(Heap::create(&HeapConfig::new(&path).size(MIN_HEAP_SIZE)).is_ok());
}

#[test]
fn a_second_open_in_this_process_is_locked_out_until_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let heap = open_raw(&config(&path)).unwrap();
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    heap.close().unwrap();
    assert!(open_raw(&config(&path)).is_ok());
}

#[test]
fn a_full_heap_returns_out_of_space_and_recovers_after_a_free() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let size = MIN_HEAP_SIZE * 2;
    let heap = Heap::create(&HeapConfig::new(&path).size(size).max_size(size)).unwrap();
    let mut blocks = Vec::new();
    let err = loop {
        match heap
            .raw()
            .alloc(BlockSpec::new(Epoch::new(1), blocks.len() as u64), 1000)
        {
            Ok(block) => blocks.push(block),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(
            err,
            Error::OutOfSpace {
                requested: 1000,
                free_spans: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(!blocks.is_empty());
    let big = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 0), 1 << 20)
        .unwrap_err();
    assert!(matches!(big, Error::OutOfSpace { .. }), "{big}");
    heap.raw().free(blocks.pop().unwrap()).unwrap();
    heap.raw()
        .alloc(BlockSpec::new(Epoch::new(1), 99), 1000)
        .unwrap();
}

#[test]
fn large_payloads_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let heap = Heap::create(&config(&path)).unwrap();
    let payload: Vec<u8> = (0..(1u32 << 20) + 17).map(|i| (i % 251) as u8).collect();
    let block = heap
        .raw()
        .alloc_bytes(BlockSpec::new(Epoch::new(3), 5), &payload)
        .unwrap();
    heap.raw().persist_block(block).unwrap();
    let free_with_block = heap.stats().free_spans;
    heap.close().unwrap();

    let heap = open_raw(&config(&path)).unwrap();
    let found = heap.collect(ScanFilter::all()).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len as usize, payload.len());
    assert_eq!(heap.read_payload(found[0].block).unwrap(), payload);
    assert_eq!(heap.stats().free_spans, free_with_block);
}

#[test]
fn the_spans_of_a_freed_large_block_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    // Room for 20 spans: one block of 17 spans fits, two do not.
    let size = 21 * montage_core::limits::SPAN_SIZE;
    let heap = Heap::create(&HeapConfig::new(&path).size(size).max_size(size)).unwrap();
    let len = (1 << 20) + 17;
    let first = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 1), len)
        .unwrap();
    let second = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 2), len)
        .unwrap_err();
    assert!(matches!(second, Error::OutOfSpace { .. }), "{second}");
    heap.raw().free(first).unwrap();
    let again = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 3), len)
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(heap.info(again).unwrap().spec.uid, 3);
}

#[test]
fn spans_freed_by_another_thread_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let size = 21 * montage_core::limits::SPAN_SIZE;
    let heap = Heap::create(&HeapConfig::new(&path).size(size).max_size(size)).unwrap();
    let len = (1 << 20) + 17;
    let first = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 1), len)
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| heap.raw().free(first).unwrap());
    });
    // The freeing thread left its invalidation pending; the allocator drains it.
    assert_eq!(
        heap.raw()
            .alloc(BlockSpec::new(Epoch::new(1), 2), len)
            .unwrap(),
        first
    );
    // Small blocks too: fill the heap, free everything from another thread, fill again.
    heap.raw().free(first).unwrap();
    let mut small = Vec::new();
    while let Ok(block) = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(2), small.len() as u64), 100)
    {
        small.push(block);
    }
    let count = small.len();
    std::thread::scope(|s| {
        s.spawn(|| small.drain(..).for_each(|b| heap.raw().free(b).unwrap()));
    });
    let mut again = 0;
    while heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(3), again), 100)
        .is_ok()
    {
        again += 1;
    }
    assert_eq!(again as usize, count);
}

#[test]
fn block_handles_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let heap = Heap::create(&config(&path)).unwrap();
    let block = heap
        .raw()
        .alloc_bytes(BlockSpec::new(Epoch::new(1), 1), b"abc")
        .unwrap();
    assert_eq!(heap.block_at(block.offset()).unwrap(), block);
    assert!(matches!(
        heap.block_at(block.offset() + 8),
        Err(Error::InvalidBlock { .. })
    ));
    assert!(matches!(heap.block_at(0), Err(Error::InvalidBlock { .. })));
    assert!(matches!(
        heap.block_at(u64::MAX),
        Err(Error::InvalidBlock { .. })
    ));
    let capacity = heap.info(block).unwrap().capacity;
    assert!(heap.raw().write(block, capacity - 1, b"x").is_ok());
    assert!(matches!(
        heap.raw().write(block, capacity, b"x"),
        Err(Error::OutOfBounds { .. })
    ));
    let mut buf = [0u8; 2];
    assert!(matches!(
        heap.raw().read(block, u64::MAX, &mut buf),
        Err(Error::OutOfBounds { .. })
    ));
    heap.raw().free(block).unwrap();
    assert!(matches!(
        heap.raw().free(block),
        Err(Error::InvalidBlock { .. })
    ));
    assert!(matches!(heap.info(block), Err(Error::InvalidBlock { .. })));
}

#[test]
fn the_directory_holds_64_names_and_rejects_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let heap = Heap::create(&config(&path)).unwrap();
    let mut owners = Vec::new();
    for i in 0..DIRECTORY_CAPACITY {
        owners.push(
            heap.register(&format!("structure-{i:02}-{}", "x".repeat(18)))
                .unwrap(),
        );
    }
    assert_eq!(
        heap.register("structure-00-xxxxxxxxxxxxxxxxxx").unwrap(),
        owners[0]
    );
    assert!(matches!(
        heap.register("one-too-many"),
        Err(Error::DirectoryFull { capacity: 64 })
    ));
    assert!(matches!(heap.register(""), Err(Error::BadName { .. })));
    assert!(matches!(
        heap.register(&"n".repeat(NAME_MAX + 1)),
        Err(Error::BadName { .. })
    ));
    assert!(matches!(
        heap.register("nul\0byte"),
        Err(Error::BadName { .. })
    ));
    assert!(owners.iter().all(|o| *o != OwnerId::NONE));
    heap.close().unwrap();
    let heap = open_raw(&config(&path)).unwrap();
    let names = heap.structures();
    assert_eq!(names.len(), DIRECTORY_CAPACITY);
    assert_eq!(names.iter().map(|(_, o)| *o).collect::<Vec<_>>(), owners);
}

#[test]
fn every_backend_creates_and_reopens_a_file_heap() {
    use montage_core::BackendKind;
    let dir = tempfile::tempdir().unwrap();
    for (i, backend) in [
        BackendKind::Pmem,
        BackendKind::Eadr,
        BackendKind::Journal,
        BackendKind::Volatile,
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("backend-{i}.heap"));
        let config = HeapConfig::new(&path).size(SIZE).backend(backend);
        let heap = Heap::create(&config).unwrap();
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::new(1), 1), b"payload")
            .unwrap();
        heap.raw().persist_block(block).unwrap();
        heap.close().unwrap();
        let heap = open_raw(&config).unwrap();
        let found = heap.collect(ScanFilter::all()).unwrap();
        assert_eq!(found.len(), 1, "{backend:?}");
        assert_eq!(heap.read_payload(found[0].block).unwrap(), b"payload");
    }
}

fn journal_of(path: &Path) -> PathBuf {
    Heap::journal_path(path)
}

#[test]
fn a_journal_heap_without_its_journal_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let journal = journal_of(&path);
    assert!(journal.exists(), "the default backend keeps a journal");
    std::fs::rename(&journal, dir.path().join("elsewhere")).unwrap();
    let before = file_bytes(&path);
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Journal { .. }), "{err:?}");
    assert_eq!(file_bytes(&path), before);
    assert!(!journal.exists());
}

#[test]
fn another_heaps_journal_is_refused_and_both_files_are_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.heap"), dir.path().join("b.heap"));
    make_heap(&a);
    make_heap(&b);
    std::fs::copy(journal_of(&b), journal_of(&a)).unwrap();
    let (heap_before, journal_before) = (file_bytes(&a), file_bytes(&journal_of(&a)));
    let err = open_raw(&config(&a)).unwrap_err();
    assert!(
        matches!(&err, Error::Journal { what, .. } if what.contains("another heap")),
        "{err:?}"
    );
    assert_eq!(file_bytes(&a), heap_before);
    assert_eq!(file_bytes(&journal_of(&a)), journal_before);
}

#[test]
fn a_damaged_journal_header_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let journal = journal_of(&path);
    let mut bytes = file_bytes(&journal);
    // Both header slots.
    bytes[0x10] ^= 1;
    bytes[0x210] ^= 1;
    std::fs::write(&journal, &bytes).unwrap();
    let before = file_bytes(&path);
    let err = open_raw(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Journal { .. }), "{err:?}");
    assert_eq!(file_bytes(&path), before);
    assert_eq!(file_bytes(&journal), bytes);
}

#[test]
fn switching_backends_moves_the_heap_on_and_off_its_journal() {
    use montage_core::BackendKind;
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    // On another backend (the heap file holds its bytes then) the journal is replayed,
    // folded and removed.
    let heap = open_raw(&config(&path).backend(BackendKind::Pmem)).unwrap();
    assert_eq!(heap.collect(ScanFilter::all()).unwrap().len(), 3);
    heap.close().unwrap();
    assert!(!journal_of(&path).exists());
    // Back on the journal: a new one, and the same payloads.
    let heap = open_raw(&config(&path)).unwrap();
    assert!(journal_of(&path).exists());
    assert_eq!(heap.collect(ScanFilter::all()).unwrap().len(), 3);
}

#[test]
fn create_refuses_a_leftover_journal_and_leaves_no_heap() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    std::fs::write(journal_of(&path), b"someone else's").unwrap();
    let err = Heap::create(&config(&path)).unwrap_err();
    assert!(matches!(err, Error::Journal { .. }), "{err:?}");
    assert!(!path.exists());
    assert_eq!(file_bytes(&journal_of(&path)), b"someone else's");
}

#[test]
fn remove_deletes_the_heap_and_its_journal_but_not_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let heap = Heap::create(&config(&path)).unwrap();
    let err = Heap::remove(&path).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err:?}");
    assert!(path.exists() && journal_of(&path).exists());
    heap.close().unwrap();
    Heap::remove(&path).unwrap();
    assert!(!path.exists() && !journal_of(&path).exists());
    // Nothing is in the way of a new heap now, and removing nothing is no error.
    Heap::create(&config(&path)).unwrap().close().unwrap();
    Heap::remove(&path).unwrap();
    Heap::remove(&path).unwrap();
}

#[test]
fn usage_counts_every_structures_and_every_classs_live_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    let manual = config(&path)
        .max_size(SIZE)
        .epoch_length(montage_core::EpochLength::Manual);
    let heap = Heap::create(&manual).unwrap();
    let small = heap.register("small").unwrap();
    let large = heap.register("large").unwrap();
    let mut doomed = Vec::new();
    for i in 0..12u8 {
        let block = heap.run_op(|op| op.alloc(small, 1, &[i; 100])).unwrap();
        if i >= 10 {
            doomed.push(block);
        }
    }
    for i in 0..3u8 {
        heap.run_op(|op| op.alloc(large, 2, &vec![i; 40_000]))
            .unwrap();
    }
    heap.raw()
        .alloc_bytes(BlockSpec::new(Epoch::new(1), 1 << 40), &[7; 10])
        .unwrap();
    // Deleted in the epoch they were made in: invalid at once, no anti-block.
    heap.run_op(|op| doomed.iter().try_for_each(|&b| op.delete(b)))
        .unwrap();
    let usage = heap.usage(|_| {}).unwrap();
    let by_name = |name: &str| {
        usage
            .structures
            .iter()
            .find(|s| s.name == name)
            .map(|s| (s.blocks, s.bytes))
    };
    assert_eq!(by_name("small"), Some((10, 1000)));
    assert_eq!(by_name("large"), Some((3, 120_000)));
    assert_eq!((usage.unowned.blocks, usage.unowned.bytes), (1, 10));
    assert_eq!(
        (usage.large.live_blocks, usage.large.live_bytes),
        (3, 120_000)
    );
    let live: u64 = usage.classes.iter().map(|c| c.live_blocks).sum();
    assert_eq!(live, 11);
    let carved: u64 = usage.classes.iter().map(|c| c.spans).sum();
    assert_eq!(carved + usage.large.spans + usage.free_spans, usage.spans);
    assert!(usage.classes.iter().all(|c| c.live_blocks <= c.blocks));
    heap.close().unwrap();
}

/// A heap larger than its file system's free space is refused with an error that says so,
/// before anything is written, and leaves no file behind.
#[test]
fn a_heap_larger_than_its_file_system_is_refused_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    // 64 TiB: more than any disk these tests run on has free.
    let size = 64 << 40;
    let err = Heap::create(&HeapConfig::new(&path).size(size).max_size(size)).unwrap_err();
    match &err {
        Error::NoDiskSpace {
            path: named,
            needed,
            available,
        } => {
            assert_eq!(named, &path);
            assert!(*needed >= size && available < needed, "{err}");
        }
        other => panic!("expected NoDiskSpace, got {other:?}"),
    }
    assert!(err.to_string().contains("bytes free"), "{err}");
    assert!(!path.exists(), "the refused heap's file was left behind");
    // A heap that fits is created in the same place afterwards.
    Heap::create(&config(&path)).unwrap();
}
