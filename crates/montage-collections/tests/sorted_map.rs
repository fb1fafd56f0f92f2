//! `SortedMap`: semantics against `BTreeMap` (including ranges in both directions),
//! reopening, a linearizability check of concurrent histories, and recovery of a million
//! entries.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::ops::Bound;

use montage_collections::SortedMap;
use montage_core::sim::SimMode;
use montage_core::{Error, Heap, HeapConfig, Result};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Insert(u16, u32),
    Remove(u16),
    Get(u16),
    Update(u16),
    Range(u16, u16, bool),
    Advance,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u16..64, any::<u32>()).prop_map(|(k, v)| Step::Insert(k, v)),
        2 => (0u16..64).prop_map(Step::Remove),
        2 => (0u16..64).prop_map(Step::Get),
        1 => (0u16..64).prop_map(Step::Update),
        2 => (0u16..70, 0u16..70, any::<bool>()).prop_map(|(a, b, rev)| Step::Range(a.min(b), a.max(b), rev)),
        1 => Just(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `BTreeMap` returns, across epochs and through purges of
    /// removed keys, and a reopened heap holds the same entries.
    #[test]
    fn behaves_like_btreemap_and_survives_a_reopen(steps in proptest::collection::vec(step(), 1..150)) {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::create(&config).unwrap();
        let map: SortedMap<String, u32> = SortedMap::open(&heap, "m").unwrap();
        let mut model: BTreeMap<String, u32> = BTreeMap::new();
        let key = |k: u16| format!("key-{k:03}");
        for step in steps {
            match step {
                Step::Insert(k, v) => prop_assert_eq!(map.insert(key(k), v).unwrap(), model.insert(key(k), v)),
                Step::Remove(k) => prop_assert_eq!(map.remove(&key(k)).unwrap(), model.remove(&key(k))),
                Step::Get(k) => {
                    prop_assert_eq!(map.get(&key(k)).unwrap(), model.get(&key(k)).copied());
                    prop_assert_eq!(map.contains_key(&key(k)).unwrap(), model.contains_key(&key(k)));
                }
                Step::Update(k) => {
                    let got = map.update(&key(k), |v| v.wrapping_mul(3)).unwrap();
                    let want = model.get_mut(&key(k)).map(|v| { *v = v.wrapping_mul(3); *v });
                    prop_assert_eq!(got, want);
                }
                Step::Range(a, b, rev) => {
                    let bounds = (Bound::Included(key(a)), Bound::Excluded(key(b)));
                    let mut got: Vec<(String, u32)> = map.range(bounds.clone()).collect::<Result<_>>().unwrap();
                    let mut want: Vec<(String, u32)> = model.range(bounds).map(|(k, v)| (k.clone(), *v)).collect();
                    if rev {
                        got = map.range((Bound::Included(key(a)), Bound::Excluded(key(b)))).rev().collect::<Result<_>>().unwrap();
                        want.reverse();
                    }
                    prop_assert_eq!(got, want);
                }
                Step::Advance => { heap.advance_epoch().unwrap(); }
            }
            prop_assert_eq!(map.len(), model.len());
            prop_assert_eq!(
                map.first_key_value().unwrap(),
                model.first_key_value().map(|(k, v)| (k.clone(), *v))
            );
            prop_assert_eq!(
                map.last_key_value().unwrap(),
                model.last_key_value().map(|(k, v)| (k.clone(), *v))
            );
        }
        drop(map);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(2);
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let map: SortedMap<String, u32> = SortedMap::open(&heap, "m").unwrap();
        let all: Vec<(String, u32)> = map.iter().collect::<Result<_>>().unwrap();
        prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}

#[test]
fn reopening_with_other_types_is_a_layout_mismatch() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    SortedMap::<u64, u64>::open(&heap, "m")
        .unwrap()
        .insert(1, 2)
        .unwrap();
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let err = SortedMap::<String, u64>::open(&heap, "m").unwrap_err();
    assert!(matches!(err, Error::LayoutMismatch { .. }), "{err:?}");
}

#[test]
fn concurrent_histories_are_linearizable() {
    common::check_map_linearizability(common::open_sorted_map);
}

#[test]
fn a_million_entries_are_recovered() {
    common::check_million_recovered(common::open_sorted_map);
}

#[test]
fn entries_written_and_removed_in_one_epoch_reuse_their_blocks() {
    common::check_churn_in_one_epoch(common::open_sorted_map);
}
