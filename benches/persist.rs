//! Persistence-layer benchmarks: the cost of a write plus its write-back and fence per
//! backend, for 64 B to 4 KiB, beside a raw store with no persistence layer at all.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly
#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions

mod common;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use montage::Epoch;
use montage::raw::BlockSpec;
use montage::sim::SimMode;
use montage::{BackendKind, Heap, HeapConfig, PBlock};

fn backends() -> Vec<(&'static str, HeapConfig)> {
    let size = 64 << 20;
    vec![
        ("volatile", HeapConfig::in_memory(size)),
        (
            "eadr",
            HeapConfig::in_memory(size).backend(BackendKind::Eadr),
        ),
        (
            "pmem",
            HeapConfig::in_memory(size).backend(BackendKind::Pmem),
        ),
        (
            "journal",
            HeapConfig::new(common::fresh_path("persist-journal")).size(size),
        ),
        ("simulated", HeapConfig::simulated(size, SimMode::Prefix)),
    ]
}

fn write_persist(c: &mut Criterion) {
    let mut group = c.benchmark_group("write_persist");
    for (name, config) in backends() {
        let heap = Heap::create(&config).unwrap();
        for len in [64usize, 256, 1024, 4096] {
            let data = vec![0x5Au8; len];
            let block: PBlock = heap
                .raw()
                .alloc(BlockSpec::new(Epoch::new(1), 1), len as u64)
                .unwrap();
            group.throughput(Throughput::Bytes(len as u64));
            group.bench_function(BenchmarkId::new(name, len), |b| {
                b.iter(|| {
                    heap.raw().write(block, 0, &data).unwrap();
                    heap.raw().persist_block(block).unwrap();
                });
            });
        }
        if let Some(path) = config.path() {
            drop(heap);
            let _ = montage::Heap::remove(path);
        }
    }
    group.finish();
}

fn write_only(c: &mut Criterion) {
    // The store path alone: what an operation pays before the epoch's batched write-back.
    let mut group = c.benchmark_group("write_64B_no_writeback");
    let heap = Heap::create(&HeapConfig::in_memory(16 << 20).backend(BackendKind::Pmem)).unwrap();
    let block = heap
        .raw()
        .alloc(BlockSpec::new(Epoch::new(1), 1), 64)
        .unwrap();
    let data = [7u8; 64];
    group.bench_function("montage-pmem", |b| {
        b.iter(|| heap.raw().write(block, 0, &data).unwrap());
    });
    let mut plain = [0u8; 64];
    group.bench_function("plain-memory", |b| {
        b.iter(|| plain.copy_from_slice(std::hint::black_box(&data)));
    });
    group.finish();
}

criterion_group!(benches, write_persist, write_only);
criterion_main!(benches);
