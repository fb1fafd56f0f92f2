//! `NbHashMap`: semantics against `std`'s map across epochs and a crash-reopen, a
//! linearizability check of concurrent histories, and recovery of a million entries.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use montage_collections::NbHashMap;
use montage_core::sim::{self, NamedReadPoint, SimMode};
use montage_core::{EpochLength, Heap, HeapConfig, PBlock};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `std`'s map returns, across epochs (so through removed
    /// keys' stamps and their purge), with few buckets so that lists grow, and a reopened
    /// heap holds the same entries.
    #[test]
    fn behaves_like_std_and_survives_a_reopen(steps in proptest::collection::vec((0u8..9, 0u8..24, any::<u16>()), 1..150)) {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::create(&config).unwrap();
        let map: NbHashMap<u64, Vec<u8>> = NbHashMap::with_buckets(&heap, "m", 4).unwrap();
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for (kind, key, v) in steps {
            let key = u64::from(key);
            let value = v.to_le_bytes().repeat(usize::from(v % 4));
            match kind {
                0 | 1 => prop_assert_eq!(map.insert(key, value.clone()).unwrap(), model.insert(key, value)),
                2 => prop_assert_eq!(map.remove(&key).unwrap(), model.remove(&key)),
                3 => {
                    prop_assert_eq!(map.get(&key).unwrap(), model.get(&key).cloned());
                    prop_assert_eq!(map.contains_key(&key).unwrap(), model.contains_key(&key));
                }
                4 => {
                    let got = map.compare_and_set(&key, &value, vec![1]).unwrap();
                    let want = match model.get(&key) {
                        Some(found) if *found == value => { model.insert(key, vec![1]); Ok(()) }
                        other => Err(other.cloned()),
                    };
                    prop_assert_eq!(got, want);
                }
                5 => prop_assert_eq!(map.put(key, value.clone()).unwrap(), model.insert(key, value).is_some()),
                // A borrowed slice, stored as the `Vec<u8>` it encodes as.
                7 => prop_assert_eq!(map.put_ref(key, &value[..]).unwrap(), model.insert(key, value).is_some()),
                6 => prop_assert_eq!(map.delete(&key).unwrap(), model.remove(&key).is_some()),
                _ => { heap.advance_epoch().unwrap(); }
            }
            prop_assert_eq!(map.len(), model.len());
        }
        let all: BTreeMap<u64, Vec<u8>> = map.iter().map(Result::unwrap).collect();
        prop_assert_eq!(&all, &model);
        drop(map);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(6);
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let map: NbHashMap<u64, Vec<u8>> = NbHashMap::with_buckets(&heap, "m", 4).unwrap();
        let all: BTreeMap<u64, Vec<u8>> = map.iter().map(Result::unwrap).collect();
        prop_assert_eq!(all, model);
    }
}

#[test]
fn concurrent_histories_are_linearizable() {
    common::check_map_linearizability(common::open_nb_hash_map);
}

#[test]
fn a_million_entries_are_recovered() {
    common::check_million_recovered(common::open_nb_hash_map);
}

/// A heap whose clock moves only when a test advances it, and a map on it with one bucket
/// a key (so that every key below lives in its bucket's inline entry), holding key 1 in an
/// entry of an epoch the clock has left behind.
fn one_entry_map() -> (Heap, Arc<NbHashMap<u64, Vec<u8>>>) {
    let heap =
        Heap::create(&HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual)).unwrap();
    let map = Arc::new(NbHashMap::with_buckets(&heap, "m", 64).unwrap());
    map.put(1, vec![1; 64]).unwrap();
    reclaim(&heap);
    (heap, map)
}

/// The payload of a map entry of `key` holding `value` (`entry.rs`'s layout: the key's
/// length, the key, the value).
fn entry_bytes(key: u64, value: &[u8]) -> Vec<u8> {
    [&8u32.to_le_bytes()[..], &key.to_le_bytes(), value].concat()
}

/// Frees the blocks of the entries deleted or replaced so far: they are handed back once
/// the clock is far enough past their epoch that no operation can still read them.
fn reclaim(heap: &Heap) {
    for _ in 0..4 {
        heap.advance_epoch().unwrap();
    }
}

/// Runs `hook` at `point` of the next read outside an operation on this thread, once.
fn at_read_point(point: NamedReadPoint, hook: impl FnOnce(PBlock) + 'static) {
    let mut hook = Some(hook);
    sim::pause_named_reads_at(Some(Box::new(move |(reached, block)| {
        if reached == point
            && let Some(hook) = hook.take()
        {
            hook(block);
        }
    })));
}

/// A read outside an operation that loads a key's payload handle, and then finds that
/// block freed and handed out to another key's entry before it reads it, does not return
/// the other key's value: the bucket no longer names the block after the read.
#[test]
fn a_read_outside_an_operation_never_returns_a_reused_blocks_new_entry() {
    let (heap, map) = one_entry_map();
    let (writer, heap_for_hook) = (Arc::clone(&map), heap.clone());
    at_read_point(NamedReadPoint::Named, move |block| {
        assert!(writer.delete(&1).unwrap());
        reclaim(&heap_for_hook);
        // New entries until one takes the freed block.
        let taken = (2..5_000).find(|&key| {
            assert!(!writer.put(key, vec![2; 64]).unwrap());
            heap_for_hook.read_payload(block).ok() == Some(entry_bytes(key, &[2; 64]))
        });
        assert!(taken.is_some(), "no new entry took the freed block");
    });
    assert_eq!(map.get(&1).unwrap(), None);
    sim::pause_named_reads_at(None);
    assert_eq!(map.get(&2).unwrap(), Some(vec![2; 64]));
}

/// A read outside an operation that checks a block's header, and then reads a payload that
/// another structure wrote into the block after it was freed, does not return that payload,
/// which was never the key's value, even when the key's next entry has taken the block by
/// the time the read checks the bucket: the block's meta word changed.
#[test]
fn a_read_outside_an_operation_never_returns_a_payload_no_one_published() {
    let (heap, map) = one_entry_map();
    let other = heap.register("other").unwrap();
    let (writer, heap_for_hook) = (Arc::clone(&map), heap.clone());
    let mut seen = None;
    sim::pause_named_reads_at(Some(Box::new(move |(point, block)| match point {
        NamedReadPoint::Viewed => {
            // The entry is deleted, its block freed and written by an operation that
            // aborts: a payload that is never published.
            assert!(writer.delete(&1).unwrap());
            reclaim(&heap_for_hook);
            // Another structure's blocks, kept, until one takes the freed block; that one
            // is deleted at once and goes back to this thread's free list, first in line.
            for _ in 0..5_000 {
                let taken = heap_for_hook
                    .run_op(|op| op.alloc(other, 1, &entry_bytes(1, &[9; 64])))
                    .unwrap();
                if taken == block {
                    heap_for_hook
                        .run_op(|op| op.delete_unshared(block))
                        .unwrap();
                    seen = Some(block);
                    return;
                }
            }
            panic!("no allocation took the freed block");
        }
        NamedReadPoint::Read if seen == Some(block) => {
            // The key's next entry takes the block, so that the bucket names it again.
            assert!(!writer.put(1, vec![3; 64]).unwrap());
            assert_eq!(
                heap_for_hook.read_payload(block).unwrap(),
                entry_bytes(1, &[3; 64])
            );
            seen = None;
        }
        _ => {}
    })));
    assert_eq!(map.get(&1).unwrap(), Some(vec![3; 64]));
    sim::pause_named_reads_at(None);
}

/// Reads outside operations while their keys' owners replace and delete entries, under a
/// clock that moves every few tens of microseconds in a heap so small that freed blocks are
/// handed out again within a few epochs, with most keys in their buckets' lists: every
/// value read is whole and of its key, and no reader sees a key's versions go back.
#[test]
fn reads_outside_operations_stay_whole_and_ordered_while_blocks_are_reused() {
    const THREADS: u64 = 3;
    const KEYS: u64 = 24;
    const OPS: u64 = 200_000;
    // A value: its key and version in every one of its eight words.
    let value = |key: u64, version: u64| ((key << 40) | version).to_le_bytes().repeat(8);
    let heap =
        Heap::create(&HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual)).unwrap();
    let map: NbHashMap<u64, Vec<u8>> = NbHashMap::with_buckets(&heap, "m", 4).unwrap();
    let tick = || {
        heap.advance_epoch().unwrap();
        std::thread::sleep(std::time::Duration::from_micros(30));
    };
    montage_testkit::run_with_clock(THREADS as usize, tick, |t| {
        let t = t as u64;
        let mut rng = sim::SplitMix64::new(t + 7);
        let mut last_seen = [0u64; KEYS as usize];
        let mut found = 0;
        for version in 1..=OPS {
            let key = rng.next_u64() % KEYS;
            let got = if key % THREADS == t {
                // This thread's key: only it writes it, so a read returns what it wrote.
                let written = (!rng.next_u64().is_multiple_of(4)).then(|| value(key, version));
                match &written {
                    Some(bytes) => map.put(key, bytes.clone()).map(|_| ()).unwrap(),
                    None => map.delete(&key).map(|_| ()).unwrap(),
                }
                let got = map.get(&key).unwrap();
                assert_eq!(got, written, "thread {t} key {key}");
                got
            } else {
                map.get(&key).unwrap()
            };
            let Some(read) = got else {
                continue;
            };
            found += 1;
            let word = u64::from_le_bytes(read[..8].try_into().unwrap());
            assert_eq!(read, value(key, word & ((1 << 40) - 1)), "a torn value");
            assert_eq!(word >> 40, key, "a value of another key");
            let seen = word & ((1 << 40) - 1);
            assert!(
                seen >= last_seen[key as usize],
                "key {key}: version {seen} after {}",
                last_seen[key as usize]
            );
            last_seen[key as usize] = seen;
        }
        assert!(
            found > OPS / 4,
            "thread {t} found {found} values in {OPS} reads"
        );
    });
}
