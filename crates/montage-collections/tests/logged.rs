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
use montage_core::{BlockKind, Error, Heap, HeapConfig, ScanFilter, raw};
use montage_testkit::{crash_generation, for_each_seed, run_against_clock};

/// Balances by account; an operation adds an amount to one and returns the new balance.
#[derive(Default, Debug, PartialEq)]
struct Ledger(BTreeMap<u64, i64>);

impl Replay for Ledger {
    type Op = (u64, i64);
    type Output = i64;

    fn apply(&mut self, (account, amount): (u64, i64)) -> i64 {
        assert!(amount != i64::MIN, "the amount no ledger takes");
        let balance = self.0.entry(account).or_insert(0);
        *balance += amount;
        *balance
    }
}

/// The ids of the calls, in the order they were applied; snapshots in serde's form.
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct History(Vec<u64>);

impl Replay for History {
    type Op = u64;
    type Output = usize;

    fn apply(&mut self, id: u64) -> usize {
        self.0.push(id);
        self.0.len()
    }

    montage_collections::serde_snapshots!();
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
                    // One thread also compacts now and then, while the others call.
                    if t == 0 && i % 8 == 7 {
                        history.compact().unwrap();
                    }
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
        assert!(
            history.verify_replay().unwrap(),
            "replay differs from the live history"
        );
        drop(history);
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let recovered = Logged::<History>::open(&heap, "history").unwrap();
        let got = recovered.read(|h| h.0.clone()).unwrap();
        if recovered.log_len() < recovered.calls() {
            // ORDERING: a count read after every seed ran.
            FROM_SNAPSHOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        drop(recovered);
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
    // The crashes kept a snapshot in some generations: recovery loaded one and replayed
    // the records after it.
    // ORDERING: as above.
    assert!(FROM_SNAPSHOT.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// Generations whose recovered structure came from a snapshot.
static FROM_SNAPSHOT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn a_snapshot_replaces_the_records_before_it_and_opening_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("snap.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    for id in 0..100 {
        history.apply(id).unwrap();
    }
    assert_eq!(history.log_len(), 100);
    assert!(history.compact().unwrap());
    assert!(!history.compact().unwrap(), "nothing new to compact");
    assert_eq!((history.log_len(), history.calls()), (0, 100));
    for id in 100..110 {
        history.apply(id).unwrap();
    }
    let live = history.read(|h| h.0.clone()).unwrap();
    assert!(history.verify_replay().unwrap());
    drop(history);
    let owner = heap.lookup("history").unwrap();
    // The structure's payloads, not the anti-blocks of the deletions.
    let payloads = |heap: &Heap| {
        heap.collect(ScanFilter::all().owner(owner).live())
            .unwrap()
            .iter()
            .filter(|info| info.spec.kind != BlockKind::Delete)
            .count()
    };
    // Ten records, one chunk and one commit.
    assert_eq!(payloads(&heap), 12);
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.clone()).unwrap(), live);
    assert_eq!((history.log_len(), history.calls()), (10, 110));
    // A second snapshot replaces the first.
    assert!(history.compact().unwrap());
    drop(history);
    assert_eq!(payloads(&heap), 2);
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.len()).unwrap(), 110);
    drop(history);
    heap.close().unwrap();
}

#[test]
fn a_snapshot_larger_than_a_chunk_is_written_in_chunks() {
    let heap = Heap::create(&HeapConfig::in_memory(16 << 20)).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    // 30,000 ids of up to 9 bytes each in postcard's varints: more than four chunks.
    for id in 0..30_000u64 {
        history.apply(id << 40).unwrap();
    }
    assert!(history.compact().unwrap());
    drop(history);
    let owner = heap.lookup("history").unwrap();
    let parts = heap
        .collect(ScanFilter::all().owner(owner).live())
        .unwrap()
        .len();
    assert!(parts >= 5, "{parts} payloads");
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.len()).unwrap(), 30_000);
    assert_eq!(history.read(|h| h.0[29_999]).unwrap(), 29_999 << 40);
}

#[test]
fn a_structure_without_snapshots_says_so() {
    let heap = Heap::create(&HeapConfig::in_memory(4 << 20)).unwrap();
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    ledger.apply((1, 1)).unwrap();
    assert!(matches!(ledger.compact(), Err(Error::Unsupported { .. })));
    assert_eq!(ledger.log_len(), 1);
}

/// A structure whose `apply` is not deterministic: it counts the calls of the process.
#[derive(Default, PartialEq, Debug)]
struct Careless(u64);

static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Replay for Careless {
    type Op = ();
    type Output = ();

    fn apply(&mut self, (): ()) {
        // ORDERING: a counter of this test's own.
        self.0 = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn verify_replay_finds_an_apply_that_is_not_deterministic() {
    let heap = Heap::create(&HeapConfig::in_memory(4 << 20)).unwrap();
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    ledger.apply((3, 4)).unwrap();
    assert!(ledger.verify_replay().unwrap());
    let careless = Logged::<Careless>::open(&heap, "careless").unwrap();
    careless.apply(()).unwrap();
    careless.apply(()).unwrap();
    assert!(!careless.verify_replay().unwrap());
}

/// A structure whose state outgrows its log: an operation appends that many numbers.
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Bulk(Vec<u64>);

impl Replay for Bulk {
    type Op = u32;
    type Output = ();

    fn apply(&mut self, count: u32) {
        let start = self.0.len() as u64;
        self.0
            .extend((start..).take(count as usize).map(|n| n << 20));
    }

    montage_collections::serde_snapshots!();
}

#[test]
fn a_snapshot_the_heap_cannot_hold_is_abandoned_and_the_log_kept() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("full.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let bulk = Logged::<Bulk>::open(&heap, "bulk").unwrap();
    // A million numbers of about four bytes each: a snapshot larger than the heap.
    for _ in 0..5 {
        bulk.apply(200_000).unwrap();
    }
    assert!(matches!(bulk.compact(), Err(Error::OutOfSpace { .. })));
    assert_eq!((bulk.log_len(), bulk.calls()), (5, 5));
    assert!(bulk.verify_replay().unwrap());
    // The abandoned snapshot's chunks are gone: the heap has room again.
    bulk.apply(1).unwrap();
    let owner = heap.lookup("bulk").unwrap();
    let payloads = heap
        .collect(ScanFilter::all().owner(owner).live())
        .unwrap()
        .iter()
        .filter(|info| info.spec.kind != BlockKind::Delete)
        .count();
    assert_eq!(payloads, 6);
    drop(bulk);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let bulk = Logged::<Bulk>::open(&heap, "bulk").unwrap();
    assert_eq!(bulk.read(|b| b.0.len()).unwrap(), 1_000_001);
    assert_eq!(bulk.log_len(), 6);
    drop(bulk);
    heap.close().unwrap();
}
