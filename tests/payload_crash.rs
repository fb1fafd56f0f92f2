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

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use montage::{
    CasErrorKind, Error, Heap, HeapConfig, OwnerId, PRef, Payload, SimMode, SplitMix64,
    for_each_seed,
};

const COUNTERS: u64 = 4;
const THREADS: u64 = 3;
const INCREMENTS_PER_THREAD: u64 = 40;
const GENERATIONS: usize = 2;

#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Counter {
    id: u64,
    #[payload(atomic)]
    value: u64,
}

/// One counter: its current handle (replaced under the lock on copy-on-write) and every
/// successful increment as (epoch, value written).
struct Slot {
    handle: Mutex<PRef<Counter>>,
    increments: Mutex<Vec<(u64, u64)>>,
}

/// One increment attempt in its own operation; `Ok(None)` means "try again".
fn try_increment(heap: &Heap, slot: &Slot) -> montage::Result<Option<u64>> {
    let op = heap.begin_op()?;
    let handle = *slot.handle.lock().unwrap();
    let value = match handle.get_value(&op) {
        Ok(value) => value,
        Err(Error::Aborted | Error::InvalidBlock { .. } | Error::Retired { .. }) => {
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    match handle.cas_value(&op, value, value + 1)? {
        Ok(()) => {
            slot.increments
                .lock()
                .unwrap()
                .push((op.epoch(), value + 1));
            Ok(Some(op.epoch()))
        }
        Err(err) if err.kind == CasErrorKind::OlderEpoch => {
            let mut current = slot.handle.lock().unwrap();
            if *current == handle {
                *current = handle.set_value(&op, err.current)?;
            }
            Ok(None)
        }
        Err(_) => Ok(None),
    }
}

/// The syncs that returned: (newest epoch of an increment that had ended when the sync was
/// called, persistence events when it returned).
type Syncs = Vec<(u64, u64)>;

fn generation(heap: &Heap, slots: &[Slot], seed: u64) -> Syncs {
    let sim = heap.simulator().unwrap();
    let done = AtomicBool::new(false);
    let ended = AtomicU64::new(0);
    let syncs = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let ended = &ended;
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = SplitMix64::new(seed ^ (t + 1).wrapping_mul(0x9E37));
                    for _ in 0..INCREMENTS_PER_THREAD {
                        let slot = &slots[(rng.next_u64() % COUNTERS) as usize];
                        loop {
                            if let Some(epoch) = try_increment(heap, slot).unwrap() {
                                ended.fetch_max(epoch, Ordering::SeqCst);
                                break;
                            }
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            let mut rng = SplitMix64::new(seed ^ 0xC10C);
            // ORDERING: a stop flag; the scope's joins order everything else.
            while !done.load(Ordering::Relaxed) {
                if rng.next_u64().is_multiple_of(3) {
                    let covered = ended.load(Ordering::SeqCst);
                    heap.sync().unwrap();
                    syncs.lock().unwrap().push((covered, sim.events()));
                } else {
                    heap.advance_epoch().unwrap();
                }
                std::thread::yield_now();
            }
        });
        let results: Vec<_> = workers
            .into_iter()
            .map(std::thread::ScopedJoinHandle::join)
            .collect();
        done.store(true, Ordering::Relaxed);
        for result in results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
    syncs.into_inner().unwrap()
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
    let mode = SimMode::ALL[(seed % 4) as usize];
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
        let sim = heap.simulator().unwrap();
        let step = sim.events() + rng.below_or_equal(THREADS * INCREMENTS_PER_THREAD * 10);
        sim.crash_at(step);
        eprintln!("seed {seed} generation {generation_index}: crash point {step}");
        let syncs = generation(&heap, &slots, seed.wrapping_add(generation_index as u64));
        let image = sim.crash(seed);
        drop(heap);

        let word = image.epoch_word().unwrap();
        let cut = word.saturating_sub(2);
        for &(covered, returned_at) in &syncs {
            if returned_at <= step {
                assert!(
                    cut >= covered,
                    "generation {generation_index}: a sync covering epoch {covered} returned \
                     before the crash, but the recovered clock covers only epochs <= {cut}"
                );
            }
        }
        let want = model(&state, &slots, cut);
        heap = Heap::open_image(image, &config).unwrap();
        found = recovered(&heap, owner);
        let got: BTreeMap<u64, u64> = found.iter().map(|(id, (_, v))| (*id, *v)).collect();
        assert_eq!(
            got, want,
            "generation {generation_index}: crash at step {step}, stored epoch {word}"
        );
        state = want;
    }
}

#[test]
fn recovered_counters_are_the_model_of_the_recovered_epochs() {
    for_each_seed("payload counters", 24, run_seed);
}
