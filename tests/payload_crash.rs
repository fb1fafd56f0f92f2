//! Typed payloads on the power-failure simulator: threads increment counters with
//! `cas_<field>` (copying a counter into the current epoch with `set_<field>` when the swap
//! reports an older payload) while another thread syncs and advances the clock; the
//! simulator crashes at a random persistence event. The recovered counters must equal the
//! model that applied exactly the increments of the epochs the recovered clock covers
//! (`<= w - 2`), and include every increment that ended before a sync that returned before
//! the crash. Each seed runs two generations (recover, run more, crash again).
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one (the thread
//! interleaving is not replayed, only the choices the seed makes).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use common::{Counter, try_increment};
use montage::Epoch;
use montage::sim::SplitMix64;
use montage::{Heap, HeapConfig, OwnerId, PRef};
use montage_testkit::{SyncRecord, crash_generation, for_each_seed, run_against_clock};

const COUNTERS: u64 = 4;
const THREADS: usize = 3;
const INCREMENTS_PER_THREAD: u64 = 40;
const GENERATIONS: usize = 2;

/// One counter: its current handle (replaced under the lock on copy-on-write) and every
/// successful increment as (epoch, value written).
struct Slot {
    handle: Mutex<PRef<Counter>>,
    increments: Mutex<Vec<(u64, u64)>>,
}

/// One increment attempt (see `common::try_increment`), recorded on success.
fn increment(heap: &Heap, slot: &Slot) -> montage::Result<Option<u64>> {
    let done = try_increment(heap, &slot.handle)?;
    if let Some((epoch, written)) = done {
        slot.increments.lock().unwrap().push((epoch, written));
    }
    Ok(done.map(|(epoch, _)| epoch))
}

fn generation(heap: &Heap, slots: &[Slot], seed: u64) -> Vec<SyncRecord> {
    run_against_clock(heap, seed, THREADS, |t, ended| {
        let mut rng = SplitMix64::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37));
        for _ in 0..INCREMENTS_PER_THREAD {
            let slot = &slots[(rng.next_u64() % COUNTERS) as usize];
            loop {
                if let Some(epoch) = increment(heap, slot).unwrap() {
                    ended.record(Epoch::new(epoch));
                    break;
                }
                std::thread::yield_now();
            }
        }
    })
}

/// Each counter's value after the increments of epochs `<= cut`, starting from `start`;
/// checks that each counter's increments, in value order, never go back an epoch.
fn model(start: &BTreeMap<u64, u64>, slots: &[Slot], cut: u64) -> BTreeMap<u64, u64> {
    let mut state = start.clone();
    for (id, slot) in slots.iter().enumerate() {
        let mut increments = slot.increments.lock().unwrap().clone();
        increments.sort_by_key(|&(_, value)| value);
        for pair in increments.windows(2) {
            assert!(pair[0].0 <= pair[1].0, "counter {id}: epochs go backwards");
        }
        if let Some(&(_, value)) = increments.iter().rev().find(|(e, _)| *e <= cut) {
            state.insert(id as u64, value);
        }
    }
    state
}

/// The recovered counters: id -> (handle, value), checking that each appears once.
fn recovered(heap: &Heap, owner: OwnerId) -> BTreeMap<u64, (PRef<Counter>, u64)> {
    let mut out = BTreeMap::new();
    for (handle, counter) in heap.payloads::<Counter>(owner, 2).unwrap() {
        let previous = out.insert(counter.id, (handle, counter.value));
        assert!(previous.is_none(), "counter {} recovered twice", counter.id);
    }
    out
}

fn slots_from(found: &BTreeMap<u64, (PRef<Counter>, u64)>) -> Vec<Slot> {
    (0..COUNTERS)
        .map(|id| Slot {
            handle: Mutex::new(found[&id].0),
            increments: Mutex::new(Vec::new()),
        })
        .collect()
}

fn run_seed(seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    let owner = heap.register("counters").unwrap();
    heap.run_op(|op| {
        for id in 0..COUNTERS {
            op.alloc_payload(owner, &Counter { id, value: 0 })?;
        }
        Ok(())
    })
    .unwrap();
    heap.sync().unwrap();
    let mut found = recovered(&heap, owner);
    let mut state: BTreeMap<u64, u64> = (0..COUNTERS).map(|id| (id, 0)).collect();
    for generation_index in 0..GENERATIONS {
        let slots = slots_from(&found);
        let within = THREADS as u64 * INCREMENTS_PER_THREAD * 10;
        let crashed = crash_generation(&heap, &mut rng, within, seed, || {
            generation(&heap, &slots, seed.wrapping_add(generation_index as u64))
        })
        .unwrap_or_else(|broken| panic!("generation {generation_index}: {broken}"));
        drop(heap);
        let (step, cut) = (crashed.step, crashed.cut);
        let want = model(&state, &slots, cut.get());
        heap = Heap::open_image(crashed.image, &config).unwrap();
        found = recovered(&heap, owner);
        let got: BTreeMap<u64, u64> = found.iter().map(|(id, (_, v))| (*id, *v)).collect();
        assert_eq!(
            got, want,
            "generation {generation_index}: crash at step {step}, epoch cut {cut}"
        );
        state = want;
    }
}

#[test]
fn recovered_counters_are_the_model_of_the_recovered_epochs() {
    for_each_seed("payload counters", 24, run_seed);
}
