//! Repair (`HeapConfig::repair`) on real heap files damaged the ways disks and people damage
//! them: each repair keeps every payload the damage did not touch, drops (and reports) the
//! ones it did, says what it fixed, and leaves a heap that opens without repair.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use montage_core::sim::{CrashImage, SimMode, SplitMix64};
use montage_core::{BackendKind, Error, Heap, HeapConfig, PBlock, ScanFilter};
use montage_testkit::for_each_seed;
use proptest::prelude::*;

/// Where the first span table starts and where the data starts, in every heap of format 4.
const SPAN_TABLE: u64 = 0x4000;
const DATA: u64 = 0x1_0000;
const SPAN: u64 = 0x1_0000;

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(4 << 20)
        .max_size(4 << 20)
        .backend(BackendKind::Journal)
}

/// Each structure's payloads, by name.
type Contents = BTreeMap<String, Vec<Vec<u8>>>;

fn contents(heap: &Heap) -> Contents {
    heap.structures()
        .into_iter()
        .map(|(name, owner)| {
            let mut payloads: Vec<Vec<u8>> = heap
                .collect(ScanFilter::all().owner(owner).live())
                .unwrap()
                .iter()
                .map(|info| heap.read_payload(info.block).unwrap())
                .collect();
            payloads.sort();
            (name, payloads)
        })
        .collect()
}

/// A closed heap with "small" (20 payloads of 100 bytes) and "large" (one payload of
/// 150,000 bytes and three of 3,000); returns its contents and one block of each.
fn make_heap(path: &Path) -> (Contents, PBlock, PBlock) {
    let heap = Heap::create(&config(path)).unwrap();
    let small = heap.register("small").unwrap();
    let large = heap.register("large").unwrap();
    let mut first = None;
    for i in 0..20u8 {
        let block = heap.run_op(|op| op.alloc(small, 1, &[i; 100])).unwrap();
        first.get_or_insert(block);
    }
    let big = heap
        .run_op(|op| op.alloc(large, 2, &vec![0xB1; 150_000]))
        .unwrap();
    for i in 0..3u8 {
        heap.run_op(|op| op.alloc(large, 2, &[i; 3000])).unwrap();
    }
    let expected = contents(&heap);
    heap.close().unwrap();
    (expected, first.unwrap(), big)
}

fn flip(path: &Path, offset: u64, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= mask;
    std::fs::write(path, bytes).unwrap();
}

fn journal_of(path: &Path) -> PathBuf {
    Heap::journal_path(path)
}

/// Opens the heap with repair and returns its contents, the repairs (as text) and the
/// dropped blocks' offsets; then checks that it opens again without repair, the same.
fn repair(path: &Path) -> (Contents, Vec<String>, Vec<u64>) {
    let heap = Heap::open(&config(path).repair(true)).unwrap();
    let report = heap.recovery_report().clone();
    let found = contents(&heap);
    heap.close().unwrap();
    let again = Heap::open(&config(path)).unwrap();
    assert_eq!(
        contents(&again),
        found,
        "the repaired heap reopens differently"
    );
    assert!(again.recovery_report().quarantined.is_empty());
    again.close().unwrap();
    let repairs = report.repairs.iter().map(|r| r.what.clone()).collect();
    let dropped = report.dropped_damaged.iter().map(|q| q.offset).collect();
    (found, repairs, dropped)
}

/// `expected` without the payload `payload` of `structure`.
fn without(mut expected: Contents, structure: &str, payload: &[u8]) -> Contents {
    let payloads = expected.get_mut(structure).unwrap();
    let at = payloads.iter().position(|p| p == payload).unwrap();
    payloads.remove(at);
    expected
}

#[test]
fn a_damaged_block_header_drops_that_payload_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("header.heap");
    let (expected, first, _) = make_heap(&path);
    flip(&path, first.offset() + 0x18, 0x01);
    assert!(matches!(
        Heap::open(&config(&path)),
        Err(Error::DamagedHeader { .. })
    ));
    let (found, repairs, dropped) = repair(&path);
    assert!(repairs.is_empty(), "{repairs:?}");
    assert_eq!(dropped, [first.offset()]);
    assert_eq!(found, without(expected, "small", &[0; 100]));
}

#[test]
fn a_damaged_payload_drops_that_payload_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payload.heap");
    let (expected, _, big) = make_heap(&path);
    flip(&path, big.payload_offset() + 70_000, 0x80);
    let (found, _, dropped) = repair(&path);
    assert_eq!(dropped, [big.offset()]);
    assert_eq!(found, without(expected, "large", &vec![0xB1; 150_000]));
}

#[test]
fn a_superblock_damaged_in_one_byte_is_restored_by_its_checksum() {
    for at in [0x00, 0x09, 0x13, 0x30, 0x3f] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("superblock.heap");
        let (expected, _, _) = make_heap(&path);
        flip(&path, at, 0x24);
        assert!(Heap::open(&config(&path)).is_err(), "byte {at:#x}");
        let (found, repairs, dropped) = repair(&path);
        assert_eq!(found, expected, "byte {at:#x}");
        assert!(dropped.is_empty());
        assert_eq!(repairs.len(), 1, "{repairs:?}");
        assert!(repairs[0].contains("superblock"), "{repairs:?}");
    }
}

#[test]
fn a_superblock_damaged_in_two_bytes_cannot_be_repaired_and_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("superblock2.heap");
    make_heap(&path);
    flip(&path, 0x10, 0x01);
    flip(&path, 0x20, 0x01);
    let before = std::fs::read(&path).unwrap();
    assert!(Heap::open(&config(&path).repair(true)).is_err());
    assert!(std::fs::read(&path).unwrap() == before);
}

#[test]
fn a_directory_entry_damaged_in_one_byte_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("directory.heap");
    let (expected, _, _) = make_heap(&path);
    // Entry 1 ("large"): a byte of its name.
    flip(&path, 0x1000 + 64 + 2, 0x08);
    let (found, repairs, _) = repair(&path);
    assert_eq!(found, expected);
    assert!(repairs[0].contains("directory entry 1"), "{repairs:?}");
}

#[test]
fn a_directory_entry_beyond_correction_keeps_its_payloads_under_a_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("directory2.heap");
    let (mut expected, _, _) = make_heap(&path);
    flip(&path, 0x1000 + 64 + 1, 0x08);
    flip(&path, 0x1000 + 64 + 0x38, 0x08);
    let (found, repairs, dropped) = repair(&path);
    let large = expected.remove("large").unwrap();
    expected.insert("recovered-2".to_owned(), large);
    assert_eq!(found, expected);
    assert!(dropped.is_empty());
    assert!(repairs[0].contains("`recovered-2`"), "{repairs:?}");
}

/// A lost entry's new name must not be one the directory keeps, even in a later entry, and
/// even one that a one-byte correction restores (here a structure an earlier repair named
/// `recovered-2`).
#[test]
fn a_lost_entry_is_named_apart_from_every_name_the_directory_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("names.heap");
    let (mut expected, _, _) = make_heap(&path);
    let heap = Heap::open(&config(&path)).unwrap();
    let adopted = heap.register("recovered-2").unwrap();
    heap.run_op(|op| op.alloc(adopted, 3, b"adopted before"))
        .unwrap();
    expected.insert("recovered-2".to_owned(), vec![b"adopted before".to_vec()]);
    heap.close().unwrap();
    // Entry 1 ("large", owner 2) beyond correction; entry 2 ("recovered-2") in one byte of
    // its name.
    flip(&path, 0x1000 + 64 + 1, 0x08);
    flip(&path, 0x1000 + 64 + 0x38, 0x08);
    flip(&path, 0x1000 + 2 * 64 + 3, 0x10);
    let (found, repairs, dropped) = repair(&path);
    let large = expected.remove("large").unwrap();
    expected.insert("recovered-2-2".to_owned(), large);
    let names = |c: &Contents| c.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&found), names(&expected), "{repairs:?}");
    assert!(found == expected, "the structures' payloads differ");
    assert!(dropped.is_empty());
    assert!(
        repairs.iter().any(|r| r.contains("`recovered-2-2`")),
        "{repairs:?}"
    );
}

#[test]
fn a_span_table_entry_is_rebuilt_from_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("span.heap");
    let (expected, first, big) = make_heap(&path);
    for block in [first, big] {
        let span = (block.offset() - DATA) / SPAN;
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy.heap");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(journal_of(&path), journal_of(&copy)).unwrap();
        flip(&copy, SPAN_TABLE + span * 8 + 2, 0x40);
        assert!(matches!(
            Heap::open(&config(&copy)),
            Err(Error::Corrupted { .. })
        ));
        let (found, repairs, dropped) = repair(&copy);
        assert_eq!(found, expected, "span {span}");
        assert!(dropped.is_empty());
        assert!(
            repairs.len() == 1 && repairs[0].contains(&format!("span {span}'s table entry")),
            "{repairs:?}"
        );
    }
}

#[test]
fn a_truncated_file_is_extended_and_loses_only_what_lay_past_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("truncated.heap");
    let (expected, _, big) = make_heap(&path);
    // Cut inside the large payload's last span.
    let cut = big.payload_offset() + 140_000;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(cut).unwrap();
    drop(file);
    assert!(matches!(
        Heap::open(&config(&path)),
        Err(Error::Truncated { .. })
    ));
    let (found, repairs, dropped) = repair(&path);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
    assert!(repairs[0].contains("extended with zeros"), "{repairs:?}");
    // The large payload straddled the cut: its payload fails its checksum and it is
    // dropped. The 3,000-byte payloads were carved in a span after it, past the cut.
    assert_eq!(dropped, [big.offset()]);
    let span = (big.offset() - DATA) / SPAN + 3;
    assert!(
        repairs[1].contains(&format!(
            "1 carved span(s) lay past the end of the file (span {span})"
        )),
        "{repairs:?}"
    );
    assert_eq!(found["small"], expected["small"]);
    assert!(found["large"].is_empty());
}

#[test]
fn a_missing_or_damaged_journal_is_set_aside_and_the_heap_file_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.heap");
    let (expected, _, _) = make_heap(&path);
    std::fs::remove_file(journal_of(&path)).unwrap();
    let (found, repairs, _) = repair(&path);
    assert_eq!(found, expected);
    assert!(repairs[0].contains("missing"), "{repairs:?}");

    let path = dir.path().join("journal2.heap");
    let (expected, _, _) = make_heap(&path);
    // Both header slots of the journal.
    let mut journal = std::fs::read(journal_of(&path)).unwrap();
    journal[..0x1000].fill(0x5a);
    std::fs::write(journal_of(&path), journal).unwrap();
    let (found, repairs, _) = repair(&path);
    assert_eq!(found, expected);
    assert!(repairs[0].contains("damaged"), "{repairs:?}");
    let mut aside = journal_of(&path).into_os_string();
    aside.push(".damaged");
    assert!(Path::new(&aside).exists());
}

#[test]
fn an_invalid_clean_flag_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clean.heap");
    let (expected, _, _) = make_heap(&path);
    flip(&path, 0x80 + 3, 0x01);
    let (found, repairs, _) = repair(&path);
    assert_eq!(found, expected);
    assert!(repairs[0].contains("clean-shutdown flag"), "{repairs:?}");
}

#[test]
fn repair_and_read_only_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mix.heap");
    make_heap(&path);
    assert!(matches!(
        Heap::open(&config(&path).repair(true).read_only(true)),
        Err(Error::InvalidConfig { .. })
    ));
}

/// A heap image on the simulator with three structures, closed, then damaged: a block
/// header of "a", the directory entry of "b" beyond correction, and the span table entry
/// of the span "c" is carved in.
fn damaged_image(mode: SimMode) -> (Vec<u8>, HeapConfig) {
    let config = HeapConfig::simulated(4 << 20, mode).max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let mut first = Vec::new();
    for (name, len) in [("a", 100usize), ("b", 600), ("c", 5000)] {
        let owner = heap.register(name).unwrap();
        let blocks: Vec<PBlock> = (0..12u8)
            .map(|i| heap.run_op(|op| op.alloc(owner, 1, &vec![i; len])).unwrap())
            .collect();
        first.push(blocks[0]);
    }
    let sim = heap.simulator().unwrap();
    heap.close().unwrap();
    let mut bytes = sim.durable().into_bytes();
    bytes[first[0].offset() as usize + 0x18] ^= 0x01;
    bytes[0x1000 + 64 + 1] ^= 0x08;
    bytes[0x1000 + 64 + 0x38] ^= 0x08;
    let span = (first[2].offset() - DATA) / SPAN;
    bytes[(SPAN_TABLE + span * 8 + 2) as usize] ^= 0x40;
    (bytes, config)
}

#[test]
fn a_crash_during_repair_then_a_second_repair_gives_what_one_repair_gives() {
    // Not the journal's file model: a repaired image there would need its journal too.
    for mode in [SimMode::Prefix, SimMode::WordTear, SimMode::Eadr] {
        let (bytes, config) = damaged_image(mode);
        let repairing = config.clone().repair(true);
        let once = Heap::open_image(CrashImage::from_bytes(&bytes), &repairing).unwrap();
        let want = contents(&once);
        assert_eq!(want["recovered-2"].len(), 12);
        assert_eq!(want["a"].len(), 11);
        assert_eq!(want["c"].len(), 12);
        let report = once.recovery_report().clone();
        assert_eq!(report.repairs.len(), 2, "{:?}", report.repairs);
        assert_eq!(report.dropped_damaged.len(), 1);
        let events = once.simulator().unwrap().events();
        drop(once);
        for_each_seed(&format!("repair crash {mode:?}"), 24, |seed| {
            let step = SplitMix64::new(seed).below_or_equal(events);
            let interrupted = Heap::open_image(
                CrashImage::from_bytes(&bytes),
                &repairing.clone().sim_crash_at(step),
            )
            .unwrap();
            let image = interrupted.simulator().unwrap().crash(seed);
            drop(interrupted);
            let again = Heap::open_image(image, &repairing).unwrap();
            assert_eq!(
                contents(&again),
                want,
                "{mode:?}: crash at repair step {step}"
            );
            let sim = again.simulator().unwrap();
            drop(again);
            let plain = Heap::open_image(sim.durable(), &config).unwrap();
            assert_eq!(contents(&plain), want);
        });
    }
}

/// A sound, closed heap image of `mode` with the structures of [`damaged_image`], built once.
fn sound_image(mode: SimMode) -> &'static (Vec<u8>, HeapConfig, Contents) {
    static IMAGES: std::sync::OnceLock<Vec<(Vec<u8>, HeapConfig, Contents)>> =
        std::sync::OnceLock::new();
    let images = IMAGES.get_or_init(|| {
        [SimMode::Prefix, SimMode::WordTear, SimMode::Eadr]
            .into_iter()
            .map(|mode| {
                let config = HeapConfig::simulated(4 << 20, mode).max_size(4 << 20);
                let heap = Heap::create(&config).unwrap();
                for (name, len) in [("a", 100usize), ("b", 600), ("c", 5000), ("d", 70_000)] {
                    let owner = heap.register(name).unwrap();
                    for i in 0..6u8 {
                        heap.run_op(|op| op.alloc(owner, 1, &vec![i; len])).unwrap();
                    }
                }
                let want = contents(&heap);
                let sim = heap.simulator().unwrap();
                heap.close().unwrap();
                (sim.durable().into_bytes(), config, want)
            })
            .collect()
    });
    &images[match mode {
        SimMode::Prefix => 0,
        SimMode::WordTear => 1,
        _ => 2,
    }]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("MONTAGE_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(48)
    ))]

    /// Whatever bytes are damaged (in the metadata and the first spans), a repairing open
    /// returns a typed error or a heap that holds only payloads the sound heap held, which
    /// opens again without repair to the same contents.
    #[test]
    fn repair_never_panics_and_never_invents_a_payload(
        mode in prop::sample::select(vec![SimMode::Prefix, SimMode::WordTear, SimMode::Eadr]),
        flips in prop::collection::vec((0u64..DATA + 12 * SPAN, 1u8..=255), 1..8),
    ) {
        let (sound, config, original) = sound_image(mode);
        let mut bytes = sound.clone();
        for &(at, mask) in &flips {
            bytes[at as usize] ^= mask;
        }
        let repairing = config.clone().repair(true);
        if let Ok(heap) = Heap::open_image(CrashImage::from_bytes(&bytes), &repairing) {
            let found = contents(&heap);
            let sim = heap.simulator().unwrap();
            drop(heap);
            let known: Vec<&Vec<u8>> = original.values().flatten().collect();
            for payload in found.values().flatten() {
                prop_assert!(known.contains(&payload), "repair invented a payload of {} bytes", payload.len());
            }
            let plain = Heap::open_image(sim.durable(), config).unwrap();
            prop_assert_eq!(contents(&plain), found);
        }
    }
}

#[test]
fn damage_to_an_empty_entry_leaves_it_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.heap");
    let (expected, _, _) = make_heap(&path);
    // The valid words of directory slot 5 and registry slot 3, both empty: one byte, then
    // three bytes (beyond correction).
    flip(&path, 0x1000 + 5 * 64 + 0x39, 0x20);
    for at in [0x3a, 0x3c, 0x3e] {
        flip(&path, 0x2000 + 3 * 64 + at, 0x01);
    }
    let (found, repairs, dropped) = repair(&path);
    assert_eq!(found, expected, "no structure appeared");
    assert!(dropped.is_empty());
    assert_eq!(repairs.len(), 2, "{repairs:?}");
    assert!(repairs[0].contains("directory entry 5"), "{repairs:?}");
    assert!(
        repairs[1].contains("type registry entry 3 was empty"),
        "{repairs:?}"
    );
}
