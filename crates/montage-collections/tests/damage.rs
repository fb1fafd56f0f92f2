//! A damaged heap never gives wrong data: a heap holding a `HashMap<Vec<u8>, Vec<u8>>`
//! (1,500 entries), a `SortedMap<u64, u64>` (1,000) and a `Queue<String>` (300), closed
//! cleanly, is damaged in `N` ways per kind: a flipped bit, a rewritten byte or word in a
//! cache line that holds data, a flipped bit in the first 64 KiB (the metadata), the file cut
//! short, the file extended. Each damaged copy is opened and every entry read back; every
//! case must end in the exact data or in a typed error that leaves the file as it was, never
//! in wrong data without an error. A refused copy is opened again with
//! `quarantine_damaged`: if it opens, what it holds must be part of what was written, and
//! anything missing must be listed in the recovery report.
//!
//! `N` is `MONTAGE_DAMAGE_CASES` (default 100, so 600 cases); `-- --nocapture` prints the
//! outcomes per kind.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::path::Path;

use montage_collections::{HashMap, Queue, SortedMap};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, EpochLength, Heap, HeapConfig, Result};

const SIZE: u64 = 4 << 20;

/// Everything the heap holds, as read back.
#[derive(Debug, PartialEq)]
struct Contents {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    sorted: Vec<(u64, u64)>,
    queue: Vec<String>,
}

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(SIZE)
        .backend(BackendKind::Pmem)
        .epoch_length(EpochLength::Manual)
        .recovery_threads(1)
}

fn build(path: &Path) -> Result<Contents> {
    let heap = Heap::create(&config(path))?;
    let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(&heap, "map")?;
    let sorted: SortedMap<u64, u64> = SortedMap::open(&heap, "sorted")?;
    let queue: Queue<String> = Queue::open(&heap, "queue")?;
    for i in 0..1500u64 {
        map.insert(
            format!("key {i}").into_bytes(),
            vec![i as u8; (i % 200) as usize],
        )?;
        if i < 1000 {
            sorted.insert(i * 3, i ^ 0x5555)?;
        }
        if i < 300 {
            queue.push_back(format!("element {i}"))?;
        }
        if i % 100 == 0 {
            heap.advance_epoch()?;
        }
    }
    drop((map, sorted, queue));
    let contents = read(&heap)?;
    heap.close()?;
    Ok(contents)
}

fn read(heap: &Heap) -> Result<Contents> {
    let map: HashMap<Vec<u8>, Vec<u8>> = HashMap::open(heap, "map")?;
    let sorted: SortedMap<u64, u64> = SortedMap::open(heap, "sorted")?;
    let queue: Queue<String> = Queue::open(heap, "queue")?;
    Ok(Contents {
        map: map.iter().collect::<Result<_>>()?,
        sorted: sorted.iter().collect::<Result<_>>()?,
        queue: queue.to_vec()?,
    })
}

#[derive(Debug, Default)]
struct Tally {
    exact: u64,
    refused: u64,
    /// Of the refused: opened with `quarantine_damaged`, without wrong data.
    quarantined: u64,
    wrong: u64,
}

impl Contents {
    /// Whether everything this holds was written: entries with their values, elements in
    /// their order (some may be missing).
    fn is_part_of(&self, all: &Contents) -> bool {
        let mut queue = all.queue.iter();
        self.map.iter().all(|(k, v)| all.map.get(k) == Some(v))
            && self.sorted.iter().all(|entry| all.sorted.contains(entry))
            && self.queue.iter().all(|element| queue.any(|e| e == element))
    }
}

#[test]
fn a_damaged_heap_gives_the_exact_data_or_a_typed_error() -> Result<()> {
    let per_kind: u64 = std::env::var("MONTAGE_DAMAGE_CASES").map_or(100, |n| {
        n.parse()
            .expect("MONTAGE_DAMAGE_CASES: cases per kind of damage")
    });
    let dir = tempfile::tempdir().unwrap();
    let pristine_path = dir.path().join("pristine.heap");
    let want = build(&pristine_path)?;
    let pristine = std::fs::read(&pristine_path).unwrap();
    let used_lines: Vec<usize> = pristine
        .chunks(64)
        .enumerate()
        .filter(|(_, line)| line.iter().any(|&b| b != 0))
        .map(|(i, _)| i * 64)
        .collect();
    let kinds = [
        "bit flipped in a used line",
        "byte rewritten in a used line",
        "word rewritten in a used line",
        "bit flipped in the first 64 KiB",
        "file cut short",
        "file extended",
    ];
    let mut rng = SplitMix64::new(0x00da_3a9e);
    let path = dir.path().join("damaged.heap");
    let mut total = Tally::default();
    let mut wrong_cases = Vec::new();
    eprintln!(
        "{:<34} {:>6} {:>8} {:>12} {:>6}",
        "damage", "exact", "refused", "quarantined", "wrong"
    );
    for (kind, name) in kinds.iter().enumerate() {
        let mut tally = Tally::default();
        for case in 0..per_kind {
            let mut bytes = pristine.clone();
            let line = used_lines[rng.below_or_equal(used_lines.len() as u64 - 1) as usize];
            let within = rng.below_or_equal(63) as usize;
            match kind {
                0 => bytes[line + within] ^= 1 << rng.below_or_equal(7),
                1 => bytes[line + within] = rng.next_u64() as u8,
                2 => {
                    let at = line + within / 8 * 8;
                    bytes[at..at + 8].copy_from_slice(&rng.next_u64().to_le_bytes());
                }
                3 => {
                    let at = rng.below_or_equal(64 * 1024 * 8 - 1) as usize;
                    bytes[at / 8] ^= 1 << (at % 8);
                }
                4 => bytes.truncate(rng.below_or_equal(bytes.len() as u64 - 1) as usize),
                _ => bytes.resize(bytes.len() + 1 + rng.below_or_equal(1 << 20) as usize, 0),
            }
            std::fs::write(&path, &bytes).unwrap();
            let outcome = Heap::open(&config(&path)).and_then(|heap| read(&heap));
            match outcome {
                Ok(got) if got == want => tally.exact += 1,
                Ok(_) => {
                    tally.wrong += 1;
                    wrong_cases.push(format!("{name}, case {case}"));
                }
                Err(error) => {
                    assert!(
                        std::fs::read(&path).unwrap() == bytes,
                        "{name}, case {case}: refused ({error}) but the file was changed"
                    );
                    tally.refused += 1;
                    // With quarantine the same heap opens, or is refused again; what it
                    // holds then is part of what was written, and any loss is reported.
                    let quarantine = config(&path).quarantine_damaged(true);
                    if let Ok(heap) = Heap::open(&quarantine)
                        && let Ok(got) = read(&heap)
                    {
                        if !got.is_part_of(&want) {
                            wrong_cases.push(format!("{name}, case {case}, quarantined"));
                        } else if got != want && heap.recovery_report().quarantined.is_empty() {
                            wrong_cases.push(format!("{name}, case {case}, unreported loss"));
                        }
                        tally.quarantined += 1;
                    }
                }
            }
        }
        eprintln!(
            "{name:<34} {:>6} {:>8} {:>12} {:>6}",
            tally.exact, tally.refused, tally.quarantined, tally.wrong
        );
        total.exact += tally.exact;
        total.refused += tally.refused;
        total.quarantined += tally.quarantined;
        total.wrong += tally.wrong;
    }
    eprintln!(
        "{:<34} {:>6} {:>8} {:>12} {:>6}",
        "all", total.exact, total.refused, total.quarantined, total.wrong
    );
    assert!(
        wrong_cases.is_empty(),
        "wrong data, or a loss quarantine did not report, in {} cases: {wrong_cases:?}",
        wrong_cases.len()
    );
    Ok(())
}
