//! The maps (`HashMap`, `NbHashMap`, `SortedMap`) on the power-failure simulator: threads insert and remove on a few keys while
//! the clock advances and syncs; the simulator crashes at a random persistence event; the
//! recovered map must be the state after exactly the operations of the epochs the
//! recovered clock covers, and hold every operation a returned sync covered.
//!
//! Every inserted value is unique, and `insert` and `remove` return the value they replaced,
//! so the model needs no view of the map's internal order: for each key, the values written
//! by operations of epochs `<= cut`, minus those that such an operation replaced, leave at
//! most one value, which is the key's recovered value (none means absent).
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use common::{Opener, TestMap};
use montage_core::Epoch;
use montage_core::sim::SplitMix64;
use montage_core::{Heap, HeapConfig};
use montage_testkit::{crash_generation, for_each_seed, run_against_clock};

const KEYS: u64 = 6;
const THREADS: usize = 3;
const OPS_PER_THREAD: u64 = 40;
const GENERATIONS: u64 = 2;

/// What one operation did: its epoch, key, the value it wrote (`None` for a remove) and
/// the value it replaced.
#[derive(Debug, Clone, Copy)]
struct Done {
    epoch: u64,
    key: u64,
    wrote: Option<u64>,
    replaced: Option<u64>,
}

/// Inserts `value` (or removes, for `None`); returns the epoch the map's operation took
/// effect in and the value it replaced.
fn insert_or_remove(
    heap: &Heap,
    map: &dyn TestMap,
    key: u64,
    value: Option<u64>,
) -> (u64, Option<u64>) {
    let replaced = match value {
        Some(v) => map.insert(key, v),
        None => map.remove(key),
    };
    (heap.last_op_epoch().unwrap().get(), replaced)
}

fn model(start: &BTreeMap<u64, u64>, log: &[Done], cut: u64) -> BTreeMap<u64, u64> {
    let mut state = BTreeMap::new();
    for key in 0..KEYS {
        let mut live: BTreeSet<u64> = start.get(&key).copied().into_iter().collect();
        for d in log.iter().filter(|d| d.key == key && d.epoch <= cut) {
            live.extend(d.wrote);
        }
        for d in log.iter().filter(|d| d.key == key && d.epoch <= cut) {
            if let Some(r) = d.replaced {
                live.remove(&r);
            }
        }
        assert!(
            live.len() <= 1,
            "key {key}: the log leaves {live:?} live at epoch {cut}"
        );
        if let Some(v) = live.pop_first() {
            state.insert(key, v);
        }
    }
    state
}

fn run_seed(open: Opener, seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    let mut state = BTreeMap::new();
    for generation in 0..GENERATIONS {
        let map = open(&heap, "m");
        let log = Mutex::new(Vec::new());
        let within = THREADS as u64 * OPS_PER_THREAD * 12;
        let crashed = crash_generation(&heap, &mut rng, within, seed, || {
            run_against_clock(&heap, seed ^ generation, THREADS, |t, ended| {
                let mut rng = SplitMix64::new(seed ^ generation ^ ((t as u64 + 1) * 0x9E37));
                for i in 0..OPS_PER_THREAD {
                    let key = rng.next_u64() % KEYS;
                    let value = (!rng.next_u64().is_multiple_of(4))
                        .then_some((generation << 40) | ((t as u64) << 32) | i);
                    let (epoch, replaced) = insert_or_remove(&heap, &*map, key, value);
                    if value.is_some() || replaced.is_some() {
                        ended.record(Epoch::new(epoch));
                    }
                    log.lock().unwrap().push(Done {
                        epoch,
                        key,
                        wrote: value,
                        replaced,
                    });
                }
            })
        })
        .unwrap_or_else(|broken| panic!("generation {generation}: {broken}"));
        drop(map);
        drop(heap);
        let want = model(&state, &log.into_inner().unwrap(), crashed.cut.get());
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let got = open(&heap, "m").entries();
        assert_eq!(
            got, want,
            "generation {generation}: crash at {}, cut {}",
            crashed.step, crashed.cut
        );
        state = want;
    }
}

#[test]
fn recovered_hash_map_is_the_model_of_the_recovered_epochs() {
    for_each_seed("hash map", 24, |seed| run_seed(common::open_hash_map, seed));
}

#[test]
fn recovered_sorted_map_is_the_model_of_the_recovered_epochs() {
    for_each_seed("sorted map", 24, |seed| {
        run_seed(common::open_sorted_map, seed);
    });
}

#[test]
fn recovered_nb_hash_map_is_the_model_of_the_recovered_epochs() {
    for_each_seed("nonblocking hash map", 24, |seed| {
        run_seed(common::open_nb_hash_map, seed);
    });
}
