//! `Logged<T>`: a DRAM structure made persistent by logging its operations. Reopening
//! replays them; on the power-failure simulator, the recovered structure is the live one
//! after a prefix of its calls, exactly those of the epochs the recovered clock covers, and
//! every synced call is in it, unsharded and sharded, with snapshots taken by hand and by
//! the background policy; a panicking operation poisons only its handle; a lost record is a
//! typed error; closing leaves a snapshot that new operations open, while a log of old ones
//! is refused. A sequential model (proptest) runs random calls, compactions, clock advances,
//! syncs and closes with a power failure at a random persistence event among them, in every
//! simulator mode, with the clock also moving by itself.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds (and model cases); `MONTAGE_CRASH_SEED=S` replays
//! one seed.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;
use std::sync::Mutex;

use montage_collections::logged::SnapshotPolicy;
use montage_collections::{
    Change, Graph, HashMap, Logged, LoggedShards, Queue, Replay, Together, together,
};
use montage_core::sim::SimMode;
use montage_core::sim::SplitMix64;
use montage_core::{BlockKind, Epoch, EpochLength, Error, Heap, HeapConfig, ScanFilter, raw};
use montage_testkit::{
    Crashed, SyncRecord, check_synced, crash_generation, for_each_seed, run_against_clock,
};
use proptest::prelude::*;

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

/// The lengths and first bytes of the blobs logged, in order; no snapshots.
#[derive(Default, Debug, PartialEq)]
struct Blobs(Vec<(usize, u8)>);

impl Replay for Blobs {
    type Op = Vec<u8>;
    type Output = ();

    fn apply(&mut self, blob: Vec<u8>) {
        self.0
            .push((blob.len(), blob.first().copied().unwrap_or(0)));
    }
}

/// Records of an epoch go to pages that grow as they fill; one too long for any page is a
/// payload of its own and ends the page, and the next call starts another. All of them
/// come back in order.
#[test]
fn records_of_every_size_come_back_in_order_from_pages_and_payloads_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("blobs.heap"))
        .size(8 << 20)
        .max_size(8 << 20)
        .epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let blobs = Logged::<Blobs>::open(&heap, "blobs").unwrap();
    // In one epoch: small records through every page size, a record longer than the
    // largest page between them, then more small ones; then a later epoch's records.
    let sizes: Vec<usize> = (0..300)
        .map(|i| 1 + i % 50)
        .chain([20_000, 3])
        .chain((0..40).map(|i| 100 + i))
        .collect();
    for (i, &len) in sizes.iter().enumerate() {
        blobs.apply(vec![i as u8; len]).unwrap();
    }
    heap.sync().unwrap();
    blobs.apply(vec![7; 5]).unwrap();
    let live = blobs.read(|b| b.0.clone()).unwrap();
    assert_eq!(live.len(), sizes.len() + 1);
    assert!(blobs.verify_replay().unwrap());
    drop(blobs);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let blobs = Logged::<Blobs>::open(&heap, "blobs").unwrap();
    assert_eq!(blobs.read(|b| b.0.clone()).unwrap(), live);
    assert_eq!(blobs.log_len(), live.len() as u64);
    // Calls after the reopen start a page of their own.
    blobs.apply(vec![9; 2]).unwrap();
    assert!(blobs.verify_replay().unwrap());
    drop(blobs);
    heap.close().unwrap();
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
    // A ledger takes no snapshots: closing keeps its log. The calls of an epoch append
    // their records to one page; the sync puts the last two in a later epoch's page.
    let ledger = Logged::<Ledger>::open(&heap, "ledger").unwrap();
    for id in 0..5 {
        if id == 3 {
            heap.sync().unwrap();
        }
        ledger.apply((id, 1)).unwrap();
    }
    drop(ledger);
    heap.close().unwrap();
    // Free the page of the first three calls behind the structure's back: its first
    // record (a header word, then sequence number 0) starts it.
    let heap = raw::open_with(&config, |_| raw::Verdict::Keep).unwrap();
    let owner = heap.lookup("ledger").unwrap();
    let first = heap
        .collect(ScanFilter::all().owner(owner))
        .unwrap()
        .into_iter()
        .find(|info| heap.read_payload(info.block).unwrap()[8..16] == 0u64.to_le_bytes())
        .unwrap();
    heap.raw().free(first.block).unwrap();
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    assert!(matches!(
        Logged::<Ledger>::open(&heap, "ledger"),
        Err(Error::Corrupted { what, .. }) if what.contains("gap")
    ));
    heap.close().unwrap();
}

/// Runs `call(thread, i, id)` for the `i`th of each of the `THREADS` threads' calls, `id`
/// unique to the generation, thread and call, against the clock, with a crash at a random
/// simulator event; returns the crash and each call's epoch by id.
fn crash_calls(
    heap: &Heap,
    rng: &mut SplitMix64,
    seed: u64,
    generation: u64,
    call: impl Fn(usize, u64, u64) + Sync,
) -> (Crashed, BTreeMap<u64, u64>) {
    let epochs = Mutex::new(BTreeMap::new());
    let within = THREADS as u64 * CALLS_PER_THREAD * 8;
    let crashed = crash_generation(heap, rng, within, seed, || {
        run_against_clock(heap, seed ^ generation, THREADS, |t, ended| {
            for i in 0..CALLS_PER_THREAD {
                let id = (generation << 40) | ((t as u64) << 32) | i;
                call(t, i, id);
                let epoch = heap.last_op_epoch().unwrap();
                ended.record(epoch);
                epochs.lock().unwrap().insert(id, epoch.get());
            }
        })
    })
    .unwrap_or_else(|broken| panic!("generation {generation}: {broken}"));
    (crashed, epochs.into_inner().unwrap())
}

/// A simulated heap's configuration for `seed` (its crash mode), and the seed's generator.
fn simulated(seed: u64) -> (HeapConfig, SplitMix64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    (config, SplitMix64::new(seed))
}

/// Each shard's history.
fn shard_histories(shards: &LoggedShards<History>) -> Vec<Vec<u64>> {
    (0..shards.shards())
        .map(|i| shards.shard_at(i).unwrap().read(|h| h.0.clone()).unwrap())
        .collect()
}

const THREADS: usize = 3;
const CALLS_PER_THREAD: u64 = 40;

/// Whether a seed's generations start from a snapshot taken and synced before the crash is
/// armed: half of the seeds, in every simulator mode. Whether a compaction made during the
/// crash window is kept depends on how many persistence events each call costs, which
/// depends on the machine's load; these seeds make recovery from a snapshot and the replay
/// after it certain.
fn settles(seed: u64) -> bool {
    seed % 2 == 1
}

/// The ids of the calls made before a generation's crash window: apart from every worker's.
fn settling_ids(generation: u64) -> impl Iterator<Item = u64> {
    (0..SETTLING_CALLS).map(move |i| (generation << 40) | ((THREADS as u64) << 32) | i)
}

/// Calls made before the crash window on a seed that [`settles`].
const SETTLING_CALLS: u64 = 6;

/// Three threads call one `Logged<History>` while the clock advances and syncs; the crash
/// comes at a random persistence event. The recovered history must be a prefix of the live
/// one, exactly the calls of the epochs the recovered clock covers; a second generation
/// continues from it. On a seed that [`settles`], each generation first makes a few calls,
/// compacts and syncs, so recovery must load a snapshot and replay the records after it.
fn run_seed(seed: u64) {
    let (config, mut rng) = simulated(seed);
    let mut heap = Heap::create(&config).unwrap();
    for generation in 1..=2u64 {
        let history = Logged::<History>::open(&heap, "history").unwrap();
        if settles(seed) {
            for id in settling_ids(generation) {
                history.apply(id).unwrap();
            }
            // The background policy may have taken it already: either way it is done.
            history.compact().unwrap();
            heap.sync().unwrap();
        }
        let before = history.read(|h| h.0.clone()).unwrap();
        let (crashed, epochs) = crash_calls(&heap, &mut rng, seed, generation, |t, i, id| {
            // One thread also compacts now and then, while the others call.
            if t == 0 && i % 8 == 7 {
                history.compact().unwrap();
            }
            history.apply(id).unwrap();
        });
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
        if settles(seed) {
            assert!(
                recovered.log_len() < recovered.calls(),
                "generation {generation}: the synced snapshot was not loaded"
            );
        }
        drop(recovered);
        check_recovered(generation, &before, &live, &got, &epochs, crashed.cut.get());
    }
}

/// That `got`, a history recovered with epoch cut `cut`, is `before` (the history the
/// generation started from) and then exactly the calls of `live` (the history at the crash)
/// made in epochs up to `cut`, a prefix of them; `epochs` are the calls' epochs.
fn check_recovered(
    generation: u64,
    before: &[u64],
    live: &[u64],
    got: &[u64],
    epochs: &BTreeMap<u64, u64>,
    cut: u64,
) {
    assert!(
        got.starts_with(before),
        "generation {generation}: the older calls"
    );
    assert_eq!(
        got[..],
        live[..got.len()],
        "generation {generation}: not a prefix of the live history"
    );
    let kept = live[before.len()..]
        .iter()
        .filter(|id| epochs[id] <= cut)
        .count();
    assert_eq!(
        got.len() - before.len(),
        kept,
        "generation {generation}: the calls of epochs <= {cut}"
    );
    assert!(got[before.len()..].iter().all(|id| epochs[id] <= cut));
}

#[test]
fn a_recovered_logged_structure_is_the_live_one_after_a_prefix_of_its_calls() {
    for_each_seed("logged", 24, run_seed);
}

/// As `run_seed`, for a `LoggedShards<History>` of three shards whose snapshots the policy
/// takes in the background, very often: each shard's recovered history must be a prefix of
/// its live one, exactly its calls of the epochs the recovered clock covers. A seed that
/// [`settles`] starts each generation from synced snapshots, as in `run_seed`.
fn run_sharded_seed(seed: u64) {
    let (config, mut rng) = simulated(seed);
    let mut heap = Heap::create(&config).unwrap();
    for generation in 1..=2u64 {
        let shards = LoggedShards::<History>::open(&heap, "histories", SHARDS).unwrap();
        shards.set_snapshot_policy(SnapshotPolicy::log_bytes(64).relative_to_snapshot(0));
        if settles(seed) {
            for id in settling_ids(generation) {
                shards.apply(&id, id).unwrap();
            }
            shards.compact().unwrap();
            heap.sync().unwrap();
        }
        let before = shard_histories(&shards);
        let (crashed, epochs) = crash_calls(&heap, &mut rng, seed, generation, |_, _, id| {
            shards.apply(&id, id).unwrap();
        });
        let live = shard_histories(&shards);
        assert!(
            shards.verify_replay().unwrap(),
            "replay differs from the live histories"
        );
        assert!(shards.take_snapshot_error().is_none());
        // Every call went to the shard its key chose.
        for (index, history) in live.iter().enumerate() {
            assert!(
                history
                    .iter()
                    .all(|id| shards.shard_of(id).unwrap() == index)
            );
        }
        drop(shards);
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let recovered = LoggedShards::<History>::open(&heap, "histories", SHARDS).unwrap();
        let got = shard_histories(&recovered);
        if settles(seed) {
            assert!(
                recovered.log_len() < recovered.calls(),
                "generation {generation}: the synced snapshots were not loaded"
            );
        }
        drop(recovered);
        for shard in 0..SHARDS {
            check_recovered(
                generation,
                &before[shard],
                &live[shard],
                &got[shard],
                &epochs,
                crashed.cut.get(),
            );
        }
    }
}

const SHARDS: usize = 3;

#[test]
fn a_recovered_sharded_structure_is_each_live_shard_after_a_prefix_of_its_calls() {
    for_each_seed("logged-sharded", 24, run_sharded_seed);
}

/// Threads transfer ids into a `Logged<History>` and a `LoggedShards<History>` together (a
/// third of the calls go to the first alone), while the clock moves and the policy takes
/// snapshots in the background: after the crash, each history is a prefix of its live one
/// with exactly the calls of the recovered epochs, and an id logged together is in both or
/// in neither.
fn run_together_seed(seed: u64) {
    let (config, mut rng) = simulated(seed);
    let mut heap = Heap::create(&config).unwrap();
    for generation in 1..=2u64 {
        let a = Logged::<History>::open(&heap, "a").unwrap();
        let b = LoggedShards::<History>::open(&heap, "b", SHARDS).unwrap();
        a.set_snapshot_policy(SnapshotPolicy::log_bytes(128).relative_to_snapshot(0));
        b.set_snapshot_policy(SnapshotPolicy::log_bytes(64).relative_to_snapshot(0));
        let before = (a.read(|h| h.0.clone()).unwrap(), shard_histories(&b));
        let (crashed, epochs) = crash_calls(&heap, &mut rng, seed, generation, |_, i, id| {
            if i % 3 == 0 {
                a.apply(id).unwrap();
            } else {
                together(&heap, |tx| {
                    tx.log(&a, id)?;
                    tx.log_shard(&b.shard(&id)?, id)?;
                    Ok(())
                })
                .unwrap();
            }
        });
        let live = (a.read(|h| h.0.clone()).unwrap(), shard_histories(&b));
        assert!(a.verify_replay().unwrap() && b.verify_replay().unwrap());
        drop((a, b));
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let a = Logged::<History>::open(&heap, "a").unwrap();
        let b = LoggedShards::<History>::open(&heap, "b", SHARDS).unwrap();
        let got = (a.read(|h| h.0.clone()).unwrap(), shard_histories(&b));
        drop((a, b));
        let cut = crashed.cut.get();
        check_recovered(generation, &before.0, &live.0, &got.0, &epochs, cut);
        for shard in 0..SHARDS {
            check_recovered(
                generation,
                &before.1[shard],
                &live.1[shard],
                &got.1[shard],
                &epochs,
                cut,
            );
        }
        let in_b: std::collections::BTreeSet<u64> = got.1.iter().flatten().copied().collect();
        let together_in_a: std::collections::BTreeSet<u64> = got
            .0
            .iter()
            .copied()
            .filter(|id| (id & 0xffff_ffff) % 3 != 0)
            .collect();
        assert_eq!(
            together_in_a, in_b,
            "generation {generation}: torn together"
        );
    }
}

#[test]
fn calls_made_together_survive_a_crash_together() {
    for_each_seed("logged-together", 24, run_together_seed);
}

/// How many live payloads the structure `name` has in `heap`, not counting the anti-blocks
/// of its deletions.
fn payloads_of(heap: &Heap, name: &str) -> usize {
    let owner = heap.lookup(name).unwrap();
    heap.collect(ScanFilter::all().owner(owner).live())
        .unwrap()
        .iter()
        .filter(|info| info.spec.kind != BlockKind::Delete)
        .count()
}

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
    let payloads = |heap: &Heap| payloads_of(heap, "history");
    // The snapshot's chunk and commit: every record is gone, pages and all.
    assert_eq!(payloads(&heap), 2);
    for id in 100..110 {
        history.apply(id).unwrap();
    }
    let live = history.read(|h| h.0.clone()).unwrap();
    assert!(history.verify_replay().unwrap());
    // One chunk and one commit, and the ten records' pages (the records the snapshot covers
    // are gone: see below).
    assert!(payloads(&heap) > 2);
    // Closing takes a last snapshot: the log is empty, the next open loads the snapshot.
    history.close().unwrap();
    assert_eq!(payloads(&heap), 2);
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.clone()).unwrap(), live);
    assert_eq!((history.log_len(), history.calls()), (0, 110));
    for id in 110..120 {
        history.apply(id).unwrap();
    }
    assert!(payloads(&heap) > 2);
    // A second snapshot replaces the first.
    assert!(history.compact().unwrap());
    assert_eq!(payloads(&heap), 2);
    drop(history);
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.len()).unwrap(), 120);
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
    let payloads = |heap: &Heap| payloads_of(heap, "bulk");
    let log_blocks = payloads(&heap);
    assert!(matches!(bulk.compact(), Err(Error::OutOfSpace { .. })));
    assert_eq!((bulk.log_len(), bulk.calls()), (5, 5));
    assert!(bulk.verify_replay().unwrap());
    // The abandoned snapshot's chunks are gone, the log's blocks kept.
    assert_eq!(payloads(&heap), log_blocks);
    // The heap has room again.
    bulk.apply(1).unwrap();
    drop(bulk);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let bulk = Logged::<Bulk>::open(&heap, "bulk").unwrap();
    assert_eq!(bulk.read(|b| b.0.len()).unwrap(), 1_000_001);
    assert_eq!(bulk.log_len(), 6);
    drop(bulk);
    heap.close().unwrap();
}

#[test]
fn the_policy_takes_snapshots_in_the_background() {
    let heap = Heap::create(&HeapConfig::in_memory(16 << 20)).unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    history.set_snapshot_policy(SnapshotPolicy::log_bytes(1 << 10));
    // Records of 16 bytes: the policy asks for a snapshot at the 64th call. No call of
    // `compact` here: a log shorter than the calls is the worker's doing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut id = 0;
    while history.log_len() == history.calls() {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot in a minute"
        );
        history.apply(id).unwrap();
        id += 1;
    }
    for _ in 0..5_000 {
        history.apply(id).unwrap();
        id += 1;
    }
    assert!(history.take_snapshot_error().is_none());
    assert!(history.verify_replay().unwrap());
    let live = history.read(|h| h.0.clone()).unwrap();
    assert_eq!(live.len() as u64, id);
    history.close().unwrap();
    let history = Logged::<History>::open(&heap, "history").unwrap();
    assert_eq!(history.read(|h| h.0.clone()).unwrap(), live);
    assert_eq!(history.log_len(), 0, "closed with a snapshot");
}

#[test]
fn a_background_snapshot_the_heap_cannot_hold_is_reported_and_the_log_kept() {
    let heap = Heap::create(&HeapConfig::in_memory(4 << 20)).unwrap();
    let bulk = Logged::<Bulk>::open(&heap, "bulk").unwrap();
    bulk.set_snapshot_policy(SnapshotPolicy::log_bytes(1));
    // A million numbers of up to six bytes each: a snapshot larger than the heap.
    bulk.apply(1_000_000).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let err = loop {
        if let Some(err) = bulk.take_snapshot_error() {
            break err;
        }
        assert!(std::time::Instant::now() < deadline, "no error in a minute");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(matches!(err, Error::OutOfSpace { .. }), "{err}");
    assert_eq!((bulk.log_len(), bulk.calls()), (1, 1));
    bulk.apply(1).unwrap();
    assert!(bulk.verify_replay().unwrap());
    // Closing tries once more, fails the same way, and keeps the log.
    assert!(matches!(bulk.close(), Err(Error::OutOfSpace { .. })));
    let bulk = Logged::<Bulk>::open(&heap, "bulk").unwrap();
    assert_eq!(
        (bulk.log_len(), bulk.read(|b| b.0.len()).unwrap()),
        (2, 1_000_001)
    );
}

/// Two versions of the same structures, their operations changed between them.
mod v1 {
    use montage_collections::Replay;

    /// A sum; snapshots in serde's form.
    #[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Tally(pub(crate) u64);

    impl Replay for Tally {
        type Op = u64;
        type Output = ();

        fn apply(&mut self, by: u64) {
            self.0 += by;
        }

        montage_collections::serde_snapshots!();
    }

    /// A sum without snapshots.
    #[derive(Default, Debug, PartialEq)]
    pub(crate) struct Counter(pub(crate) u64);

    impl Replay for Counter {
        type Op = u64;
        type Output = ();

        fn apply(&mut self, by: u64) {
            self.0 += by;
        }
    }
}

mod v2 {
    use montage_collections::Replay;

    /// Version 2 adds a product of two numbers.
    #[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    pub(crate) struct Tally(pub(crate) u64);

    impl Replay for Tally {
        type Op = (u64, u64);
        type Output = ();

        fn apply(&mut self, (a, b): (u64, u64)) {
            self.0 += a * b;
        }

        montage_collections::serde_snapshots!();
    }

    #[derive(Default, Debug, PartialEq)]
    pub(crate) struct Counter(pub(crate) u64);

    impl Replay for Counter {
        type Op = (u64, u64);
        type Output = ();

        fn apply(&mut self, (a, b): (u64, u64)) {
            self.0 += a * b;
        }
    }
}

#[test]
fn new_operations_open_a_closed_structure_from_its_snapshot_and_refuse_an_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("versions.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let tally = Logged::<v1::Tally>::open(&heap, "tally").unwrap();
    let counter = Logged::<v1::Counter>::open(&heap, "counter").unwrap();
    for by in 1..=10 {
        tally.apply(by).unwrap();
        counter.apply(by).unwrap();
    }
    tally.close().unwrap();
    counter.close().unwrap();
    heap.close().unwrap();
    let bytes = || std::fs::read(config.path().unwrap()).unwrap();
    let before = bytes();

    let heap = Heap::open(&config).unwrap();
    // The counter's log is of the old operations: refused, and nothing changed.
    assert!(matches!(
        Logged::<v2::Counter>::open(&heap, "counter"),
        Err(Error::LayoutMismatch { .. })
    ));
    heap.close().unwrap();
    assert!(bytes() == before, "a refused open changed the heap");
    let heap = Heap::open(&config).unwrap();
    let counter = Logged::<v1::Counter>::open(&heap, "counter").unwrap();
    assert_eq!(
        (counter.read(|c| c.0).unwrap(), counter.log_len()),
        (55, 10)
    );
    drop(counter);

    // The tally was closed with a snapshot and an empty log: the new code starts from it.
    let tally = Logged::<v2::Tally>::open(&heap, "tally").unwrap();
    assert_eq!((tally.read(|t| t.0).unwrap(), tally.calls()), (55, 10));
    tally.apply((3, 4)).unwrap();
    assert!(tally.verify_replay().unwrap());
    drop(tally);
    let tally = Logged::<v2::Tally>::open(&heap, "tally").unwrap();
    assert_eq!((tally.read(|t| t.0).unwrap(), tally.log_len()), (67, 0));
    drop(tally);
    heap.close().unwrap();
}

#[test]
fn a_sharded_structure_keeps_its_shard_count_and_each_key_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("shards.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let ledgers = LoggedShards::<Ledger>::open(&heap, "ledgers", 4).unwrap();
    for account in 0..200u64 {
        ledgers.apply(&account, (account, 1)).unwrap();
        ledgers.apply(&account, (account, 2)).unwrap();
    }
    let counts: Vec<usize> = (0..4)
        .map(|i| ledgers.shard_at(i).unwrap().read(|l| l.0.len()).unwrap())
        .collect();
    assert_eq!(counts.iter().sum::<usize>(), 200);
    assert!(
        counts.iter().all(|&n| n > 20),
        "200 keys spread over 4 shards: {counts:?}"
    );
    assert!(ledgers.shard_at(4).is_none());
    assert!(ledgers.verify_replay().unwrap());
    drop(ledgers);
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    for shards in [0, 65] {
        assert!(matches!(
            LoggedShards::<Ledger>::open(&heap, "ledgers", shards),
            Err(Error::InvalidConfig { .. })
        ));
    }
    assert!(matches!(
        LoggedShards::<Ledger>::open(&heap, "ledgers", 3),
        Err(Error::LayoutMismatch { .. })
    ));
    assert!(matches!(
        Logged::<Ledger>::open(&heap, "ledgers"),
        Err(Error::LayoutMismatch { .. })
    ));
    let ledgers = LoggedShards::<Ledger>::open(&heap, "ledgers", 4).unwrap();
    for account in 0..200u64 {
        let shard = ledgers.shard(&account).unwrap();
        assert_eq!(shard.read(|l| l.0[&account]).unwrap(), 3);
        assert_eq!(shard.apply((account, 1)).unwrap(), 4);
    }
    assert_eq!((ledgers.calls(), ledgers.log_len()), (600, 600));
    drop(ledgers);
    heap.close().unwrap();
}

/// A `u64` encoded as `u64` is, without its bytes at hand: routed through its encoding.
struct Encoded(u64);

impl montage_core::Codec for Encoded {
    const CODEC_ID: u64 = <u64 as montage_core::Codec>::CODEC_ID;
    fn encode(&self, out: &mut Vec<u8>) -> montage_core::Result<()> {
        self.0.encode(out)
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        u64::decode(bytes).map(Encoded)
    }
}

/// A payload type as a key: the derive gives its encoding's fingerprint from the stack.
#[derive(montage_derive::Payload, Debug, Clone, Copy, PartialEq)]
#[payload(crate = "montage_core")]
#[repr(C)]
struct Branch {
    bank: u64,
    number: u32,
    open: bool,
    _pad: [u8; 3],
}

#[test]
fn a_key_goes_to_the_shard_its_encoding_chooses_in_every_version() {
    let dir = tempfile::tempdir().unwrap();
    let heap = Heap::create(&HeapConfig::new(dir.path().join("route.heap")).size(4 << 20)).unwrap();
    let ledgers = LoggedShards::<Ledger>::open(&heap, "ledgers", 8).unwrap();
    let route = |keys: std::ops::Range<u64>| -> Vec<usize> {
        keys.map(|k| ledgers.shard_of(&k).unwrap()).collect()
    };
    // The routes are part of the heap's format: a heap written with other ones would find
    // its keys in the wrong shards.
    assert_eq!(route(0..12), [4, 2, 3, 5, 3, 0, 1, 5, 1, 3, 3, 0]);
    for key in (0..1000u64).chain([u64::MAX, 1 << 63]) {
        assert_eq!(
            ledgers.shard_of(&key).unwrap(),
            ledgers.shard_of(&Encoded(key)).unwrap()
        );
        // A pair routes by its parts' bytes one after the other, whichever way each is had.
        let text = format!("account-{key}");
        let mut bytes = key.to_le_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        assert_eq!(
            ledgers.shard_of(&(key, text)).unwrap(),
            ledgers.shard_of(&bytes).unwrap()
        );
        let branch = Branch {
            bank: key,
            number: key as u32 ^ 0x5a5a,
            open: key % 3 == 0,
            _pad: [0; 3],
        };
        let mut encoded = Vec::new();
        montage_core::Codec::encode(&branch, &mut encoded).unwrap();
        let seed = montage_core::payload::Fingerprint::new();
        assert_eq!(
            montage_core::Codec::fingerprint_encoding(&branch, seed)
                .map(montage_core::payload::Fingerprint::finish),
            Some(seed.bytes(&encoded).finish())
        );
        assert_eq!(
            ledgers.shard_of(&branch).unwrap(),
            ledgers.shard_of(&encoded).unwrap()
        );
        let twice = [key.to_le_bytes(), key.to_le_bytes()].concat();
        assert_eq!(
            ledgers.shard_of(&(key, Encoded(key))).unwrap(),
            ledgers.shard_of(&twice).unwrap()
        );
    }
}

#[test]
fn a_together_that_fails_or_panics_changes_nothing() {
    let heap = Heap::create(&HeapConfig::in_memory(4 << 20)).unwrap();
    let other = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
    let a = Logged::<Ledger>::open(&heap, "a").unwrap();
    let b = Logged::<Ledger>::open(&heap, "b").unwrap();
    let elsewhere = Logged::<Ledger>::open(&other, "c").unwrap();
    a.apply((1, 10)).unwrap();
    let state = |l: &Logged<Ledger>| (l.read(|l| l.0.clone()).unwrap(), l.log_len());
    let (a0, b0) = (state(&a), state(&b));
    // An error after a call was logged: the call is not applied, its record not kept.
    let failed: montage_core::Result<()> = together(&heap, |tx| {
        tx.log(&a, (1, 5))?;
        Err(Error::Unsupported {
            what: "the caller's own error",
        })
    });
    assert!(matches!(failed, Err(Error::Unsupported { what }) if what == "the caller's own error"));
    assert!(matches!(
        together(&heap, |tx| {
            tx.log(&a, (1, 5))?;
            tx.log(&a, (1, 6))
        }),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        together(&heap, |tx| {
            tx.log(&a, (1, 5))?;
            tx.log(&elsewhere, (1, 6))
        }),
        Err(Error::Unsupported { .. })
    ));
    assert_eq!((state(&a), state(&b)), (a0.clone(), b0.clone()));
    // A panic in the second call: both structures poisoned, neither record kept.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        together(&heap, |tx| {
            tx.log(&a, (1, 5))?;
            tx.log(&b, (2, i64::MIN))?;
            Ok(())
        })
    }));
    assert!(panicked.is_err());
    assert!(matches!(a.apply((1, 1)), Err(Error::Panicked { .. })));
    assert!(matches!(b.read(|_| ()), Err(Error::Panicked { .. })));
    drop((a, b));
    let a = Logged::<Ledger>::open(&heap, "a").unwrap();
    let b = Logged::<Ledger>::open(&heap, "b").unwrap();
    assert_eq!((state(&a), state(&b)), (a0, b0));
    // And one that commits: both applied, their outputs given.
    let (x, y) = together(&heap, |tx| {
        let (x, moved) = tx.log_with(&a, |l| {
            let moved = l.0[&1] / 2;
            ((1, -moved), moved)
        })?;
        Ok((x, tx.log(&b, (1, moved))?))
    })
    .unwrap();
    assert_eq!((x.take(), y.take()), (Some(5), Some(5)));
    assert!(a.verify_replay().unwrap() && b.verify_replay().unwrap());
}

#[test]
fn togethers_in_opposite_orders_and_single_calls_run_side_by_side() {
    const ROUNDS: i64 = 2_000;
    let heap = Heap::create(&HeapConfig::in_memory(32 << 20)).unwrap();
    let a = Logged::<Ledger>::open(&heap, "a").unwrap();
    let b = Logged::<Ledger>::open(&heap, "b").unwrap();
    a.set_snapshot_policy(SnapshotPolicy::manual());
    b.set_snapshot_policy(SnapshotPolicy::manual());
    std::thread::scope(|s| {
        // Transfers of 1 from a to b, and from b to a, locking in opposite orders.
        let heap = &heap;
        for (from, to) in [(&a, &b), (&b, &a)] {
            s.spawn(move || {
                for _ in 0..ROUNDS {
                    together(heap, |tx| {
                        tx.log(from, (0, -1))?;
                        tx.log(to, (0, 1))
                    })
                    .unwrap();
                }
            });
        }
        // Single calls on both, on another account.
        s.spawn(|| {
            for _ in 0..ROUNDS {
                a.apply((1, 1)).unwrap();
                b.apply((1, 1)).unwrap();
            }
        });
    });
    let balances = |l: &Logged<Ledger>| l.read(|l| (l.0[&0], l.0[&1])).unwrap();
    assert_eq!((balances(&a), balances(&b)), ((0, ROUNDS), (0, ROUNDS)));
    assert_eq!(
        (a.calls(), b.calls()),
        (3 * ROUNDS as u64, 3 * ROUNDS as u64)
    );
    assert!(a.verify_replay().unwrap() && b.verify_replay().unwrap());
}

// ---- collections in a together -----------------------------------------------------

/// A map's entries, sorted, and a queue's elements.
fn contents(map: &HashMap<u64, u64>, queue: &Queue<u64>) -> (Vec<(u64, u64)>, Vec<u64>) {
    let mut entries: Vec<(u64, u64)> = map.iter().map(Result::unwrap).collect();
    entries.sort_unstable();
    (entries, queue.to_vec().unwrap())
}

/// Keys of the map that [`change_all`] changes.
const KEYS: u64 = 3_000;

/// Every key of `map` changes (the odd ones kept twice, the second time replacing a version
/// of this operation), a new key comes and goes, elements are pushed and popped, and `log`
/// logs a call.
fn change_all<'h>(
    tx: &mut Together<'h, '_, '_>,
    map: &'h HashMap<u64, u64>,
    queue: &'h Queue<u64>,
    log: &'h Logged<History>,
) -> montage_core::Result<()> {
    tx.log(log, 1)?;
    tx.hash_map(map, |m| {
        for key in 0..KEYS {
            match key % 3 {
                0 => assert_eq!(m.remove(&key)?, Some(key)),
                1 => assert_eq!(m.insert(key, key + 1)?, Some(key)),
                _ => assert!(m.put(key, key + 2)?),
            }
            if key % 2 == 1 && key % 3 != 0 {
                let seen = m.compute(&key, |v| (Change::Set(v.map_or(0, |v| v * 10)), v))?;
                assert_eq!(seen, m.get(&key)?.map(|v| v / 10));
            }
        }
        assert!(!m.put(KEYS, 1)?);
        assert_eq!(m.get(&KEYS)?, Some(1));
        assert!(m.delete(&KEYS)?);
        assert!(!m.contains_key(&KEYS)? && !m.contains_key(&0)?);
        Ok(())
    })?;
    tx.queue(queue, |q| {
        assert_eq!(q.pop_front()?, Some(0));
        q.push_back(100)?;
        assert_eq!((q.front()?, q.len()), (Some(1), 10));
        assert_eq!(q.pop_front()?, Some(1));
        Ok(())
    })
}

/// Changes of a map (many keys, so several in one stripe; inserts, replacements of entries
/// written earlier in the same epoch, removals, conditional changes) and of a queue, made
/// together with a logged call: the views see their own changes, an error or a panic takes
/// every change back (in DRAM and in the heap, as reopening shows), a retry starts from the
/// state before, and a commit keeps them all.
#[test]
fn map_and_queue_changes_made_together_are_kept_or_taken_back_together() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("together.heap"))
        .size(32 << 20)
        .max_size(32 << 20);
    let mut heap = Heap::create(&config).unwrap();
    {
        let map: HashMap<u64, u64> = HashMap::open(&heap, "map").unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "queue").unwrap();
        let log = Logged::<History>::open(&heap, "log").unwrap();
        for key in 0..KEYS {
            map.insert(key, key).unwrap();
        }
        for element in 0..10 {
            queue.push_back(element).unwrap();
        }
        let before = (contents(&map, &queue), log.read(|h| h.0.clone()).unwrap());
        let refused = || Error::Unsupported {
            what: "the caller's own error",
        };
        // An error after every change: all taken back.
        let failed = together(&heap, |tx| {
            change_all(tx, &map, &queue, &log)?;
            Err::<(), _>(refused())
        });
        assert!(
            matches!(failed, Err(Error::Unsupported { what }) if what == "the caller's own error")
        );
        let now = || (contents(&map, &queue), log.read(|h| h.0.clone()).unwrap());
        assert_eq!(now(), before);
        // A panic after every change: the same, and the panic goes on.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            together(&heap, |tx| -> montage_core::Result<()> {
                change_all(tx, &map, &queue, &log)?;
                panic!("the caller's own panic");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(now(), before);
        // A panic inside a view's closure, after some changes.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            together(&heap, |tx| {
                tx.hash_map(&map, |m| -> montage_core::Result<()> {
                    m.insert(5, 0)?;
                    m.remove(&6)?;
                    panic!("the caller's own panic");
                })
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(now(), before);
        // A first attempt that asks to run again: the second starts from the state before.
        let mut attempts = 0;
        together(&heap, |tx| {
            attempts += 1;
            if attempts == 1 {
                change_all(tx, &map, &queue, &log)?;
                return Err(Error::Aborted);
            }
            change_all(tx, &map, &queue, &log)
        })
        .unwrap();
        assert_eq!(attempts, 2);
        let after = now();
        let expected: Vec<(u64, u64)> = (0..KEYS)
            .filter(|key| key % 3 != 0)
            .map(|key| {
                let value = if key % 3 == 1 { key + 1 } else { key + 2 };
                (key, if key % 2 == 1 { value * 10 } else { value })
            })
            .collect();
        let elements: Vec<u64> = (2..10).chain([100]).collect();
        assert_eq!(after, ((expected, elements), vec![1]));
        // The same structure twice, or one of another heap: refused.
        let other = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let elsewhere: Queue<u64> = Queue::open(&other, "elsewhere").unwrap();
        for refused in [
            together(&heap, |tx| {
                tx.hash_map(&map, |m| m.put(1, 1))?;
                tx.hash_map(&map, |m| m.put(2, 2))
            }),
            together(&heap, |tx| {
                tx.queue(&queue, |q| q.push_back(1).map(|()| true))?;
                tx.queue(&elsewhere, |q| q.push_back(1).map(|()| true))
            }),
        ] {
            assert!(matches!(refused, Err(Error::Unsupported { .. })));
        }
        assert_eq!(now(), after);
        // What the heap holds is what the structures show.
        drop((map, queue, log));
        heap.close().unwrap();
        heap = Heap::open(&config).unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "map").unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "queue").unwrap();
        let log = Logged::<History>::open(&heap, "log").unwrap();
        assert_eq!(
            (contents(&map, &queue), log.read(|h| h.0.clone()).unwrap()),
            after
        );
    }
    heap.close().unwrap();
}

/// A graph's whole state: each vertex's value and its outgoing edges with their values.
type GraphState = Vec<(u64, u64, Vec<(u64, u64)>)>;

fn graph_state(graph: &Graph<u64, u64>) -> (GraphState, usize) {
    let state = graph
        .vertices()
        .into_iter()
        .map(|id| {
            let edges = graph
                .neighbours(id)
                .unwrap()
                .unwrap()
                .into_iter()
                .map(|dst| (dst, graph.edge(id, dst).unwrap().unwrap()))
                .collect();
            (id, graph.vertex(id).unwrap().unwrap(), edges)
        })
        .collect();
    (state, graph.edge_count())
}

/// The graph changes of [`graph_changes_made_together_are_kept_or_taken_back_together`].
fn change_graph<'h>(
    tx: &mut Together<'h, '_, '_>,
    graph: &'h Graph<u64, u64>,
) -> montage_core::Result<()> {
    tx.graph(graph, |g| {
        assert_eq!(g.remove_vertex(2)?, Some(20));
        assert_eq!((g.vertex(2)?, g.neighbours(1)), (None, Some(vec![])));
        assert!(g.add_vertex(7, &70)? && !g.add_vertex(7, &71)?);
        assert!(g.add_edge(7, 0, &700)? && g.add_edge(0, 7, &7)?);
        assert!(g.add_edge(7, 7, &777)?);
        assert_eq!(g.remove_edge(0, 1)?, Some(1));
        assert!(g.add_edge(0, 1, &11)?);
        assert!(!g.add_edge(0, 2, &2)?);
        assert_eq!(g.edge(0, 1)?, Some(11));
        assert_eq!(g.remove_vertex(5)?, Some(50));
        Ok(())
    })
}

/// Graph changes in a together (a vertex with edges both ways and a self-loop removed, one
/// added with edges, an edge removed and added again): the view sees them, an error takes
/// them all back, in DRAM and in the heap, and a commit keeps them.
#[test]
fn graph_changes_made_together_are_kept_or_taken_back_together() {
    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("graph.heap"))
        .size(8 << 20)
        .max_size(8 << 20);
    let heap = Heap::create(&config).unwrap();
    let graph: Graph<u64, u64> = Graph::open(&heap, "graph").unwrap();
    for id in 0..6 {
        graph.add_vertex(id, &(id * 10)).unwrap();
    }
    for (src, dst) in [(0, 1), (1, 2), (2, 0), (2, 2), (3, 2), (2, 4), (5, 0)] {
        graph.add_edge(src, dst, &(src * 100 + dst)).unwrap();
    }
    let before = graph_state(&graph);
    let failed = together(&heap, |tx| {
        change_graph(tx, &graph)?;
        Err::<(), _>(Error::Unsupported { what: "refused" })
    });
    assert!(matches!(failed, Err(Error::Unsupported { .. })));
    assert_eq!(graph_state(&graph), before);
    together(&heap, |tx| change_graph(tx, &graph)).unwrap();
    let after = graph_state(&graph);
    let expected: GraphState = vec![
        (0, 0, vec![(1, 11), (7, 7)]),
        (1, 10, vec![]),
        (3, 30, vec![]),
        (4, 40, vec![]),
        (7, 70, vec![(0, 700), (7, 777)]),
    ];
    assert_eq!(after, (expected, 4));
    drop(graph);
    heap.close().unwrap();
    let heap = Heap::open(&config).unwrap();
    let graph: Graph<u64, u64> = Graph::open(&heap, "graph").unwrap();
    assert_eq!(graph_state(&graph), after);
    drop(graph);
    heap.close().unwrap();
}

/// A together that fails for want of space while other threads wait for the stripe it
/// holds: the heap's retry advances the clock only after the stripe is released (no
/// deadlock), and nothing of the failed together is kept.
#[test]
fn a_together_that_runs_out_of_space_holds_no_lock_while_the_heap_reclaims() {
    let heap = Heap::create(&HeapConfig::in_memory(2 << 20)).unwrap();
    let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "map").unwrap();
    map.insert(0, vec![0; 64]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Another thread rewrites key 0, whose stripe the together locks first, and
        // deletes and rewrites others, so that freed blocks wait for reclamation.
        s.spawn(|| {
            let mut round = 0u64;
            // ORDERING: a flag; nothing else is published through it.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                map.insert(0, vec![1; 64]).unwrap();
                map.insert(1 + round % 64, vec![2; 1024]).unwrap();
                map.delete(&(1 + (round + 32) % 64)).unwrap();
                round += 1;
            }
        });
        for _ in 0..20 {
            let full = together(&heap, |tx| {
                tx.hash_map(&map, |m| {
                    m.put(0, vec![3; 64])?;
                    m.put(1_000, vec![4; 4 << 20])
                })
            });
            assert!(matches!(full, Err(Error::OutOfSpace { .. })), "{full:?}");
        }
        // ORDERING: as above.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_ne!(map.get(&0).unwrap(), Some(vec![3; 64]));
    assert_eq!(map.get(&1_000).unwrap(), None);
}

/// Ids whose calls consume: each pops the queue's front in a together that also removes it
/// from the map and logs the consumer's id.
fn consumes(id: u64) -> bool {
    (id & 0xffff_ffff) % 4 == 3
}

/// Ids whose calls are refused: a together that changes all three structures, then fails.
fn refused(id: u64) -> bool {
    (id & 0xffff_ffff) % 4 == 2
}

/// The key of the produced ids' count in the map.
const PRODUCED: u64 = u64::MAX;

/// The map and queue that a history of producers and consumers leaves: every produced id
/// not yet consumed (a consumer takes the oldest) in the queue and, mapped to itself plus
/// one, in the map, with the count of produced ids.
fn derived(history: &[u64]) -> (Vec<(u64, u64)>, Vec<u64>) {
    let produced: Vec<u64> = history
        .iter()
        .copied()
        .filter(|&id| !consumes(id))
        .collect();
    let consumed = history.len() - produced.len();
    let queue = produced[consumed..].to_vec();
    let mut map: Vec<(u64, u64)> = queue.iter().map(|&id| (id, id + 1)).collect();
    if !produced.is_empty() {
        map.push((PRODUCED, produced.len() as u64));
    }
    map.sort_unstable();
    (map, queue)
}

/// Threads produce (log an id, put it in a map, bump a count there, push it on a queue, add
/// it to a graph with a self-loop), consume (pop the queue's front, remove it from the map
/// and the graph, log) and make togethers that fail after changing all four, all as
/// togethers, while the clock moves and the policy takes snapshots: live and after the
/// crash, the map, the queue and the graph are exactly what the logged history (a prefix
/// with the recovered epochs' calls) says, so no together is torn.
fn run_collections_seed(seed: u64) {
    let (config, mut rng) = simulated(seed);
    let mut heap = Heap::create(&config).unwrap();
    for generation in 1..=2u64 {
        let log = Logged::<History>::open(&heap, "log").unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "map").unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "queue").unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "graph").unwrap();
        log.set_snapshot_policy(SnapshotPolicy::log_bytes(128).relative_to_snapshot(0));
        let before = log.read(|h| h.0.clone()).unwrap();
        assert_eq!(contents(&map, &queue), derived(&before));
        assert_eq!(graph_of(&graph), graph_derived(&before));
        let (crashed, epochs) = crash_calls(&heap, &mut rng, seed, generation, |_, _, id| {
            let done = together(&heap, |tx| {
                if consumes(id) {
                    // A closure: the method's path is not general enough in its lifetimes.
                    #[allow(clippy::redundant_closure_for_method_calls)]
                    let popped = tx.queue(&queue, |q| q.pop_front())?;
                    if let Some(front) = popped {
                        assert_eq!(tx.hash_map(&map, |m| m.remove(&front))?, Some(front + 1));
                        assert_eq!(tx.graph(&graph, |g| g.remove_vertex(front))?, Some(front));
                        tx.log(&log, id)?;
                    }
                    return Ok(());
                }
                tx.log(&log, id)?;
                tx.hash_map(&map, |m| {
                    m.put(id, id + 1)?;
                    m.compute(&PRODUCED, |n| (Change::Set(n.unwrap_or(0) + 1), ()))
                })?;
                tx.queue(&queue, |q| q.push_back(id))?;
                tx.graph(&graph, |g| {
                    g.add_vertex(id, &id)?;
                    g.add_edge(id, id, &id)
                })?;
                if refused(id) {
                    return Err(Error::Unsupported { what: "refused" });
                }
                Ok(())
            });
            assert_eq!(done.is_err(), refused(id), "{done:?}");
        });
        let live = log.read(|h| h.0.clone()).unwrap();
        assert_eq!(
            contents(&map, &queue),
            derived(&live),
            "generation {generation}: live"
        );
        assert_eq!(graph_of(&graph), graph_derived(&live));
        assert!(live.iter().all(|&id| !refused(id)));
        assert!(log.verify_replay().unwrap());
        drop((log, map, queue, graph));
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let log = Logged::<History>::open(&heap, "log").unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "map").unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "queue").unwrap();
        let graph: Graph<u64, u64> = Graph::open(&heap, "graph").unwrap();
        let got = log.read(|h| h.0.clone()).unwrap();
        check_recovered(generation, &before, &live, &got, &epochs, crashed.cut.get());
        assert_eq!(
            contents(&map, &queue),
            derived(&got),
            "generation {generation}: torn together"
        );
        assert_eq!(
            graph_of(&graph),
            graph_derived(&got),
            "generation {generation}: torn together (graph)"
        );
    }
}

/// A graph's vertices (each with its value) and its edge count.
fn graph_of(graph: &Graph<u64, u64>) -> (Vec<(u64, u64)>, usize) {
    let vertices = graph
        .vertices()
        .into_iter()
        .map(|id| (id, graph.vertex(id).unwrap().unwrap()))
        .collect();
    (vertices, graph.edge_count())
}

/// The graph the togethers of `history` leave: a vertex (valued with its id, with a
/// self-loop) for each element of the queue.
fn graph_derived(history: &[u64]) -> (Vec<(u64, u64)>, usize) {
    let mut queue = derived(history).1;
    queue.sort_unstable();
    let len = queue.len();
    (queue.into_iter().map(|id| (id, id)).collect(), len)
}

#[test]
fn collection_changes_made_together_survive_a_crash_together() {
    for_each_seed("together-collections", 24, run_collections_seed);
}

// ---- a sequential model ----------------------------------------------------------------

/// One step of a run.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// This many calls.
    Calls(u8),
    Compact,
    Advance,
    Sync,
    /// Closes the handle (a snapshot) and opens it again.
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u8..12).prop_map(Step::Calls),
        1 => Just(Step::Compact),
        3 => Just(Step::Advance),
        1 => Just(Step::Sync),
        1 => Just(Step::Reopen),
    ]
}

/// Every call's id and epoch, in order, and the syncs that returned.
type Model = (Vec<(u64, Epoch)>, Vec<SyncRecord>);

/// Runs `steps` on the structure `history` of `heap`, checking it against the model at every
/// step; returns the model (every call's id and epoch, in order) and the syncs.
fn run(heap: &Heap, steps: &[Step]) -> Result<Model, TestCaseError> {
    let sim = heap.simulator().unwrap();
    let open = || {
        let history = Logged::<History>::open(heap, "history").unwrap();
        history.set_snapshot_policy(SnapshotPolicy::manual());
        history
    };
    let mut history = open();
    let mut calls: Vec<(u64, Epoch)> = Vec::new();
    let mut syncs = Vec::new();
    for &step in steps {
        match step {
            Step::Calls(n) => {
                for _ in 0..n {
                    let id = calls.len() as u64;
                    history.apply(id).unwrap();
                    calls.push((id, heap.last_op_epoch().unwrap()));
                }
            }
            Step::Compact => {
                history.compact().unwrap();
            }
            Step::Advance => {
                heap.advance_epoch().unwrap();
            }
            Step::Sync => {
                let covered = calls.last().map_or(Epoch::ZERO, |&(_, e)| e);
                heap.sync().unwrap();
                syncs.push(SyncRecord {
                    covered,
                    returned_at: sim.events(),
                });
            }
            Step::Reopen => {
                history.close().unwrap();
                history = open();
            }
        }
        let live: Vec<u64> = calls.iter().map(|&(id, _)| id).collect();
        prop_assert_eq!(history.read(|h| h.0.clone()).unwrap(), live);
    }
    prop_assert!(history.verify_replay().unwrap());
    Ok((calls, syncs))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("MONTAGE_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(48)
    ))]

    #[test]
    fn a_recovered_logged_structure_is_the_model_after_a_prefix_of_its_calls(
        mode in prop::sample::select(vec![
            SimMode::Prefix, SimMode::WordTear, SimMode::Eadr, SimMode::File,
        ]),
        steps in prop::collection::vec(step(), 1..40),
        crash_at in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        // The clock also advances by itself, every 50 us: in the middle of a compaction, too.
        let config = HeapConfig::simulated(8 << 20, mode)
            .epoch_length(EpochLength::Every(std::time::Duration::from_micros(50)));
        // A first run counts the persistence events, so that the crash falls among them (the
        // second run takes about as many).
        let events = {
            let heap = Heap::create(&config).unwrap();
            let start = heap.simulator().unwrap().events();
            run(&heap, &steps)?;
            heap.simulator().unwrap().events() - start
        };
        let heap = Heap::create(&config).unwrap();
        let sim = heap.simulator().unwrap();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let crash_step = sim.events() + (crash_at * events as f64) as u64;
        sim.crash_at(crash_step);
        let (calls, syncs) = run(&heap, &steps)?;
        let image = sim.crash(seed);
        let cut = image.epoch_word().unwrap().durable_cut();
        check_synced(&syncs, crash_step, cut).map_err(TestCaseError::fail)?;
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let recovered = Logged::<History>::open(&heap, "history").unwrap();
        let got = recovered.read(|h| h.0.clone()).unwrap();
        let kept: Vec<u64> = calls.iter().filter(|&&(_, e)| e <= cut).map(|&(id, _)| id).collect();
        prop_assert_eq!(got, kept);
        prop_assert!(recovered.verify_replay().unwrap());
    }
}
