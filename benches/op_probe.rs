//! The operation path's probe: begin + 64-byte allocation + end in a plain loop, outside
//! criterion, for the two measurements criterion's `op_alloc` cannot give on a shared VM.
//!
//! * Instructions, which do not depend on what else the machine is doing:
//!   `valgrind --tool=callgrind --fair-sched=yes --toggle-collect=op_probe::one_op
//!   target/release/deps/op_probe-<hash> alloc 200 1500` counts every call of `one_op` (the
//!   1,500 warm-up batches' too: divide by 1,700,000). `begin-end` counts `be_op` the same
//!   way, `delete` (an operation that deletes a block of its own epoch) `one_delete`,
//!   `update` (one that rewrites a payload, in place within its epoch) `one_update`.
//! * Time, with the contenders of one comparison alternating run by run: each run prints
//!   the median over its measured batches of the time per call (with their mean and 99th
//!   percentile), and a `Box::new` loop's in the same run.
//!
//! Usage: `cargo bench --bench op_probe -- [alloc | delete | update | begin-end | box]
//! [BATCHES] [WARM-UP BATCHES] [pmem | journal]`, or the binary itself with the same
//! arguments (a batch is 1,000 calls; default `alloc 3000 1000 pmem`). Each `alloc` batch's
//! blocks are deleted in one operation after it, outside the timed part, so that they come
//! back to the thread's cache three epochs later, as in `op_alloc`. The heap is a file in
//! `MONTAGE_BENCH_DIR` (default `/dev/shm`) on the pmem backend, or on the journal backend
//! (the journal beside it), that grows as the blocks in flight need.

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a probe reports and stops loudly

mod common;

use std::hint::black_box;
use std::time::Instant;

use montage::{BackendKind, EpochLength, Heap, HeapConfig, OwnerId, PBlock};

/// Calls in a batch.
const BATCH: u32 = 1000;

/// One operation that allocates a 64-byte payload: what callgrind counts.
#[inline(never)]
fn one_op(heap: &Heap, owner: OwnerId, payload: &[u8; 64]) -> PBlock {
    let op = heap.begin_op().unwrap();
    op.alloc(owner, 1, black_box(payload)).unwrap()
}

/// An operation that deletes one payload written in its own epoch, which no one else
/// reaches (a striped map's removal): what callgrind counts for `delete`.
#[inline(never)]
fn one_delete(heap: &Heap, block: PBlock) {
    let op = heap.begin_op().unwrap();
    op.delete_unshared(black_box(block)).unwrap();
}

/// An operation that rewrites a 64-byte payload, in place while the epoch that wrote it
/// lasts: what callgrind counts for `update`.
#[inline(never)]
fn one_update(heap: &Heap, block: PBlock, payload: &[u8; 64]) -> PBlock {
    let op = heap.begin_op().unwrap();
    op.update(block, black_box(payload)).unwrap()
}

/// An operation that does nothing: its begin and end.
#[inline(never)]
fn be_op(heap: &Heap) {
    drop(black_box(heap.begin_op().unwrap()));
}

/// The median, mean and 99th percentile of `times`, in nanoseconds per call: criterion's
/// estimate is a mean, which the slow batches (an epoch's hand-over, a cache refill, a
/// preempted thread) raise where the median does not.
fn summary(mut times: Vec<u128>) -> String {
    times.sort_unstable();
    // A batch takes far less than 2^52 ns, and there are far fewer than 2^52 batches.
    #[allow(clippy::cast_precision_loss)]
    let per_call = |batch: u128| batch as f64 / f64::from(BATCH);
    #[allow(clippy::cast_precision_loss)]
    let mean = times.iter().sum::<u128>() as f64 / times.len() as f64 / f64::from(BATCH);
    format!(
        "{:.1} ns (mean {mean:.1}, p99 {:.1})",
        per_call(times[times.len() / 2]),
        per_call(times[times.len() * 99 / 100]),
    )
}

/// Runs `warm + batches` batches of `BATCH` calls of `make`, handing each batch's results to
/// `dispose` outside the timed part (as `op_alloc` does), and returns the measured batches'
/// times.
fn timed<T>(
    warm: usize,
    batches: usize,
    mut make: impl FnMut() -> T,
    mut dispose: impl FnMut(Vec<T>),
) -> Vec<u128> {
    let mut times = Vec::with_capacity(batches);
    for round in 0..warm + batches {
        let start = Instant::now();
        let batch: Vec<T> = (0..BATCH).map(|_| make()).collect();
        let elapsed = start.elapsed().as_nanos();
        dispose(batch);
        if round >= warm {
            times.push(elapsed);
        }
    }
    times
}

fn main() {
    // `cargo bench` passes `--bench` (and a filter, if given) to every bench binary.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let what = args.first().map_or("alloc", String::as_str);
    let number = |i: usize, default: usize| args.get(i).map_or(default, |s| s.parse().unwrap());
    let batches = number(1, 3000);
    let warm = number(2, 1000);
    let backend = match args.get(3).map_or("pmem", String::as_str) {
        "pmem" => BackendKind::Pmem,
        "journal" => BackendKind::Journal,
        other => panic!("unknown backend {other:?}: pmem or journal"),
    };
    let path = common::fresh_path("op-probe");
    let config = HeapConfig::new(&path)
        .size(64 << 20)
        .max_size(4 << 30)
        .backend(backend)
        .epoch_length(EpochLength::DEFAULT);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("probe").unwrap();
    let payload = [7u8; 64];
    match what {
        "alloc" => {
            let times = timed(
                warm,
                batches,
                || one_op(&heap, owner, &payload),
                // Give the space back so the heap never fills.
                |blocks| {
                    heap.run_op(|op| blocks.iter().try_for_each(|&block| op.delete(block)))
                        .unwrap();
                },
            );
            println!("begin + 64-byte allocation + end: {}", summary(times));
        }
        "delete" => {
            // Each batch deletes blocks allocated, in one operation, just before it (outside
            // the timed part); deleted in their own epoch, they go back to the thread's cache.
            let fresh = || {
                heap.run_op(|op| (0..BATCH).map(|_| op.alloc(owner, 1, &payload)).collect())
                    .unwrap()
            };
            let ready: std::cell::RefCell<Vec<PBlock>> = std::cell::RefCell::new(fresh());
            let times = timed(
                warm,
                batches,
                || one_delete(&heap, ready.borrow_mut().pop().unwrap()),
                |_| *ready.borrow_mut() = fresh(),
            );
            println!(
                "begin + deletion of a block of its epoch + end: {}",
                summary(times)
            );
        }
        "update" => {
            let block =
                std::cell::Cell::new(heap.run_op(|op| op.alloc(owner, 1, &payload)).unwrap());
            let times = timed(
                warm,
                batches,
                || block.set(one_update(&heap, block.get(), &payload)),
                drop,
            );
            println!("begin + 64-byte update + end: {}", summary(times));
        }
        "begin-end" => {
            let times = timed(warm, batches, || be_op(&heap), drop);
            println!("begin + end: {}", summary(times));
        }
        "box" => {}
        other => panic!("unknown probe {other:?}: alloc, delete, update, begin-end or box"),
    }
    let times = timed(warm, batches, || Box::new(black_box(payload)), drop);
    println!("Box::new of 64 bytes: {}", summary(times));
    drop(heap);
    let _ = Heap::remove(&path);
}
