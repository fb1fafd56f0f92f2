//! The queues (`Queue`, `NbQueue`) on the power-failure simulator: producers push unique values and consumers pop
//! while the clock advances and syncs; the simulator crashes at a random persistence event.
//! The recovered queue must hold exactly the elements pushed by operations of the epochs
//! the recovered clock covers and not popped by such operations, each producer's elements
//! in the order it pushed them, elements of an older epoch before those of a newer one,
//! and the elements recovered before this generation (minus those popped) in front.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use montage_core::sim::SplitMix64;
use montage_core::{Heap, HeapConfig};
use montage_testkit::{crash_generation, for_each_seed, run_against_clock};

const THREADS: usize = 3;
const OPS_PER_THREAD: u64 = 40;
const GENERATIONS: u64 = 2;

/// A value's producer and position: (generation, thread, index) packed.
fn value(generation: u64, thread: u64, index: u64) -> u64 {
    (generation << 40) | (thread << 32) | index
}

/// Checks `got` against the pushes and pops of epochs `<= cut` and the queue `before`.
fn check(before: &[u64], pushes: &[(u64, u64)], pops: &[(u64, u64)], cut: u64, got: &[u64]) {
    let popped: BTreeSet<u64> = pops
        .iter()
        .filter(|(e, _)| *e <= cut)
        .map(|(_, v)| *v)
        .collect();
    let epoch_of: BTreeMap<u64, u64> = pushes
        .iter()
        .filter(|(e, _)| *e <= cut)
        .map(|&(e, v)| (v, e))
        .collect();
    let kept_before: Vec<u64> = before
        .iter()
        .copied()
        .filter(|v| !popped.contains(v))
        .collect();
    assert_eq!(
        &got[..kept_before.len().min(got.len())],
        &kept_before[..],
        "the older elements"
    );
    let fresh = &got[kept_before.len()..];
    let want: BTreeSet<u64> = epoch_of
        .keys()
        .copied()
        .filter(|v| !popped.contains(v))
        .collect();
    let have: BTreeSet<u64> = fresh.iter().copied().collect();
    assert_eq!(have, want, "the set of elements at epoch cut {cut}");
    assert_eq!(have.len(), fresh.len(), "an element appears twice");
    for pair in fresh.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            epoch_of[&a] <= epoch_of[&b],
            "{a:#x} (epoch {}) after {b:#x} (epoch {})",
            epoch_of[&a],
            epoch_of[&b]
        );
        if a >> 32 == b >> 32 {
            assert!(
                a < b,
                "one producer's elements out of order: {a:#x} before {b:#x}"
            );
        }
    }
}

fn run_seed(open: common::QueueOpener, seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    let mut before: Vec<u64> = Vec::new();
    for generation in 1..=GENERATIONS {
        let queue = open(&heap, "q");
        let pushes = Mutex::new(Vec::new());
        let pops = Mutex::new(Vec::new());
        let within = THREADS as u64 * OPS_PER_THREAD * 12;
        let crashed = crash_generation(&heap, &mut rng, within, seed, || {
            run_against_clock(&heap, seed ^ generation, THREADS, |t, ended| {
                let mut rng = SplitMix64::new(seed ^ generation ^ ((t as u64 + 1) * 0x9E37));
                for i in 0..OPS_PER_THREAD {
                    if rng.next_u64() % 3 < 2 {
                        let v = value(generation, t as u64, i);
                        queue.push(v);
                        let epoch = heap.last_op_epoch().unwrap();
                        ended.record(epoch);
                        pushes.lock().unwrap().push((epoch.get(), v));
                    } else if let Some(v) = queue.pop() {
                        let epoch = heap.last_op_epoch().unwrap();
                        ended.record(epoch);
                        pops.lock().unwrap().push((epoch.get(), v));
                    }
                }
            })
        })
        .unwrap_or_else(|broken| panic!("generation {generation}: {broken}"));
        drop(queue);
        drop(heap);
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let got = open(&heap, "q").all();
        check(
            &before,
            &pushes.into_inner().unwrap(),
            &pops.into_inner().unwrap(),
            crashed.cut.get(),
            &got,
        );
        before = got;
    }
}

#[test]
fn recovered_queue_is_the_model_of_the_recovered_epochs() {
    for_each_seed("queue", 24, |seed| run_seed(common::open_queue, seed));
}

#[test]
fn recovered_nb_queue_is_the_model_of_the_recovered_epochs() {
    for_each_seed("nonblocking queue", 24, |seed| {
        run_seed(common::open_nb_queue, seed);
    });
}
