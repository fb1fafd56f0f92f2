//! `NbHashMap`: semantics against `std`'s map across epochs and a crash-reopen, a
//! linearizability check of concurrent histories, and recovery of a million entries.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;

use montage_collections::NbHashMap;
use montage_core::sim::SimMode;
use montage_core::{Heap, HeapConfig};
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
