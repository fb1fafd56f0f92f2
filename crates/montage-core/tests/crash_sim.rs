//! Crash-simulator tests of the heap: a seeded workload of allocations, writes, persists and
//! frees runs on the simulator; a crash is taken at a random persistence event; the heap is
//! recovered from the image and checked against what the workload was promised.
//!
//! `MONTAGE_CRASH_SEEDS=N` runs more seeds; `MONTAGE_CRASH_SEED=S` replays one.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::{BTreeMap, BTreeSet};

use montage_core::Epoch;
use montage_core::limits::{HEADER_LEN, MIN_HEAP_SIZE};
use montage_core::raw;
use montage_core::raw::{BlockSpec, Verdict};
use montage_core::sim::{SimMode, SplitMix64};
use montage_core::{BlockInfo, Error, Heap, HeapConfig, PBlock, ScanFilter};
use montage_testkit::for_each_seed;

const HEAP: u64 = 1 << 20;

/// These tests exercise the raw block layer, whose blocks carry epochs the test chose: recover
/// keeping every valid block rather than applying the epoch rule.
fn open_raw(
    image: montage_core::sim::CrashImage,
    config: &HeapConfig,
) -> montage_core::Result<Heap> {
    raw::open_image_with(image, config, |_| Verdict::Keep)
}

fn config(mode: SimMode) -> HeapConfig {
    HeapConfig::simulated(HEAP, mode).recovery_threads(2)
}

/// A heap of the minimum size that grows to twice `HEAP`: the workload grows it many times.
fn growing(mode: SimMode) -> HeapConfig {
    HeapConfig::simulated(MIN_HEAP_SIZE, mode)
        .recovery_threads(2)
        .max_size(2 * HEAP)
}

/// The bytes of version `version` of payload `uid`: distinct for every (uid, version).
fn content(uid: u64, version: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(uid.wrapping_mul(1_000_003) ^ version);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// What the workload did to one payload, in persistence-event time.
#[derive(Debug, Clone)]
struct Payload {
    block: PBlock,
    len: usize,
    /// (version, event before the write started, event after its persist completed).
    versions: Vec<(u64, u64, Option<u64>)>,
    alloc_started: u64,
    /// Event after the allocation returned: the block was handed out by then. (A free's
    /// invalidation becomes durable only when the allocator drains it, which an allocation
    /// may do on its way to handing the block out again.)
    alloc_done: u64,
    free_started: Option<u64>,
}

/// How many steps a workload runs; halfway through, it frees everything and its small
/// payloads change size (see `run_workload`).
const STEPS: u64 = 120;

/// Runs the workload of `seed`. With `crash_at`, the simulator snapshots before that event.
/// Returns the heap and what happened.
///
/// Halfway through, the workload frees every live payload and its small payloads grow from
/// at most 300 bytes to 1 to 4 KiB: the heap has too few free spans left for the new size
/// classes, so allocations release the spans whose blocks are all free while the heap runs
/// (the crash may come at any step of that).
fn run_workload(mode: SimMode, seed: u64, crash_at: Option<u64>) -> (Heap, BTreeMap<u64, Payload>) {
    let (heap, payloads, _) = run_workload_on(&config(mode), seed, crash_at);
    (heap, payloads)
}

/// [`run_workload`] on the heap `config` creates; also returns the heap's size after each
/// step, with the event count then.
fn run_workload_on(
    config: &HeapConfig,
    seed: u64,
    crash_at: Option<u64>,
) -> (Heap, BTreeMap<u64, Payload>, Vec<(u64, u64)>) {
    let heap = Heap::create(config).unwrap();
    let sim = heap.simulator().unwrap();
    if let Some(step) = crash_at {
        sim.crash_at(step);
    }
    let mut rng = SplitMix64::new(seed);
    let mut payloads: BTreeMap<u64, Payload> = BTreeMap::new();
    let mut live: Vec<u64> = Vec::new();
    let mut next_uid = 1;
    let mut sizes = vec![(sim.events(), heap.size())];
    for step in 0..STEPS {
        if heap.size() != sizes.last().unwrap().1 {
            sizes.push((sim.events(), heap.size()));
        }
        if step == STEPS / 2 {
            for uid in live.drain(..) {
                let p = payloads.get_mut(&uid).unwrap();
                p.free_started = Some(sim.events());
                heap.raw().free(p.block).unwrap();
            }
        }
        match rng.next_u64() % 10 {
            0..=4 => {
                let len = if rng.next_u64().is_multiple_of(16) {
                    70_000 + (rng.next_u64() % 1000) as usize
                } else if step < STEPS / 2 {
                    1 + (rng.next_u64() % 300) as usize
                } else {
                    1000 + (rng.next_u64() % 3000) as usize
                };
                let uid = next_uid;
                next_uid += 1;
                let started = sim.events();
                let block = match heap
                    .raw()
                    .alloc_bytes(BlockSpec::new(Epoch::new(1), uid), &content(uid, 0, len))
                {
                    Ok(block) => block,
                    Err(Error::OutOfSpace { .. }) => continue,
                    Err(e) => panic!("alloc failed: {e}"),
                };
                let alloc_done = sim.events();
                let persisted = if rng.next_u64().is_multiple_of(4) {
                    None
                } else {
                    heap.raw().persist_block(block).unwrap();
                    Some(sim.events())
                };
                payloads.insert(
                    uid,
                    Payload {
                        block,
                        len,
                        versions: vec![(0, started, persisted)],
                        alloc_started: started,
                        alloc_done,
                        free_started: None,
                    },
                );
                live.push(uid);
            }
            5..=7 if !live.is_empty() => {
                let uid = live[(rng.next_u64() % live.len() as u64) as usize];
                let p = payloads.get_mut(&uid).unwrap();
                let version = p.versions.len() as u64;
                let started = sim.events();
                heap.raw()
                    .write(p.block, 0, &content(uid, version, p.len))
                    .unwrap();
                let persisted = if rng.next_u64().is_multiple_of(3) {
                    None
                } else {
                    heap.raw().persist_block(p.block).unwrap();
                    Some(sim.events())
                };
                p.versions.push((version, started, persisted));
            }
            _ if !live.is_empty() => {
                let at = (rng.next_u64() % live.len() as u64) as usize;
                let uid = live.swap_remove(at);
                let p = payloads.get_mut(&uid).unwrap();
                p.free_started = Some(sim.events());
                heap.raw().free(p.block).unwrap();
            }
            _ => {}
        }
    }
    if heap.size() != sizes.last().unwrap().1 {
        sizes.push((sim.events(), heap.size()));
    }
    (heap, payloads, sizes)
}

/// The (uid, payload) pairs a heap holds.
fn contents(heap: &Heap) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    for info in heap.collect(ScanFilter::all()).unwrap() {
        let previous = out.insert(info.spec.uid, heap.read_payload(info.block).unwrap());
        assert!(
            previous.is_none(),
            "two live blocks share uid {}",
            info.spec.uid
        );
    }
    out
}

/// Checks a recovered heap against the workload that crashed at `step`.
fn check_recovered(heap: &Heap, payloads: &BTreeMap<u64, Payload>, step: u64) {
    let found = contents(heap);
    for (uid, bytes) in &found {
        let p = payloads
            .get(uid)
            .unwrap_or_else(|| panic!("recovered uid {uid} was never allocated"));
        assert!(
            p.alloc_started < step,
            "uid {uid} allocated after the crash"
        );
        assert_eq!(bytes.len(), p.len, "uid {uid} has the wrong length");
    }
    // INV-ALLOC-1: a block handed out again was durably invalidated first, so the payload
    // it held before can never come back once the new allocation has returned. (A crash
    // while that allocation still runs may come before the free was made durable.)
    for (uid, p) in payloads {
        let reused = payloads.values().any(|q| {
            q.block == p.block && q.alloc_started > p.alloc_started && q.alloc_done < step
        });
        assert!(
            !(reused && found.contains_key(uid)),
            "uid {uid} came back although its block was reused"
        );
    }
    for (uid, p) in payloads {
        if p.free_started.is_some_and(|f| f < step) || p.alloc_started >= step {
            continue;
        }
        // The newest version made durable before the crash...
        let Some(&(version, _, _)) = p
            .versions
            .iter()
            .rfind(|(_, _, done)| done.is_some_and(|d| d <= step))
        else {
            continue;
        };
        // ...is what recovery must show, unless a later write had already begun.
        let rewritten = p
            .versions
            .iter()
            .any(|&(v, started, _)| v > version && started < step);
        if rewritten {
            assert!(found.contains_key(uid), "persisted uid {uid} was lost");
            continue;
        }
        assert_eq!(
            found.get(uid),
            Some(&content(*uid, version, p.len)),
            "persisted uid {uid} (version {version}) was lost or damaged"
        );
    }
}

/// Allocates until the heap is full and checks that no new block overlaps a recovered one
/// or another new one; returns the new blocks.
fn fill_and_check_no_overlap(heap: &Heap, seed: u64) -> Vec<BlockInfo> {
    let recovered = heap.collect(ScanFilter::all()).unwrap();
    let mut rng = SplitMix64::new(seed ^ 0xF111);
    let mut fresh = Vec::new();
    let mut failures = 0;
    while failures < 8 {
        let len = if rng.next_u64().is_multiple_of(8) {
            20_000
        } else {
            1 + rng.next_u64() % 500
        };
        match heap.raw().alloc(
            BlockSpec::new(Epoch::new(9), 1_000_000 + fresh.len() as u64),
            len,
        ) {
            Ok(block) => fresh.push(heap.info(block).unwrap()),
            Err(Error::OutOfSpace { .. }) => failures += 1,
            Err(e) => panic!("alloc after recovery failed: {e}"),
        }
    }
    let mut extents: Vec<(u64, u64, bool)> = recovered
        .iter()
        .map(|b| {
            (
                b.block.offset(),
                b.block.offset() + HEADER_LEN + b.capacity,
                true,
            )
        })
        .chain(fresh.iter().map(|b| {
            (
                b.block.offset(),
                b.block.offset() + HEADER_LEN + b.capacity,
                false,
            )
        }))
        .collect();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "blocks overlap: {:?} and {:?} (true = recovered)",
            pair[0],
            pair[1]
        );
    }
    // Recovered blocks are still intact after the allocator handed out everything else.
    for info in &recovered {
        assert_eq!(heap.info(info.block).unwrap(), *info);
    }
    fresh
}

fn crash_once(mode: SimMode, seed: u64) {
    crash_once_on(&config(mode), seed, None);
}

/// Runs the workload of `seed` on `config`'s heap, crashes it at `step` (by default a random
/// event after the heap was formatted) keeping what `crash_seed` (by default `seed`) picks
/// of the stores not yet durable, recovers it and checks it: every promise kept, its size
/// one it had around the crash, no block lost to the allocator.
fn crash_once_on(config: &HeapConfig, seed: u64, step: Option<(u64, u64)>) {
    let crash_seed = step.map_or(seed, |(_, crash_seed)| crash_seed);
    let step = step.map(|(step, _)| step);
    // Pass 1 counts the workload's persistence events (the workload is deterministic).
    let (heap, _, _) = run_workload_on(config, seed, None);
    let sim = heap.simulator().unwrap();
    let total = sim.events();
    drop(heap);
    let base = {
        let heap = Heap::create(config).unwrap();
        heap.simulator().unwrap().events()
    };
    // Pass 2 crashes at a random event after the heap was formatted.
    let mut rng = SplitMix64::new(seed ^ 0xC4A5);
    let step = step.unwrap_or_else(|| base + rng.below_or_equal(total - base));
    let (heap, payloads, sizes) = run_workload_on(config, seed, Some(step));
    let image = heap.simulator().unwrap().crash(crash_seed);
    drop(heap);
    eprintln!(
        "mode {:?} seed {seed}: crash at step {step} of {total}",
        config.backend_kind()
    );

    let recovered = open_raw(image.clone(), config).unwrap();
    assert!(!recovered.recovery_report().clean_shutdown);
    // A growth in flight at the crash may or may not have taken, and on the journal a
    // finished one is durable only with the next record: the size is one the heap had
    // before the crash or the one it was growing to, never anything else. (That no durable
    // payload in grown spans is lost, `check_recovered` checks.)
    let size = recovered.size();
    let next = sizes
        .iter()
        .find(|(at, _)| *at >= step)
        .map_or(u64::MAX, |s| s.1);
    assert!(
        size <= next && sizes.iter().any(|&(_, had)| had == size),
        "recovered a heap of {size} bytes; it had {sizes:?}, crashing at {step}"
    );
    check_recovered(&recovered, &payloads, step);
    let before_fill = contents(&recovered);
    let fresh = fill_and_check_no_overlap(&recovered, seed);

    // Free everything; after a clean close and reopen, the whole heap is free again: no
    // block was lost to the allocator.
    for info in recovered.collect(ScanFilter::all()).unwrap() {
        recovered.raw().free(info.block).unwrap();
    }
    assert!(!fresh.is_empty() || !before_fill.is_empty() || recovered.stats().free_spans == 0);
    let sim = recovered.simulator().unwrap();
    let grown = recovered.size();
    recovered.close().unwrap();
    let image = sim.durable();
    let reopened = open_raw(image, config).unwrap();
    assert!(reopened.recovery_report().clean_shutdown);
    assert_eq!(reopened.size(), grown);
    assert!(contents(&reopened).is_empty());
    let stats = reopened.stats();
    // Every span is free but the one the delete reserve was carved from.
    assert_eq!(stats.reserve_spans, 1);
    assert_eq!(
        stats.free_spans + stats.reserve_spans,
        stats.spans,
        "spans leaked"
    );
}

#[test]
fn a_heap_that_grows_keeps_every_persisted_payload_across_a_crash() {
    for mode in SimMode::ALL {
        for_each_seed(&format!("growing heap crash {mode:?}"), 24, |seed| {
            crash_once_on(&growing(mode), seed, None);
        });
    }
}

/// Seeds of the test above, on the journal, whose crash kept the heap file's entry of a
/// large block carved across the end of a growth that was not durable (the kernel wrote the
/// entry's page back before the journal made the growth durable): open refused such a heap
/// as damaged until it learned to drop the block (`recovery::scan::read_span_table`).
#[test]
fn a_journal_heap_recovers_a_large_block_left_past_the_end_by_a_growth() {
    for seed in [994, 1_099_511_628_099, 1_099_511_628_641] {
        crash_once_on(&growing(SimMode::File), seed, None);
    }
}

/// A crash at every persistence event of a growth (extending the file, clearing the new
/// group tables, writing and persisting the span count) recovers a heap of the old size or
/// of the new one, with everything that was durable.
#[test]
fn a_crash_at_every_step_of_a_growth_recovers_the_old_or_the_new_heap() {
    for mode in SimMode::ALL {
        let config = growing(mode);
        let seed = 3;
        let (heap, _, sizes) = run_workload_on(&config, seed, None);
        drop(heap);
        assert!(
            sizes.len() >= 4,
            "{mode:?}: the workload grew the heap {} times",
            sizes.len() - 1
        );
        // Every event of the workload's steps from the first growth to the end of the
        // second (a step ends where the next size is recorded), each with two crash seeds.
        for step in sizes[1].0..=sizes[2].0 {
            for crash_seed in [step, !step] {
                crash_once_on(&config, seed, Some((step, crash_seed)));
            }
        }
    }
}

/// The workloads above do reach the release of spans while the heap runs, in every mode.
#[test]
fn the_workloads_release_spans_while_the_heap_runs() {
    for mode in SimMode::ALL {
        let released: u64 = (0..24)
            .map(|seed| run_workload(mode, seed, None).0.stats().spans_released)
            .sum();
        assert!(
            released >= 12,
            "{mode:?}: {released} spans released in 24 workloads"
        );
    }
}

#[test]
fn recovered_heap_keeps_every_persisted_payload_and_never_overlaps() {
    for mode in SimMode::ALL {
        for_each_seed(&format!("heap crash {mode:?}"), 24, |seed| {
            crash_once(mode, seed);
        });
    }
}

/// Drop every third uid: recovery then has headers to invalidate, which is what a crash
/// during recovery can interrupt.
fn decide(view: &montage_core::BlockView<'_>) -> Verdict {
    if view.info().spec.uid.is_multiple_of(3) {
        Verdict::Drop
    } else {
        Verdict::Keep
    }
}

fn crash_during_recovery(mode: SimMode, seed: u64) {
    let (heap, _) = run_workload(mode, seed, None);
    let image = heap.simulator().unwrap().crash(seed);
    drop(heap);

    // The reference: recovery of the image, run to the end.
    let first = raw::open_image_with(image.clone(), &config(mode), decide).unwrap();
    let want = contents(&first);
    assert!(want.keys().all(|uid| uid % 3 != 0));
    let first_sim = first.simulator().unwrap();
    let recovery_events = first_sim.events();
    // INV-REC-2: what recovery dropped is durably gone when open returns: even a recovery
    // that would keep everything does not see it again.
    let durable = first_sim.durable();
    let keep_all = open_raw(durable, &config(mode)).unwrap();
    assert_eq!(contents(&keep_all), want, "a dropped block came back");
    drop(keep_all);
    drop(first);

    // Crash that recovery part-way, then recover again: the same state.
    let mut rng = SplitMix64::new(seed ^ 0x5EC0);
    let step = rng.below_or_equal(recovery_events);
    let interrupted =
        raw::open_image_with(image, &config(mode).sim_crash_at(step), decide).unwrap();
    let second_image = interrupted.simulator().unwrap().crash(seed.wrapping_add(1));
    drop(interrupted);
    let second = raw::open_image_with(second_image, &config(mode), decide).unwrap();
    assert_eq!(
        contents(&second),
        want,
        "crash at recovery step {step} changed the result"
    );

    // And recovery is idempotent: recovering the recovered heap changes nothing.
    let sim = second.simulator().unwrap();
    drop(second);
    let third_image = sim.durable();
    let third = raw::open_image_with(third_image, &config(mode), decide).unwrap();
    assert_eq!(contents(&third), want);
    assert_eq!(third.recovery_report().blocks_dropped, 0);
    fill_and_check_no_overlap(&third, seed);
}

#[test]
fn a_crash_during_recovery_gives_the_same_state_as_an_uninterrupted_recovery() {
    for mode in SimMode::ALL {
        for_each_seed(&format!("recovery crash {mode:?}"), 16, |seed| {
            crash_during_recovery(mode, seed);
        });
    }
}

#[test]
fn a_crash_during_create_leaves_a_file_open_rejects() {
    let heap = Heap::create(&config(SimMode::Prefix)).unwrap();
    let events = heap.simulator().unwrap().events();
    drop(heap);
    let mut outcomes = BTreeSet::new();
    for step in 0..events {
        for seed in 0..4 {
            let sim_heap = Heap::create(&config(SimMode::Prefix).sim_crash_at(step)).unwrap();
            let image = sim_heap.simulator().unwrap().crash(seed);
            drop(sim_heap);
            match open_raw(image, &config(SimMode::Prefix)) {
                Ok(heap) => {
                    assert!(contents(&heap).is_empty());
                    outcomes.insert("heap");
                }
                Err(Error::BadMagic) => {
                    outcomes.insert("not a heap");
                }
                Err(e) => panic!("crash at create step {step} gave {e}"),
            }
        }
    }
    assert!(outcomes.contains("not a heap"));
}

/// `OpGuard::discard` retires a block without an anti-block: none is written, the block is
/// not live from then on, a crash before its reclamation brings it back whole (its deletion
/// was never recorded), and once it is reclaimed it is gone for good.
#[test]
fn a_discarded_block_writes_no_anti_block_and_comes_back_only_until_reclaimed() {
    use montage_core::{BlockKind, EpochLength};

    let config = HeapConfig::simulated(4 << 20, SimMode::Prefix).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("x").unwrap();
    let block = heap.run_op(|op| op.alloc(owner, 1, b"kept")).unwrap();
    heap.advance_epoch().unwrap();
    heap.run_op(|op| op.discard(block)).unwrap();
    heap.sync().unwrap();
    let all = heap.collect(ScanFilter::all()).unwrap();
    assert!(
        all.iter().all(|info| info.spec.kind != BlockKind::Delete),
        "an anti-block"
    );
    let live = |heap: &Heap| heap.collect(ScanFilter::all().owner(owner).live()).unwrap();
    assert!(live(&heap).is_empty());
    let sim = heap.simulator().unwrap();
    let back = Heap::open_image(sim.crash(1), &config).unwrap();
    let found = live(&back);
    assert_eq!(found.len(), 1);
    assert_eq!(back.read_payload(found[0].block).unwrap(), b"kept");
    drop(back);
    for _ in 0..4 {
        heap.advance_epoch().unwrap();
    }
    heap.sync().unwrap();
    let gone = Heap::open_image(sim.crash(2), &config).unwrap();
    assert!(live(&gone).is_empty());
}
