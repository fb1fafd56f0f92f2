//! Heaps opened read-only (`HeapConfig::read_only`): they recover and read as any open does,
//! refuse every change with `Error::ReadOnly`, share the file with other readers but not
//! with a writer, and never write the heap file or its journal.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::path::{Path, PathBuf};

use montage_core::raw::BlockSpec;
use montage_core::{BackendKind, Epoch, Error, Heap, HeapConfig, OwnerId, ScanFilter};

const TYPE: u64 = 0x7e57;

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(4 << 20)
        .max_size(4 << 20)
        .backend(BackendKind::Journal)
}

fn journal_of(path: &Path) -> PathBuf {
    Heap::journal_path(path)
}

/// The bytes of the heap file and of its journal (empty if it has none).
fn files(path: &Path) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(path).unwrap(),
        std::fs::read(journal_of(path)).unwrap_or_default(),
    )
}

/// A closed journal heap with one structure, "things", of `count` payloads.
fn make_heap(path: &Path, count: u8) {
    let heap = Heap::create(&config(path)).unwrap();
    let owner = heap.register("things").unwrap();
    for i in 0..count {
        heap.run_op(|op| op.alloc(owner, TYPE, &[i; 100])).unwrap();
    }
    heap.close().unwrap();
}

/// The payloads of "things", sorted.
fn things(heap: &Heap) -> Vec<Vec<u8>> {
    let owner = heap.lookup("things").unwrap();
    let mut found: Vec<Vec<u8>> = heap
        .collect(ScanFilter::all().owner(owner))
        .unwrap()
        .iter()
        .map(|info| heap.read_payload(info.block).unwrap())
        .collect();
    found.sort();
    found
}

#[test]
fn a_read_only_open_reads_everything_and_refuses_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.heap");
    make_heap(&path, 20);
    let before = files(&path);
    let expected: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 100]).collect();

    let reader = Heap::open(&config(&path).read_only(true)).unwrap();
    // Readers share the file.
    let second = Heap::open(&config(&path).read_only(true)).unwrap();
    assert_eq!(things(&reader), expected);
    assert_eq!(things(&second), expected);

    let owner = reader.register("things").unwrap();
    let block = reader
        .collect(ScanFilter::all().owner(owner))
        .unwrap()
        .first()
        .unwrap()
        .block;
    let refused = |result: montage_core::Result<()>| {
        assert!(
            matches!(result, Err(Error::ReadOnly)),
            "expected ReadOnly, got {result:?}"
        );
    };
    refused(reader.register("new").map(drop));
    refused(reader.run_op(|op| op.alloc(owner, TYPE, b"new")).map(drop));
    refused(reader.run_op(|op| op.update(block, b"changed")).map(drop));
    refused(
        reader
            .run_op(|op| op.copy_update(block, b"changed"))
            .map(drop),
    );
    refused(reader.run_op(|op| op.write(block, 0, b"x")).map(drop));
    refused(reader.run_op(|op| op.delete(block)));
    refused(
        reader
            .raw()
            .alloc_bytes(
                BlockSpec::new(Epoch::new(1), 1).owner(OwnerId::NONE),
                b"raw",
            )
            .map(drop),
    );
    refused(reader.raw().free(block));
    refused(reader.raw().write(block, 0, b"x"));
    // Refused changes changed nothing, and a sync and a close write nothing either.
    assert_eq!(things(&reader), expected);
    reader.sync().unwrap();
    reader.close().unwrap();
    second.close().unwrap();
    assert!(
        files(&path) == before,
        "a read-only open wrote to the files"
    );

    let heap = Heap::open(&config(&path)).unwrap();
    assert_eq!(things(&heap), expected);
    heap.close().unwrap();
}

#[test]
fn a_writer_and_readers_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.heap");
    make_heap(&path, 1);
    let writer = Heap::open(&config(&path)).unwrap();
    assert!(matches!(
        Heap::open(&config(&path).read_only(true)),
        Err(Error::Locked { .. })
    ));
    writer.close().unwrap();
    let reader = Heap::open(&config(&path).read_only(true)).unwrap();
    assert!(matches!(
        Heap::open(&config(&path)),
        Err(Error::Locked { .. })
    ));
    assert!(matches!(Heap::remove(&path), Err(Error::Locked { .. })));
    reader.close().unwrap();
    Heap::open(&config(&path)).unwrap().close().unwrap();
}

#[test]
fn a_heap_cannot_be_created_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.heap");
    assert!(matches!(
        Heap::create(&config(&path).read_only(true)),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(!path.exists() && !journal_of(&path).exists());
    assert!(matches!(
        Heap::create(&HeapConfig::in_memory(4 << 20).read_only(true)),
        Err(Error::InvalidConfig { .. })
    ));
}

#[test]
fn a_read_only_open_refuses_a_missing_journal_as_a_writer_does_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orphan.heap");
    make_heap(&path, 3);
    std::fs::remove_file(journal_of(&path)).unwrap();
    let before = files(&path);
    assert!(matches!(
        Heap::open(&config(&path).read_only(true)),
        Err(Error::Journal { .. })
    ));
    assert!(files(&path) == before);
}

#[test]
fn a_read_only_open_quarantines_a_damaged_block_without_repairing_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.heap");
    make_heap(&path, 5);
    // Flip a byte in the payload of one block.
    let victim = {
        let heap = Heap::open(&config(&path).read_only(true)).unwrap();
        let owner = heap.lookup("things").unwrap();
        let first = heap.collect(ScanFilter::all().owner(owner)).unwrap()[0];
        heap.close().unwrap();
        first.block
    };
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[victim.payload_offset() as usize + 10] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let before = files(&path);
    assert!(matches!(
        Heap::open(&config(&path).read_only(true)),
        Err(Error::DamagedPayload { .. })
    ));
    let reader = Heap::open(&config(&path).read_only(true).quarantine_damaged(true)).unwrap();
    let quarantined = &reader.recovery_report().quarantined;
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].offset, victim.offset());
    assert_eq!(things(&reader).len(), 4);
    reader.close().unwrap();
    assert!(
        files(&path) == before,
        "a read-only open wrote to the files"
    );
}
