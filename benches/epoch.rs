//! Epoch-runtime benchmarks: the cost of an operation that allocates a 64-byte payload
//! beside a plain `Box` allocation, `sync()` latency (median and p99) with 1 and 2 threads
//! issuing operations, and update throughput across epoch lengths from 100 us to 100 ms.
//! Heap files go to `MONTAGE_BENCH_DIR` (default `/dev/shm`), on the pmem backend (or
//! `MONTAGE_BENCH_BACKEND=journal`, for a directory on a disk; the latency report
//! then also times the device itself, a 512-byte `pwrite` and an `fdatasync`, in that
//! directory);
//! `MONTAGE_BENCH_REPORTS=0` skips the latency and epoch-length reports.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark reports and stops loudly

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use montage::{BackendKind, EpochLength, Heap, HeapConfig, OwnerId, PBlock};

/// The backend under test: pmem (clwb + sfence), or `MONTAGE_BENCH_BACKEND=journal`.
fn backend() -> BackendKind {
    match std::env::var("MONTAGE_BENCH_BACKEND").as_deref() {
        Ok("journal") => BackendKind::Journal,
        _ => BackendKind::Pmem,
    }
}

/// A heap that starts at 64 MiB (or `size`, if smaller) and grows to `size` as a benchmark
/// needs: only what is used is allocated.
fn bench_heap(name: &str, size: u64, length: EpochLength) -> (Heap, std::path::PathBuf) {
    let path = common::fresh_path(name);
    let config = HeapConfig::new(&path)
        .size(size.min(64 << 20))
        .max_size(size)
        .backend(backend())
        .epoch_length(length);
    (Heap::create(&config).unwrap(), path)
}

const BATCH: u64 = 1000;

/// Times `iters` runs of `make` in batches of `BATCH`; `dispose` gets each batch's results
/// outside the timed region.
fn timed_batches<T>(
    iters: u64,
    mut make: impl FnMut() -> T,
    mut dispose: impl FnMut(Vec<T>),
) -> Duration {
    let mut elapsed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = (iters - done).min(BATCH);
        let start = Instant::now();
        let batch: Vec<T> = (0..n).map(|_| make()).collect();
        elapsed += start.elapsed();
        dispose(batch);
        done += n;
    }
    elapsed
}

fn op_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("op_alloc_64B");
    // Blocks freed in a batch come back three epochs later, so the heap must hold what a
    // thread allocates in about four epochs (some 400 MiB at 15M allocations a second); it
    // grows to that during the warm-up.
    let (heap, path) = bench_heap("op", 4 << 30, EpochLength::DEFAULT);
    let owner = heap.register("bench").unwrap();
    let payload = [7u8; 64];
    group.bench_function("montage-pmem begin+alloc+end", |b| {
        b.iter_custom(|iters| {
            timed_batches(
                iters,
                || {
                    let op = heap.begin_op().unwrap();
                    op.alloc(owner, 1, black_box(&payload)).unwrap()
                },
                // Give the space back so the heap never fills.
                |blocks: Vec<PBlock>| {
                    let op = heap.begin_op().unwrap();
                    for block in blocks {
                        op.delete(block).unwrap();
                    }
                },
            )
        });
    });
    // The operation alone, to split the cost above into the operation and the allocation.
    group.bench_function("montage-pmem begin+end", |b| {
        b.iter(|| drop(black_box(heap.begin_op().unwrap())));
    });
    group.bench_function("box-64B", |b| {
        b.iter_custom(|iters| timed_batches(iters, || Box::new(black_box(payload)), drop));
    });
    group.finish();
    drop(heap);
    let _ = montage::Heap::remove(&path);
}

criterion_group!(benches, op_overhead);

/// One operation updating a random one of 1024 keys (each thread owns its keys).
fn update_loop(heap: &Heap, owner: OwnerId, stop: &AtomicBool, done: &AtomicU64, seed: u64) {
    let mut rng = montage::sim::SplitMix64::new(seed);
    let mut blocks: Vec<PBlock> = (0..1024)
        .map(|k: u64| {
            heap.run_op(|op| op.alloc(owner, 1, &k.to_le_bytes()))
                .unwrap()
        })
        .collect();
    let mut count = 0;
    while !stop.load(Ordering::Relaxed) {
        let i = (rng.next_u64() % 1024) as usize;
        let value = rng.next_u64().to_le_bytes();
        blocks[i] = heap.run_op(|op| op.update(blocks[i], &value)).unwrap();
        count += 1;
    }
    done.fetch_add(count, Ordering::Relaxed);
}

/// The sample at `per_mille` thousandths of the way through `sorted`.
fn percentile(sorted: &[Duration], per_mille: usize) -> Duration {
    sorted[(sorted.len() - 1) * per_mille / 1000]
}

/// The device's own durable write in the bench directory: a 512-byte `pwrite` (a small
/// journal record) and an `fdatasync`, for 2 seconds, into a preallocated file.
fn device_latency() -> Vec<Duration> {
    use std::os::unix::fs::FileExt;
    let path = common::fresh_path("device");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let len = 16u64 << 20;
    let zeros = vec![0u8; 1 << 20];
    for at in (0..len).step_by(zeros.len()) {
        file.write_all_at(&zeros, at).unwrap();
    }
    file.sync_all().unwrap();
    let record = [7u8; 512];
    let mut samples = Vec::new();
    let mut at = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let start = Instant::now();
        file.write_all_at(&record, at).unwrap();
        file.sync_data().unwrap();
        samples.push(start.elapsed());
        at = (at + 512) % len;
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    samples.sort_unstable();
    samples
}

fn sync_latency() {
    println!(
        "\nsync() latency, {:?} backend, 50 ms epochs (syncs advance the clock themselves)",
        backend()
    );
    println!("| threads issuing operations | syncs | median | p99 |");
    println!("|---|---|---|---|");
    if backend() != BackendKind::Pmem {
        let device = device_latency();
        println!(
            "| the device: 512 B pwrite + fdatasync | {} | {:?} | {:?} |",
            device.len(),
            percentile(&device, 500),
            percentile(&device, 990)
        );
    }
    for writers in [0u64, 1, 2] {
        let (heap, path) = bench_heap("sync", 256 << 20, EpochLength::DEFAULT);
        let owner = heap.register("bench").unwrap();
        let stop = AtomicBool::new(false);
        let done = AtomicU64::new(0);
        let mut samples = Vec::new();
        std::thread::scope(|s| {
            for t in 0..writers {
                let (heap, stop, done) = (&heap, &stop, &done);
                s.spawn(move || update_loop(heap, owner, stop, done, t));
            }
            std::thread::sleep(Duration::from_millis(50));
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                let start = Instant::now();
                heap.sync().unwrap();
                samples.push(start.elapsed());
            }
            stop.store(true, Ordering::Relaxed);
        });
        samples.sort_unstable();
        println!(
            "| {writers} | {} | {:?} | {:?} |",
            samples.len(),
            percentile(&samples, 500),
            percentile(&samples, 990)
        );
        drop(heap);
        let _ = montage::Heap::remove(&path);
    }
}

fn throughput_by_epoch_length() {
    println!(
        "\nupdate throughput, 2 threads, {:?} backend, by epoch length (1 s each)",
        backend()
    );
    println!("| epoch length | operations/s | advances |");
    println!("|---|---|---|");
    for micros in [100u64, 1_000, 10_000, 50_000, 100_000] {
        let length = EpochLength::Every(Duration::from_micros(micros));
        let (heap, path) = bench_heap("tput", 256 << 20, length);
        let owner = heap.register("bench").unwrap();
        let stop = AtomicBool::new(false);
        let done = AtomicU64::new(0);
        let start = Instant::now();
        std::thread::scope(|s| {
            for t in 0..2 {
                let (heap, stop, done) = (&heap, &stop, &done);
                s.spawn(move || update_loop(heap, owner, stop, done, t));
            }
            std::thread::sleep(Duration::from_secs(1));
            stop.store(true, Ordering::Relaxed);
        });
        let ops = done.load(Ordering::Relaxed);
        let rate = u128::from(ops) * 1_000_000 / start.elapsed().as_micros().max(1);
        println!(
            "| {:?} | {} | {} |",
            Duration::from_micros(micros),
            rate,
            heap.advances()
        );
        drop(heap);
        let _ = montage::Heap::remove(&path);
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // The percentile and sweep reports take a few seconds; skip them when only listing or
    // building (cargo bench --no-run never gets here; `--list` and `--test` do).
    let args: Vec<String> = std::env::args().collect();
    let skip = std::env::var_os("MONTAGE_BENCH_REPORTS").is_some_and(|v| v == "0");
    if skip || args.iter().any(|a| a == "--list" || a == "--test") {
        return;
    }
    sync_latency();
    throughput_by_epoch_length();
}
