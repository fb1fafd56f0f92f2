//! The cost of the epoch-verified swaps beside a plain compare-and-swap, in one run:
//!
//! * `plain`: `AtomicU64::compare_exchange` on a DRAM word (the lower bound);
//! * `verified_atomic`: `VerifiedAtomic::compare_exchange` (the DCSS: the thread's descriptor
//!   filled in, the tag's installation, the clock read, the status decision and the final
//!   swap), inside an open operation;
//! * `verified_atomic_load`: `VerifiedAtomic::load`;
//! * `payload_cas`: `cas_<field>` on a payload field in the heap (header check, the verify
//!   handshake, the swap on the mapped word, the write-back log entry), inside an open
//!   operation.
//!
//! One thread, uncontended, every swap succeeding (each alternates the word between two
//! values). The heap is a pmem-backend file in `MONTAGE_BENCH_DIR` (default `/dev/shm`) with
//! a manual clock, so no epoch ends during a measurement; an operation is re-opened every
//! 4096 swaps, so that its write-back log stays small.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used)] // a benchmark stops loudly

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use montage::verified::VerifiedAtomic;
use montage::{BackendKind, EpochLength, Heap, HeapConfig, Payload};

#[derive(Payload)]
#[repr(C)]
struct Word {
    #[payload(atomic)]
    value: u64,
}

const OPS_EVERY: u64 = 4096;

fn cas(c: &mut Criterion) {
    let path = common::fresh_path("cas");
    let config = HeapConfig::new(&path)
        .size(64 << 20)
        .backend(BackendKind::Pmem)
        .epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("words").unwrap();

    let mut group = c.benchmark_group("cas");
    group.bench_function("plain", |b| {
        let word = AtomicU64::new(0);
        let mut v = 0u64;
        b.iter(|| {
            let r = word.compare_exchange(v, v ^ 1, Ordering::SeqCst, Ordering::SeqCst);
            v ^= 1;
            black_box(r)
        });
    });
    group.bench_function("verified_atomic", |b| {
        let word = VerifiedAtomic::new(0u64);
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            let mut v = 0u64;
            let mut done = 0;
            while done < iters {
                let op = heap.begin_op().unwrap();
                for _ in 0..OPS_EVERY.min(iters - done) {
                    black_box(word.compare_exchange(&op, v, v ^ 1).unwrap());
                    v ^= 1;
                    done += 1;
                }
            }
            start.elapsed()
        });
    });
    group.bench_function("verified_atomic_load", |b| {
        let word = VerifiedAtomic::new(7u64);
        let op = heap.begin_op().unwrap();
        b.iter(|| black_box(word.load(&op)));
    });
    group.bench_function("payload_cas", |b| {
        b.iter_custom(|iters| {
            let mut done = 0;
            let mut elapsed = std::time::Duration::ZERO;
            while done < iters {
                // A payload of the current epoch, so that it can be swapped in place.
                heap.advance_epoch().unwrap();
                let op = heap.begin_op().unwrap();
                let p = op.alloc_payload(owner, &Word { value: 0 }).unwrap();
                let mut v = 0u64;
                let start = std::time::Instant::now();
                for _ in 0..OPS_EVERY.min(iters - done) {
                    p.cas_value(&op, v, v ^ 1).unwrap().unwrap();
                    v ^= 1;
                    done += 1;
                }
                elapsed += start.elapsed();
            }
            elapsed
        });
    });
    group.finish();
    drop(heap);
    let _ = montage::Heap::remove(&path);
}

criterion_group!(benches, cas);
criterion_main!(benches);
