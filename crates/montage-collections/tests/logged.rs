//! `Logged<T>`: a DRAM structure made persistent by logging its operations. Reopening
//! replays them; on the power-failure simulator, the recovered structure is the live one
//! after a prefix of its calls, exactly those of the epochs the recovered clock covers, and
//! every synced call is in it; a panicking operation poisons only its handle; a lost record
//! is a typed error.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::sync::Mutex;

use montage_collections::{Logged, Replay};
use montage_core::sim::SplitMix64;
use montage_core::{Error, Heap, HeapConfig, ScanFilter, raw};
use montage_testkit::{crash_generation, for_each_seed, run_against_clock};

/// Balances by account; an operation adds an amount to one and returns the new balance.
#[derive(Default, Debug, PartialEq)]
struct Ledger(BTreeMap<u64, i64>);

impl Replay for Ledger {
    type Op = (u64, i64);
    type Output = i64;

    fn apply(&mut self, &(account, amount): &(u64, i64)) -> i64 {
        assert!(amount != i64::MIN, "the amount no ledger takes");
        let balance = self.0.entry(account).or_insert(0);
        *balance += amount;
        *balance
    }
}

/// The ids of the calls, in the order they were applied.
#[derive(Default, Debug, PartialEq)]
struct History(Vec<u64>);

impl Replay for History {
    type Op = u64;
    type Output = usize;

    fn apply(&mut self, &id: &u64) -> usize {
        self.0.push(id);
        self.0.len()
    }
}

#[test]
fn a_logged_structure_is_rebuilt_when_its_heap_is_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("ledger.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    assert_eq!(ledger.apply((1, 100)).unwrap(), 100);
    assert_eq!(ledger.apply((2, 50)).unwrap(), 50);
    assert_eq!(ledger.apply((1, -30)).unwrap(), 70);
    let live = ledger.read(|l| l.0.clone()).unwrap();
    assert_eq!(ledger.log_len(), 3);
    drop(ledger);
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    assert_eq!(ledger.read(|l| l.0.clone()).unwrap(), live);
    assert_eq!(ledger.log_len(), 3);
    assert_eq!(ledger.apply((2, 1)).unwrap(), 51);
    // A second handle of the same structure is refused while this one lives.
    assert!(matches!(
        Logged::<Ledger>::open(&heap, "ledger"),
        Err(Error::StructureOpen { .. })
    ));
    // Operations of another type are refused, and change nothing.
    drop(ledger);
    assert!(matches!(
        Logged::<History>::open(&heap, "ledger"),
        Err(Error::LayoutMismatch { .. })
    ));
    heap.close().unwrap();
}

#[test]
fn a_panicking_operation_poisons_its_handle_and_reopening_rebuilds_without_it() {
    let heap = Heap::create(&HeapConfig::in_memory(4 << 20)).unwrap();
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    ledger.apply((1, 10)).unwrap();
    let panicked =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ledger.apply((1, i64::MIN))));
    assert!(panicked.is_err());
    assert!(matches!(
        ledger.apply((1, 1)),
        Err(Error::Panicked { structure }) if structure == "ledger"
    ));
    assert!(matches!(ledger.read(|_| ()), Err(Error::Panicked { .. })));
    drop(ledger);
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    assert_eq!(ledger.read(|l| l.0[&1]).unwrap(), 10);
    assert_eq!(ledger.log_len(), 1);
    assert_eq!(ledger.apply((1, 5)).unwrap(), 15);
}

#[test]
fn a_lost_record_is_a_gap_and_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("gap.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    for id in 0..5 {
        history.apply(id).unwrap();
    }
    drop(history);
    heap.close().unwrap();
    // Free the record of the third call behind the structure's back.
    let heap = raw::open_with(&config, |_| raw::Verdict::Keep).unwrap();
    let owner = heap.lookup("history").unwrap();
    let third = heap
        .collect(ScanFilter::all().owner(owner))
        .unwrap()
        .into_iter()
        .find(|info| heap.read_payload(info.block).unwrap()[..8] == 2u64.to_le_bytes())
        .unwrap();
    heap.raw().free(third.block).unwrap();
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    assert!(matches!(
        Logged::<History>::open(&heap, "history"),
        Err(Error::Corrupted { what, .. }) if what.contains("gap")
    ));
    heap.close().unwrap();
}

const THREADS: usize = 3;
const CALLS_PER_THREAD: u64 = 40;

/// Three threads call one `Logged<History>` while the clock advances and syncs; the crash
/// comes at a random persistence event. The recovered history must be a prefix of the live
/// one, exactly the calls of the epochs the recovered clock covers; a second generation
/// continues from it.
fn run_seed(seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    for generation in 1..=2u64 {
        let history = Logged::<History>::open(&heap, "history").unwrap();
        let before = history.read(|h| h.0.clone()).unwrap();
        let epochs = Mutex::new(BTreeMap::new());
        let within = THREADS as u64 * CALLS_PER_THREAD * 8;
        let crashed = crash_generation(&heap, &mut rng, within, seed, || {
            run_against_clock(&heap, seed ^ generation, THREADS, |t, ended| {
                for i in 0..CALLS_PER_THREAD {
                    let id = (generation << 40) | ((t as u64) << 32) | i;
                    history.apply(id).unwrap();
                    let epoch = heap.last_op_epoch().unwrap();
                    ended.record(epoch);
                    epochs.lock().unwrap().insert(id, epoch.get());
                }
            })
        })
        .unwrap_or_else(|broken| panic!("generation {generation}: {broken}"));
        let live = history.read(|h| h.0.clone()).unwrap();
        drop(history);
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let got = Logged::<History>::open(&heap, "history")
            .unwrap()
            .read(|h| h.0.clone())
            .unwrap();
        let epochs = epochs.into_inner().unwrap();
        let cut = crashed.cut.get();
        assert!(
            got.starts_with(&before),
            "generation {generation}: the older calls"
        );
        assert_eq!(
            got[..],
            live[..got.len()],
            "generation {generation}: not a prefix of the live history"
        );
        let kept = epochs.values().filter(|&&e| e <= cut).count();
        assert_eq!(
            got.len() - before.len(),
            kept,
            "generation {generation}: the calls of epochs <= {cut}"
        );
        assert!(got[before.len()..].iter().all(|id| epochs[id] <= cut));
    }
}

#[test]
fn a_recovered_logged_structure_is_the_live_one_after_a_prefix_of_its_calls() {
    for_each_seed("logged", 24, run_seed);
}
