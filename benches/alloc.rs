//! Allocator benchmarks: alloc/free throughput, one and two threads, beside the system
//! allocator in the same run; and recovery-scan throughput on a heap of 10 million small
//! blocks (set `MONTAGE_SCAN_BLOCKS` to change the count).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly
#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use montage::Epoch;
use montage::raw::BlockSpec;
use montage::{BackendKind, Heap, HeapConfig};

const PAYLOAD: u64 = 24; // with the 40-byte header: the 64-byte class
const BATCH: usize = 1000;

/// One round: allocate `BATCH` blocks, then free them all (exercises refill and spill).
fn montage_round(heap: &Heap, blocks: &mut Vec<montage::PBlock>) {
    for uid in 0..BATCH as u64 {
        blocks.push(
            heap.raw()
                .alloc(BlockSpec::new(Epoch::new(1), uid), PAYLOAD)
                .unwrap(),
        );
    }
    for block in blocks.drain(..) {
        heap.raw().free(block).unwrap();
    }
}

fn system_round(boxes: &mut Vec<Vec<u8>>) {
    for _ in 0..BATCH {
        boxes.push(black_box(Vec::with_capacity(64)));
    }
    boxes.clear();
}

/// Runs `round` on `threads` threads at once for `iters` rounds each; returns the wall time.
fn parallel(threads: usize, iters: u64, round: &(dyn Fn() + Sync)) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..iters {
                    round();
                }
            });
        }
    });
    start.elapsed()
}

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_64B");
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements((BATCH * threads) as u64));
        for backend in [BackendKind::Volatile, BackendKind::Pmem] {
            let heap = Heap::create(&HeapConfig::in_memory(256 << 20).backend(backend)).unwrap();
            let name = format!("montage-{backend:?}").to_lowercase();
            group.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    parallel(threads, iters, &|| {
                        let mut blocks = Vec::with_capacity(BATCH);
                        montage_round(&heap, &mut blocks);
                    })
                });
            });
        }
        group.bench_function(BenchmarkId::new("system", threads), |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, &|| {
                    let mut boxes = Vec::with_capacity(BATCH);
                    system_round(&mut boxes);
                })
            });
        });
    }
    group.finish();
}

fn recovery_scan(c: &mut Criterion) {
    let blocks: u64 = std::env::var("MONTAGE_SCAN_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let path = common::fresh_path("scan");
    // 64-byte blocks, plus room for the tables and one partly filled span.
    let size = (blocks * 64 * 17 / 16 + (64 << 20)).div_ceil(1 << 20) << 20;
    let config = HeapConfig::new(&path)
        .size(size)
        .backend(BackendKind::Volatile);
    {
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("bench").unwrap();
        for uid in 0..blocks {
            heap.raw()
                .alloc_bytes(
                    BlockSpec::new(Epoch::new(1), uid).owner(owner),
                    &uid.to_le_bytes(),
                )
                .unwrap();
        }
        heap.close().unwrap();
    }
    let mut group = c.benchmark_group("recovery_scan");
    group.sample_size(10);
    group.throughput(Throughput::Elements(blocks));
    for threads in [1usize, 2] {
        let config = config.clone().recovery_threads(threads);
        group.bench_function(BenchmarkId::new(format!("{blocks}_blocks"), threads), |b| {
            b.iter(|| {
                let heap = Heap::open(&config).unwrap();
                assert_eq!(heap.recovery_report().blocks_kept, blocks);
                heap.close().unwrap();
            });
        });
    }
    group.finish();
    let _ = montage::Heap::remove(&path);
}

criterion_group!(benches, alloc_free, recovery_scan);
criterion_main!(benches);
