//! Multi-threaded stress of the epoch runtime on real threads and a real clock: threads run
//! operations on shared keys while the background advancer ticks every millisecond and
//! threads call `sync` now and then; after a clean close the reopened heap must hold exactly
//! the final state.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use common::{Key, kv_state, write_key};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, EpochLength, Heap, HeapConfig, OwnerId};

const KEYS: u64 = 64;
#[derive(Default)]
struct Slot {
    key: Key,
    value: Option<u64>,
}

fn run(backend: BackendKind, threads: u64, ops: u64) {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("stress.heap"))
        .size(16 << 20)
        .backend(backend)
        .epoch_length(EpochLength::Every(Duration::from_millis(1)));
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("kv").unwrap();
    let slots: Vec<Mutex<Slot>> = (0..KEYS).map(|_| Mutex::new(Slot::default())).collect();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (heap, slots) = (&heap, &slots);
            s.spawn(move || {
                let mut rng = SplitMix64::new(t);
                for _ in 0..ops {
                    let key = rng.next_u64() % KEYS;
                    let value = (!rng.next_u64().is_multiple_of(5)).then(|| rng.next_u64());
                    write(heap, owner, &slots[key as usize], key, value);
                    if rng.next_u64().is_multiple_of(200) {
                        heap.sync().unwrap();
                    }
                }
            });
        }
    });
    let want: BTreeMap<u64, u64> = slots
        .iter()
        .enumerate()
        .filter_map(|(k, s)| s.lock().unwrap().value.map(|v| (k as u64, v)))
        .collect();
    assert!(heap.advances() > 0, "the background clock never advanced");
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let got: BTreeMap<u64, u64> = kv_state(&heap, owner)
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect();
    assert_eq!(got, want);
}

fn write(heap: &Heap, owner: OwnerId, slot: &Mutex<Slot>, key: u64, value: Option<u64>) {
    heap.run_op(|op| {
        let mut slot = slot.lock().unwrap();
        write_key(op, owner, &mut slot.key, key, value)?;
        slot.value = value;
        Ok(())
    })
    .unwrap();
}

#[test]
fn threads_and_a_fast_clock_on_pmem_leave_exactly_the_final_state() {
    run(BackendKind::Pmem, 4, 25_000);
}

#[test]
fn threads_and_a_fast_clock_on_the_journal_leave_exactly_the_final_state() {
    run(BackendKind::Journal, 2, 5_000);
}

/// A scan of live blocks must not show a deleted block, even when reclamation invalidates
/// it (and hands it out again) while the scan runs: structures rebuild from these scans on a
/// heap that keeps running (a structure reopened in the same process).
#[test]
fn a_live_scan_never_shows_a_deleted_block_while_reclamation_runs() {
    use montage_core::sim::SimMode;
    use montage_core::{BlockKind, ScanFilter};

    // The simulator's bookkeeping slows each store, which widens the race this looks for.
    let config = HeapConfig::simulated(8 << 20, SimMode::Prefix)
        .epoch_length(EpochLength::Every(Duration::from_micros(50)));
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("x").unwrap();
    for round in 0..300 {
        let blocks: Vec<_> = (0..20u8)
            .map(|i| heap.run_op(|op| op.alloc(owner, 1, &[i; 24])).unwrap())
            .collect();
        for (i, &block) in blocks.iter().enumerate() {
            heap.run_op(|op| op.delete(block)).unwrap();
            if i % 5 == 4 || i == blocks.len() - 1 {
                let deleted: Vec<_> = heap
                    .collect(ScanFilter::all().owner(owner).live())
                    .unwrap()
                    .into_iter()
                    .filter(|info| info.spec.kind != BlockKind::Delete)
                    .map(|info| info.block)
                    .collect();
                assert!(
                    !deleted.iter().any(|b| blocks[..=i].contains(b)),
                    "round {round}: deleted blocks seen live: {deleted:?}"
                );
            }
        }
    }
}
