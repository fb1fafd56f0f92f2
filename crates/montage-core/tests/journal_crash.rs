//! The journal backend on the simulator's file model, in scenarios aimed at what is new in
//! it: a record is written at an advance but durable only at a commit, the heap file's
//! mapped pages may reach the disk at any moment, and recovery replays the journal.
//!
//! Each scenario crashes the same run under many seeds (each seed keeps a different subset
//! of unsynced sectors of both files) and checks every recovered state.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use common::{TYPE_KV, encode, kv_state};
use montage_core::sim::SimMode;
use montage_core::{Heap, HeapConfig};
use montage_testkit::for_each_seed;

fn config() -> HeapConfig {
    HeapConfig::simulated(1 << 20, SimMode::File)
}

/// A superseded version is reclaimed only once the record of its replacement is durable:
/// whatever the crash keeps, key 1 reads 1 (the old version) or 2 (the new), never nothing.
#[test]
fn a_superseded_version_outlives_every_uncommitted_replacement() {
    // Key 1 = 1, closed cleanly: the heap file holds it and the journal is folded, so replay
    // cannot bring the version back once the heap file loses it.
    let heap = Heap::create(&config()).unwrap();
    let owner = heap.register("kv").unwrap();
    let block = heap
        .run_op(|op| op.alloc(owner, TYPE_KV, &encode(1, 1)))
        .unwrap();
    let sim = heap.simulator().unwrap();
    heap.close().unwrap();
    let start = sim.durable();
    // The scenario, crashed at persistence event `step` (`None`: at its end).
    let run = |step: Option<u64>| {
        let config = match step {
            Some(step) => config().sim_crash_at(step),
            None => config(),
        };
        let heap = Heap::open_image(start.clone(), &config).unwrap();
        let opened = heap.simulator().unwrap().events();
        heap.run_op(|op| op.update(block, &encode(1, 2))).unwrap();
        // Enough advances for reclamation to be due by the clock alone, and for the old
        // version's block to be handed out again.
        for i in 0..6u64 {
            heap.advance_epoch().unwrap();
            heap.run_op(|op| op.alloc(owner, TYPE_KV, &encode(100 + i, i)))
                .unwrap();
        }
        let sim = heap.simulator().unwrap();
        if step.is_none() {
            sim.crash_at(sim.events());
        }
        drop(heap);
        (sim, opened)
    };
    let (sim, opened) = run(None);
    let events = sim.events();
    for_each_seed("superseded version on the journal", 300, |seed| {
        let step = opened + seed % (events - opened);
        let (sim, _) = run(Some(step));
        let image = sim.crash(seed);
        let word = image.epoch_word().unwrap();
        let heap = Heap::open_image(image, &config()).unwrap();
        let state = kv_state(&heap, owner);
        let value = state.get(&1).map(|&(value, _)| value);
        assert!(
            matches!(value, Some(1 | 2)),
            "key 1 reads {value:?} after a crash at step {step} with durable word {word}"
        );
    });
}

/// A sync's writes survive every crash after it returns, and a crash before any sync keeps
/// a prefix: the journal's records are replayed in order and stop at the first torn one.
#[test]
fn synced_writes_survive_and_unsynced_ones_form_a_prefix() {
    let config = config();
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("kv").unwrap();
    // One key per epoch, with values large enough that each record spans several sectors.
    let big = vec![7u8; 3000];
    for key in 0..4u64 {
        heap.run_op(|op| op.alloc(owner, TYPE_KV, &encode(key, key)))
            .unwrap();
        heap.run_op(|op| op.alloc(owner, TYPE_KV + 1, &big))
            .unwrap();
        heap.advance_epoch().unwrap();
    }
    heap.sync().unwrap();
    for key in 4..12u64 {
        heap.run_op(|op| op.alloc(owner, TYPE_KV, &encode(key, key)))
            .unwrap();
        heap.run_op(|op| op.alloc(owner, TYPE_KV + 1, &big))
            .unwrap();
        heap.advance_epoch().unwrap();
    }
    let sim = heap.simulator().unwrap();
    // Crash here, not after the clean close that dropping the heap makes.
    sim.crash_at(sim.events());
    drop(heap);
    for_each_seed("journal prefix", 200, |seed| {
        let image = sim.crash(seed);
        let heap = Heap::open_image(image, &config).unwrap();
        let keys: Vec<u64> = kv_state(&heap, owner).into_keys().collect();
        // Every synced key is there, and what else survived is a prefix of the rest.
        assert!(keys.len() >= 4, "synced keys lost: {keys:?}");
        let want: Vec<u64> = (0..keys.len() as u64).collect();
        assert_eq!(keys, want, "not a prefix");
        for found in heap
            .collect(montage_core::ScanFilter::all().owner(owner))
            .unwrap()
        {
            let block = found.block;
            let info = heap.info(block).unwrap();
            if info.spec.type_id == TYPE_KV + 1 {
                assert_eq!(
                    heap.read_payload(block).unwrap(),
                    big,
                    "a torn record was replayed"
                );
            }
        }
    });
}
