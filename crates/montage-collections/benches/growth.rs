//! What a heap that grows costs, on a pmem-backend heap file in `MONTAGE_BENCH_DIR` (default
//! `/dev/shm`):
//!
//! * `growth_step`: the one allocation that grows a full heap of 64 MiB by a step (to
//!   128 MiB: allocating the file's new bytes, syncing its length, writing the span count),
//!   against an allocation that finds room;
//! * `fill`: inserting 400,000 entries (`u64` keys, 256-byte values) into a `HashMap` on a
//!   heap created at 1 MiB that grows to 1 GiB as the map fills it, against one created at
//!   1 GiB.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used)] // a benchmark stops loudly

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use montage_collections::HashMap;
use montage_core::{BackendKind, Error, Heap, HeapConfig};
use montage_testkit::fresh_bench_path;

fn config(path: &Path, size: u64, max: u64) -> HeapConfig {
    HeapConfig::new(path)
        .size(size)
        .max_size(max)
        .backend(BackendKind::Pmem)
}

/// Sums what `measure` times over `iters` fresh heaps created at `size` that may grow to
/// `max` (named `name`); creating, closing and removing them is not timed.
fn on_fresh_heaps(
    iters: u64,
    name: &str,
    size: u64,
    max: u64,
    mut measure: impl FnMut(&Heap) -> Duration,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let path = fresh_bench_path(name);
        let heap = Heap::create(&config(&path, size, max)).unwrap();
        total += measure(&heap);
        heap.close().unwrap();
        Heap::remove(&path).unwrap();
    }
    total
}

/// Times the allocation of 4 KiB that grows a full 64 MiB heap, or (without `grow`) the
/// one before it.
fn time_growth(iters: u64, grow: bool) -> Duration {
    let payload = [7u8; 4096];
    on_fresh_heaps(iters, "growth-step", 64 << 20, 128 << 20, |heap| {
        let owner = heap.register("fill").unwrap();
        loop {
            let before = heap.stats();
            let start = Instant::now();
            match heap.run_op(|op| op.alloc(owner, 1, &payload)) {
                Ok(_) => {}
                Err(Error::OutOfSpace { .. }) => panic!("the heap did not grow"),
                Err(other) => panic!("{other}"),
            }
            let took = start.elapsed();
            let grown = heap.stats().growths > before.growths;
            // The allocation before the growth carved the last free span.
            let last_span = before.free_spans == 1 && !grown;
            if grown || (last_span && !grow) {
                return took;
            }
        }
    })
}

fn growth_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("growth_step");
    group.sample_size(10);
    group.bench_function("alloc that grows 64 MiB to 128 MiB", |b| {
        b.iter_custom(|iters| time_growth(iters, true));
    });
    group.bench_function("alloc that carves the last span", |b| {
        b.iter_custom(|iters| time_growth(iters, false));
    });
    group.finish();
}

const ENTRIES: u64 = 400_000;

/// Times filling a `HashMap` with `ENTRIES` entries on a heap created at `size` that may grow
/// to 1 GiB.
fn time_fill(iters: u64, size: u64) -> Duration {
    let value = vec![5u8; 256];
    on_fresh_heaps(iters, "fill", size, 1 << 30, |heap| {
        let map = HashMap::<u64, Vec<u8>>::open(heap, "fill").unwrap();
        let start = Instant::now();
        for key in 0..ENTRIES {
            map.put_ref(key, &value[..]).unwrap();
        }
        start.elapsed()
    })
}

fn fill(c: &mut Criterion) {
    let mut group = c.benchmark_group("fill_400k_256B");
    group.sample_size(10);
    group.bench_function("heap created at 1 GiB", |b| {
        b.iter_custom(|iters| time_fill(iters, 1 << 30));
    });
    group.bench_function("heap created at 1 MiB, growing", |b| {
        b.iter_custom(|iters| time_fill(iters, 1 << 20));
    });
    group.finish();
}

criterion_group!(benches, growth_step, fill);
criterion_main!(benches);
