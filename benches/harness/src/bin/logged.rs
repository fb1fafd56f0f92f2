//! What a `Logged` structure's log and snapshots cost at scale, on a `BTreeMap<u64, Vec<u8>>`
//! of `ENTRIES` entries (1,000,000 by default) with 256-byte values, on a `pmem` heap in
//! `/dev/shm`:
//!
//! * **replay**: the time `Logged::open` takes to scan and replay a log of one record per
//!   entry (a structure that takes no snapshots), in records per second;
//! * **stall**: the longest a writer thread, inserting every 20 us or so, waited for one call
//!   while `compact` ran, for one structure and for `LoggedShards` of 8 (where each shard's
//!   serialization stalls only that shard's calls): a structure's first snapshot, then its
//!   next;
//! * **load**: the time `Logged::open` takes to load the snapshot (the log empty), in MB/s of
//!   its encoding.
//!
//! The snapshot figures are taken twice: with the values as `Vec<u8>` (which serde hands
//! over as a sequence of numbers: the snapshot's writer copies it whole, postcard reads it a
//! byte at a time) and as `serde_bytes` byte strings.
//!
//! `cargo run --release -p montage-bench --bin montage-logged -- [ENTRIES]`; the heap goes to
//! `MONTAGE_BENCH_PMEM_DIR` (default `/dev/shm`).

#![allow(clippy::print_stdout, clippy::print_stderr)]
#![allow(clippy::cast_precision_loss)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use montage_collections::logged::{Replay, SnapshotPolicy};
use montage_collections::{Logged, LoggedShards};
use montage_core::{BackendKind, Heap, HeapConfig};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const VALUE: usize = 256;
const SHARDS: usize = 8;

/// The map, with snapshots in serde's form; an operation inserts one entry.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Tree(BTreeMap<u64, Vec<u8>>);

impl Replay for Tree {
    type Op = (u64, Vec<u8>);
    type Output = ();

    fn apply(&mut self, (key, value): (u64, Vec<u8>)) {
        self.0.insert(key, value);
    }

    montage_collections::serde_snapshots!();
}

/// A byte value that serde hands over as one byte string (`serde_bytes`), not as a
/// sequence of 256 numbers.
#[derive(serde::Serialize, serde::Deserialize)]
struct Bytes(#[serde(with = "serde_bytes")] Vec<u8>);

/// The map with its values in `Bytes`.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct ByteTree(BTreeMap<u64, Bytes>);

impl Replay for ByteTree {
    type Op = (u64, Vec<u8>);
    type Output = ();

    fn apply(&mut self, (key, value): (u64, Vec<u8>)) {
        self.0.insert(key, Bytes(value));
    }

    montage_collections::serde_snapshots!();
}

/// The same map without snapshots: its log holds every call.
#[derive(Default)]
struct Unsnapped(Tree);

impl Replay for Unsnapped {
    type Op = (u64, Vec<u8>);
    type Output = ();

    fn apply(&mut self, op: (u64, Vec<u8>)) {
        self.0.apply(op);
    }
}

fn value(key: u64) -> Vec<u8> {
    let mut value = vec![0; VALUE];
    value[..8].copy_from_slice(&key.to_le_bytes());
    value
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// [`stall`] for a structure's first snapshot and then for its next (whose buffer is sized
/// by the first): the compaction's time and the writer's longest call of each, as text.
fn stalls(insert: impl Fn(u64) -> Result + Sync, compact: impl Fn() -> Result) -> Result<String> {
    let (first, later) = (stall(&insert, &compact)?, stall(&insert, &compact)?);
    Ok(format!(
        "compact {:.3} s, the writer's longest call {:.1} ms (the first snapshot: {:.3} s, {:.1} ms)",
        seconds(later.0),
        later.1.as_secs_f64() * 1e3,
        seconds(first.0),
        first.1.as_secs_f64() * 1e3
    ))
}

/// Runs `compact` while a thread inserts; returns the compaction's time and the longest
/// call the thread made meanwhile.
fn stall(
    insert: impl Fn(u64) -> Result + Sync,
    compact: impl FnOnce() -> Result,
) -> Result<(Duration, Duration)> {
    let running = AtomicBool::new(true);
    std::thread::scope(|s| {
        let writer = s.spawn(|| -> Result<Duration> {
            let mut longest = Duration::ZERO;
            let mut key = 1u64 << 40;
            // ORDERING: a stop flag; the scope's join orders the rest.
            while running.load(Ordering::Relaxed) {
                let start = Instant::now();
                insert(key)?;
                longest = longest.max(start.elapsed());
                key += 1;
                // A steady writer, not a flood: the heap need not hold a second map.
                std::thread::sleep(Duration::from_micros(20));
            }
            Ok(longest)
        });
        // Let the writer reach its pace first.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        let compacted = compact();
        let took = start.elapsed();
        // ORDERING: as above.
        running.store(false, Ordering::Relaxed);
        let longest = writer.join().map_err(|_| "the writer panicked")??;
        compacted?;
        Ok((took, longest))
    })
}

fn main() -> Result {
    let entries: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(1_000_000), |a| a.parse())?;
    let dir = std::env::var_os("MONTAGE_BENCH_PMEM_DIR")
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
    let dir = tempfile::Builder::new()
        .prefix("montage-logged-")
        .tempdir_in(dir)?;
    // Records of about 290 bytes in 512-byte blocks, and the snapshots besides.
    let size = (entries * 512 * 4).max(64 << 20);
    let config = HeapConfig::new(dir.path().join("logged.heap"))
        .size(size)
        .max_size(size)
        .backend(BackendKind::Pmem);
    println!(
        "{entries} entries of {VALUE}-byte values, heap in {}",
        dir.path().display()
    );

    // Replay.
    let heap = Heap::create(&config)?;
    let log = Logged::<Unsnapped>::open(&heap, "replay")?;
    for key in 0..entries {
        log.apply((key, value(key)))?;
    }
    drop(log);
    heap.close()?;
    let heap = Heap::open(&config)?;
    let start = Instant::now();
    let log = Logged::<Unsnapped>::open(&heap, "replay")?;
    let took = start.elapsed();
    assert_eq!(log.read(|t| t.0.0.len())?, entries as usize);
    println!(
        "replay: {} records in {:.3} s ({:.2} M records/s, {:.3} s per million)",
        log.log_len(),
        seconds(took),
        entries as f64 / seconds(took) / 1e6,
        seconds(took) / (entries as f64 / 1e6)
    );
    drop(log);
    heap.close()?;
    std::fs::remove_file(config.path().ok_or("no path")?)?;

    snapshots::<Tree>(&config, entries, "Vec<u8> values")?;
    snapshots::<ByteTree>(&config, entries, "serde_bytes values")?;
    Ok(())
}

/// The stall and load figures of a map of `T`, one structure and 8 shards.
fn snapshots<T>(config: &HeapConfig, entries: u64, what: &str) -> Result
where
    T: Replay<Op = (u64, Vec<u8>), Output = ()> + Default + Send + Sync + 'static,
{
    let path = config.path().ok_or("no path")?;
    // One structure: the stall, then the load.
    let heap = Heap::create(config)?;
    let tree = Logged::<T>::open(&heap, "tree")?;
    tree.set_snapshot_policy(SnapshotPolicy::manual());
    for key in 0..entries {
        tree.apply((key, value(key)))?;
    }
    let stalled = stalls(
        |key| Ok(tree.apply((key, value(key)))?),
        || Ok(tree.compact().map(|_| ())?),
    )?;
    let mut encoding = Vec::new();
    tree.read(|t| t.save(&mut encoding))?
        .ok_or("no snapshot")??;
    println!(
        "{what}: snapshot of one structure ({:.1} MB): {stalled}",
        encoding.len() as f64 / 1e6,
    );
    tree.close()?;
    heap.close()?;
    let heap = Heap::open(config)?;
    let start = Instant::now();
    let tree = Logged::<T>::open(&heap, "tree")?;
    let took = start.elapsed();
    assert_eq!(tree.log_len(), 0);
    println!(
        "{what}: load of one structure in {:.3} s ({:.0} MB/s)",
        seconds(took),
        encoding.len() as f64 / 1e6 / seconds(took)
    );
    drop(tree);
    heap.close()?;
    std::fs::remove_file(path)?;

    // Shards.
    let heap = Heap::create(config)?;
    let shards = LoggedShards::<T>::open(&heap, "shards", SHARDS)?;
    shards.set_snapshot_policy(SnapshotPolicy::manual());
    for key in 0..entries {
        shards.apply(&key, (key, value(key)))?;
    }
    let stalled = stalls(
        |key| Ok(shards.apply(&key, (key, value(key)))?),
        || Ok(shards.compact().map(|_| ())?),
    )?;
    println!("{what}: snapshot of {SHARDS} shards: {stalled}");
    shards.close()?;
    heap.close()?;
    let heap = Heap::open(config)?;
    let start = Instant::now();
    let shards = LoggedShards::<T>::open(&heap, "shards", SHARDS)?;
    println!(
        "{what}: load of {SHARDS} shards, in parallel, in {:.3} s",
        seconds(start.elapsed())
    );
    drop(shards);
    heap.close()?;
    std::fs::remove_file(path)?;
    Ok(())
}
