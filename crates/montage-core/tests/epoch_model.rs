//! The buffered-durable-linearizability proof on the simulator: several threads run random
//! inserts, updates and deletes on a small key space through operations, while another
//! thread syncs and advances the clock; the simulator crashes at a random persistence event;
//! the recovered state must equal a sequential model that applied exactly the operations of
//! the epochs the recovered clock covers (`<= w - 2`), in each key's lock order, and must
//! contain every operation that completed before a `sync` that returned before the crash.
//! Each seed runs several generations: recover, run more operations, crash again.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one (the thread
//! interleaving is not replayed, only the choices the seed makes).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use common::{Key, TYPE_KV, decode, encode, kv_state, write_key};
use montage_core::sim::{SimMode, SplitMix64};
use montage_core::{Error, Heap, HeapConfig, OwnerId, PBlock};
use montage_testkit::{Ended, SyncRecord, crash_generation, for_each_seed, run_against_clock};

const KEYS: u64 = 8;
const THREADS: u64 = 3;
const OPS_PER_THREAD: u64 = 40;
const GENERATIONS: usize = 3;
/// One key's DRAM state and every committed operation on it, in lock order:
/// (epoch, value after it).
#[derive(Debug, Default)]
struct Slot {
    key: Key,
    history: Vec<(u64, Option<u64>)>,
}

/// One operation on `key`: insert or update to `value`, or delete. Once it has ended, raises
/// `ended` to its epoch if it changed anything (deleting an absent key writes nothing, so
/// no sync has anything of it to make durable).
fn apply(
    heap: &Heap,
    owner: OwnerId,
    slots: &[Mutex<Slot>],
    ended: &Ended,
    key: u64,
    value: Option<u64>,
) {
    let (epoch, wrote) = heap
        .run_op(|op| {
            let mut slot = slots[key as usize].lock().unwrap();
            let wrote = slot.key.block.is_some() || value.is_some();
            write_key(op, owner, &mut slot.key, key, value)?;
            slot.history.push((op.epoch().get(), value));
            Ok((op.epoch(), wrote))
        })
        .unwrap();
    if wrote {
        ended.record(epoch);
    }
}

fn generation(heap: &Heap, owner: OwnerId, slots: &[Mutex<Slot>], seed: u64) -> Vec<SyncRecord> {
    run_against_clock(heap, seed, THREADS as usize, |t, ended| {
        let mut rng = SplitMix64::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37));
        for _ in 0..OPS_PER_THREAD {
            let key = rng.next_u64() % KEYS;
            let value = if rng.next_u64().is_multiple_of(4) {
                None
            } else {
                Some(rng.next_u64() % 1000)
            };
            apply(heap, owner, slots, ended, key, value);
        }
    })
}

/// The state the model gives for the operations of epochs `<= cut`, starting from `start`;
/// checks on the way that every key's epochs never decrease in lock order (so those
/// operations are a prefix of it).
fn model(start: &BTreeMap<u64, u64>, slots: &[Mutex<Slot>], cut: u64) -> BTreeMap<u64, u64> {
    let mut state = start.clone();
    for (key, slot) in slots.iter().enumerate() {
        let slot = slot.lock().unwrap();
        for pair in slot.history.windows(2) {
            assert!(
                pair[0].0 <= pair[1].0,
                "key {key}: epochs go backwards in lock order"
            );
        }
        for &(_, value) in slot.history.iter().filter(|(e, _)| *e <= cut) {
            match value {
                Some(v) => state.insert(key as u64, v),
                None => state.remove(&(key as u64)),
            };
        }
    }
    state
}

/// One slot per key, holding the recovered block of the key if any, with empty histories.
fn fresh_slots(blocks: &BTreeMap<u64, PBlock>) -> Vec<Mutex<Slot>> {
    (0..KEYS)
        .map(|key| {
            Mutex::new(Slot {
                key: Key {
                    block: blocks.get(&key).copied(),
                    stamp: 0,
                },
                history: Vec::new(),
            })
        })
        .collect()
}

fn run_seed(seed: u64) {
    let mode = montage_testkit::crash_mode(seed);
    let config = HeapConfig::simulated(8 << 20, mode).recovery_threads(2);
    let mut rng = SplitMix64::new(seed);
    let mut heap = Heap::create(&config).unwrap();
    let owner = heap.register("kv").unwrap();
    let mut state: BTreeMap<u64, u64> = BTreeMap::new();
    let mut blocks: BTreeMap<u64, PBlock> = BTreeMap::new();
    for generation_index in 0..GENERATIONS {
        let slots = fresh_slots(&blocks);
        let crashed =
            crash_generation(&heap, &mut rng, THREADS * OPS_PER_THREAD * 12, seed, || {
                generation(
                    &heap,
                    owner,
                    &slots,
                    seed.wrapping_add(generation_index as u64),
                )
            })
            .unwrap_or_else(|broken| panic!("generation {generation_index}: {broken}"));
        drop(heap);
        let (step, cut) = (crashed.step, crashed.cut);
        let want = model(&state, &slots, cut.get());
        heap = Heap::open_image(crashed.image, &config).unwrap();
        let owner_now = heap.lookup("kv").unwrap();
        assert_eq!(owner_now, owner);
        let got = kv_state(&heap, owner);
        let got_values: BTreeMap<u64, u64> = got.iter().map(|(k, (v, _))| (*k, *v)).collect();
        assert_eq!(
            got_values, want,
            "generation {generation_index}: crash at step {step}, epoch cut {cut}"
        );
        state = want;
        blocks = got.into_iter().map(|(k, (_, b))| (k, b)).collect();
    }
    // The last recovered heap still works: every key can be deleted, and after a sync and a
    // clean reopen nothing remains.
    let slots = fresh_slots(&blocks);
    for key in 0..KEYS {
        apply(&heap, owner, &slots, &Ended::default(), key, None);
    }
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().durable();
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    assert!(kv_state(&heap, owner).is_empty());
}

#[test]
fn recovered_state_is_the_model_of_the_recovered_epochs_over_generations() {
    for_each_seed("epoch model", 40, run_seed);
}

#[test]
fn an_operation_meeting_a_newer_epoch_aborts_and_retries() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("kv").unwrap();
    let old = heap.begin_op().unwrap();
    let old_epoch = old.epoch();
    // While `old` runs in epoch e, the clock moves to e + 1 and another thread writes.
    let newer = std::thread::scope(|s| {
        s.spawn(|| {
            heap.advance_epoch().unwrap();
            heap.run_op(|op| op.alloc(owner, TYPE_KV, &encode(1, 1)))
                .unwrap()
        })
        .join()
        .unwrap()
    });
    assert!(matches!(old.read(newer), Err(Error::Aborted)));
    assert!(matches!(
        old.update(newer, &encode(1, 2)),
        Err(Error::Aborted)
    ));
    assert!(matches!(old.delete(newer), Err(Error::Aborted)));
    assert!(matches!(
        old.check_epoch(old_epoch.next()),
        Err(Error::Aborted)
    ));
    old.abort().unwrap();
    // A retry runs in the new epoch and succeeds.
    let mut attempts = 0;
    let updated = heap
        .run_op(|op| {
            attempts += 1;
            op.update(newer, &encode(1, 3))
        })
        .unwrap();
    assert_eq!(attempts, 1);
    assert_eq!(decode(&heap.read_payload(updated).unwrap()), (1, 3));
}

#[test]
fn misuse_is_a_typed_error() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let op = heap.begin_op().unwrap();
    assert!(matches!(heap.begin_op(), Err(Error::NestedOperation)));
    assert!(matches!(heap.sync(), Err(Error::SyncInOperation)));
    drop(op);
    heap.sync().unwrap();
    // Two operations retiring one block: the second gets `Retired`, not a double free.
    let owner = heap.register("kv").unwrap();
    let block = heap
        .run_op(|op| op.alloc(owner, TYPE_KV, &encode(1, 1)))
        .unwrap();
    heap.sync().unwrap();
    let first = heap.begin_op().unwrap();
    first.update(block, &encode(1, 2)).unwrap();
    drop(first);
    let second = heap.begin_op().unwrap();
    assert!(matches!(second.delete(block), Err(Error::Retired { .. })));
}

#[test]
fn an_aborted_operation_leaves_no_trace_after_recovery() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("kv").unwrap();
    let kept = heap
        .run_op(|op| op.alloc(owner, TYPE_KV, &encode(1, 1)))
        .unwrap();
    heap.sync().unwrap();
    let op = heap.begin_op().unwrap();
    op.alloc(owner, TYPE_KV, &encode(2, 2)).unwrap();
    // `kept` is of an older epoch: the update supersedes it (the guard keeps the first old
    // version apart from its log), and the abort must make it live again.
    op.update(kept, &encode(1, 9)).unwrap();
    op.abort().unwrap();
    // An operation whose one allocation is all it did (the guard keeps that block apart
    // from its log): the block is killed at once.
    let op = heap.begin_op().unwrap();
    let lone = op.alloc(owner, TYPE_KV, &encode(3, 3)).unwrap();
    op.abort().unwrap();
    assert!(
        heap.info(lone).is_err(),
        "an aborted allocation stays valid"
    );
    heap.sync().unwrap();
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().durable();
    let heap = Heap::open_image(image, &config).unwrap();
    let state: Vec<(u64, u64)> = kv_state(&heap, owner)
        .into_values()
        .map(|(v, b)| (v, heap.info(b).unwrap().spec.uid))
        .collect();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].0, 1);
}
