//! `HashMap`: semantics against `std`'s map, reopening, typed values, a linearizability
//! check of concurrent histories, and recovery of a million entries.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;

use montage_collections::{Change, HashMap};
use montage_core::sim::SimMode;
use montage_core::{Error, Heap, HeapConfig};
use proptest::prelude::*;

fn sim_heap(size: u64) -> Heap {
    Heap::create(&HeapConfig::simulated(size, SimMode::Prefix)).unwrap()
}

#[derive(Debug, Clone)]
enum Step {
    Insert(u8, u16),
    Put(u8, u16),
    PutRef(u8, u16),
    PutRefLen(u8, u16),
    Remove(u8),
    Delete(u8),
    Get(u8),
    Update(u8),
    CompareAndSet(u8, u16, u16),
    Compute(u8, u16),
    Advance,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::Insert(k % 16, v)),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::Put(k % 16, v)),
        1 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::PutRef(k % 16, v)),
        1 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::PutRefLen(k % 16, v)),
        2 => any::<u8>().prop_map(|k| Step::Remove(k % 16)),
        1 => any::<u8>().prop_map(|k| Step::Delete(k % 16)),
        2 => any::<u8>().prop_map(|k| Step::Get(k % 16)),
        1 => any::<u8>().prop_map(|k| Step::Update(k % 16)),
        1 => (any::<u8>(), any::<u16>(), any::<u16>()).prop_map(|(k, a, b)| Step::CompareAndSet(k % 16, a % 4, b)),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Step::Compute(k % 16, v)),
        1 => Just(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every method returns what `std`'s map returns, across epochs, and a reopened heap
    /// holds the same entries.
    #[test]
    fn behaves_like_std_and_survives_a_reopen(steps in proptest::collection::vec(step(), 1..120)) {
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::create(&config).unwrap();
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for step in steps {
            match step {
                Step::Insert(k, v) => {
                    let value = v.to_le_bytes().repeat(usize::from(v % 5));
                    prop_assert_eq!(map.insert(u64::from(k), value.clone()).unwrap(), model.insert(u64::from(k), value));
                }
                Step::Put(k, v) => {
                    // Long values too: they are read back past the default decoder's stack buffer.
                    let value = v.to_le_bytes().repeat(usize::from(v % 300));
                    prop_assert_eq!(map.put(u64::from(k), value.clone()).unwrap(), model.insert(u64::from(k), value).is_some());
                }
                Step::PutRef(k, v) => {
                    // A borrowed slice, stored as the `Vec<u8>` it encodes as.
                    let value = v.to_le_bytes().repeat(usize::from(v % 300));
                    prop_assert_eq!(map.put_ref(u64::from(k), &value[..]).unwrap(), model.insert(u64::from(k), value).is_some());
                }
                Step::PutRefLen(k, v) => {
                    // The length of the entry replaced: an 8-byte key and the old value.
                    let value = v.to_le_bytes().repeat(usize::from(v % 300));
                    let replaced = model.insert(u64::from(k), value.clone());
                    let want = replaced.map(|old| HashMap::<u64, Vec<u8>>::entry_len(8, old.len()));
                    prop_assert_eq!(map.put_ref_len(u64::from(k), &value[..]).unwrap(), want);
                }
                Step::Remove(k) => prop_assert_eq!(map.remove(&u64::from(k)).unwrap(), model.remove(&u64::from(k))),
                Step::Delete(k) => prop_assert_eq!(map.delete(&u64::from(k)).unwrap(), model.remove(&u64::from(k)).is_some()),
                Step::Get(k) => {
                    prop_assert_eq!(map.get(&u64::from(k)).unwrap(), model.get(&u64::from(k)).cloned());
                    prop_assert_eq!(map.contains_key(&u64::from(k)).unwrap(), model.contains_key(&u64::from(k)));
                }
                Step::Update(k) => {
                    let got = map.update(&u64::from(k), |v| { let mut v = v.clone(); v.push(7); v }).unwrap();
                    let want = model.get_mut(&u64::from(k)).map(|v| { v.push(7); v.clone() });
                    prop_assert_eq!(got, want);
                }
                Step::CompareAndSet(k, a, b) => {
                    let current = a.to_le_bytes().repeat(usize::from(a % 5));
                    let new = b.to_le_bytes().to_vec();
                    let got = map.compare_and_set(&u64::from(k), &current, new.clone()).unwrap();
                    let want = match model.get(&u64::from(k)) {
                        Some(v) if *v == current => { model.insert(u64::from(k), new); Ok(()) }
                        other => Err(other.cloned()),
                    };
                    prop_assert_eq!(got, want);
                }
                Step::Compute(k, v) => {
                    // Absent: insert when v is even. Present: remove a long value, else
                    // append v's low byte. Either way, report what was there.
                    let decide = |current: Option<&Vec<u8>>| match current {
                        None if v % 2 == 0 => Change::Set(vec![v as u8]),
                        None => Change::Keep,
                        Some(x) if x.len() > 4 => Change::Remove,
                        Some(x) => Change::Set([&x[..], &[v as u8]].concat()),
                    };
                    let got = map.compute(&u64::from(k), |current| (decide(current.as_ref()), current)).unwrap();
                    let want = model.get(&u64::from(k)).cloned();
                    match decide(want.as_ref()) {
                        Change::Set(new) => { model.insert(u64::from(k), new); }
                        Change::Remove => { model.remove(&u64::from(k)); }
                        Change::Keep => {}
                    }
                    prop_assert_eq!(got, want);
                }
                Step::Advance => { heap.advance_epoch().unwrap(); }
            }
            prop_assert_eq!(map.len(), model.len());
        }
        let mut all: Vec<_> = map.iter().collect::<montage_core::Result<_>>().unwrap();
        all.sort();
        prop_assert_eq!(&all, &model.clone().into_iter().collect::<Vec<_>>());
        drop(map);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(1);
        drop(heap);
        let heap = Heap::open_image(image, &config).unwrap();
        let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "m").unwrap();
        prop_assert_eq!(map.len(), model.len());
        for (k, v) in &model {
            prop_assert_eq!(map.get(k).unwrap(), Some(v.clone()));
        }
    }
}

#[derive(montage_derive::Payload, Debug, Clone, Copy, PartialEq)]
#[payload(crate = "montage_core")]
#[repr(C)]
struct Account {
    balance: i64,
    opened: u32,
    frozen: bool,
    _pad: [u8; 3],
}

#[test]
fn typed_values_and_string_keys() {
    let heap = sim_heap(1 << 20);
    let map: HashMap<String, Account> = HashMap::open(&heap, "accounts").unwrap();
    let alice = Account {
        balance: 10,
        opened: 2024,
        frozen: false,
        _pad: [0; 3],
    };
    assert_eq!(map.insert("alice".to_owned(), alice).unwrap(), None);
    let richer = map
        .update(&"alice".to_owned(), |a| Account {
            balance: a.balance + 5,
            ..*a
        })
        .unwrap();
    assert_eq!(richer.map(|a| a.balance), Some(15));
    // Lookups take a borrowed key, as std's map does.
    assert_eq!(map.get("alice").unwrap().map(|a| a.balance), Some(15));
    assert!(map.contains_key("alice").unwrap());
    assert_eq!(map.get("bob").unwrap(), None);
    assert_eq!(map.remove("alice").unwrap().map(|a| a.balance), Some(15));
    assert!(!map.contains_key("alice").unwrap());
}

/// `put_ref` stores a borrowed form exactly as `put` stores the owned value it encodes as:
/// a `&str` for `String` values, read back (and after a reopen) as the `String`.
#[test]
fn put_ref_stores_a_borrowed_form_as_its_owned_type() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, String> = HashMap::open(&heap, "names").unwrap();
    assert!(!map.put_ref(1, "first").unwrap());
    assert!(map.put_ref(1, "second").unwrap());
    map.put(2, "owned".to_owned()).unwrap();
    assert_eq!(map.get(&1).unwrap().as_deref(), Some("second"));
    drop(map);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(1);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let map: HashMap<u64, String> = HashMap::open(&heap, "names").unwrap();
    assert_eq!(map.get(&1).unwrap().as_deref(), Some("second"));
    assert_eq!(map.get(&2).unwrap().as_deref(), Some("owned"));
}

#[test]
fn reopening_with_other_types_is_a_layout_mismatch() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    map.insert(1, 2).unwrap();
    drop(map);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let err = HashMap::<u64, Vec<u8>>::open(&heap, "m").unwrap_err();
    assert!(matches!(err, Error::LayoutMismatch { .. }), "{err:?}");
    let map = HashMap::<u64, u64>::open(&heap, "m").unwrap();
    assert_eq!(map.get(&1).unwrap(), Some(2));
}

/// A hasher under which every key collides.
#[derive(Default)]
struct Constant;

impl std::hash::Hasher for Constant {
    fn finish(&self) -> u64 {
        7
    }
    fn write(&mut self, _: &[u8]) {}
}

type Colliding = std::hash::BuildHasherDefault<Constant>;

/// The index hashes with the hasher it was opened with (here every key collides: one
/// stripe, one probe sequence, which still finds every key), through a together's
/// rollback too; the heap does not depend on it, so the map reopens with the default.
#[test]
fn a_map_hashes_with_the_hasher_it_was_opened_with() {
    let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, u64, Colliding> =
        HashMap::open_with_hasher(&heap, "m", Colliding::default(), |_, _| {}).unwrap();
    for k in 0..500 {
        assert!(!map.put(k, k + 1).unwrap());
    }
    assert_eq!(map.remove(&3).unwrap(), Some(4));
    assert_eq!(map.get(&499).unwrap(), Some(500));
    assert_eq!(map.get(&3).unwrap(), None);
    // A together that removes and adds, then fails: both taken back.
    let failed: montage_core::Result<()> = montage_collections::together(&heap, |tx| {
        tx.hash_map(&map, |m| {
            assert!(m.delete(&10)?);
            m.put(1000, 1)?;
            Err(Error::Unsupported {
                what: "rolled back",
            })
        })
    });
    assert!(matches!(failed, Err(Error::Unsupported { .. })));
    assert_eq!(
        (map.get(&10).unwrap(), map.get(&1000).unwrap()),
        (Some(11), None)
    );
    assert_eq!(map.len(), 499);
    drop(map);
    let heap = common::reopen_after_synced_crash(heap, &config);
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    assert_eq!(map.len(), 499);
    let all: Vec<(u64, u64)> = (0..500).filter(|&k| k != 3).map(|k| (k, k + 1)).collect();
    let mut found: Vec<(u64, u64)> = map.iter().map(Result::unwrap).collect();
    found.sort_unstable();
    assert_eq!(found, all);
}

#[test]
fn concurrent_histories_are_linearizable() {
    common::check_map_linearizability(common::open_hash_map);
}

#[test]
fn a_million_entries_are_recovered() {
    common::check_million_recovered(common::open_hash_map);
}

#[test]
fn open_with_shows_every_recovered_entry_once() {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
    let heap = Heap::create(&config).unwrap();
    let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
    for k in 0..100 {
        map.insert(k, k * 3).unwrap();
    }
    map.remove(&7).unwrap();
    drop(map);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(0);
    drop(heap);
    let heap = Heap::open_image(image, &config).unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    let map = HashMap::<u64, u64>::open_with(&heap, "m", |k, v| {
        seen.lock().unwrap().push((*k, *v));
    })
    .unwrap();
    let mut seen = seen.into_inner().unwrap();
    seen.sort_unstable();
    let expected: Vec<(u64, u64)> = (0..100).filter(|&k| k != 7).map(|k| (k, k * 3)).collect();
    assert_eq!(seen, expected);
    assert_eq!(map.len(), 99);
}

/// Every key a map holds when `sync()` returns is read back, before and after the heap is
/// reopened, from a heap file on a tmpfs mounted for huge pages that two threads filled at
/// the collapsing thread's priority, so that it collapsed the heap's pages while they were
/// stored to (`docs/PERFORMANCE.md`, "Found: the collapse of unwritten pages loses
/// stores"). Skipped where the test may not mount a tmpfs.
#[test]
fn a_map_filled_on_a_huge_page_tmpfs_keeps_every_synced_key() {
    const KEYS: u64 = 400_000;
    let value = |key: u64| -> Vec<u8> { key.to_le_bytes().repeat(32) };
    montage_testkit::on_huge_tmpfs(1 << 30, |dir| {
        let config = HeapConfig::new(dir.join("map.heap")).size(256 << 20);
        let check = |heap: &Heap| {
            let map = HashMap::<u64, Vec<u8>>::open(heap, "map").unwrap();
            let lost: Vec<u64> = (0..KEYS)
                .filter(|&key| map.get(&key).unwrap() != Some(value(key)))
                .collect();
            assert!(
                lost.is_empty(),
                "{} keys lost: {:?} ...",
                lost.len(),
                &lost[..10.min(lost.len())]
            );
        };
        let heap = Heap::create(&config).unwrap();
        let map = HashMap::<u64, Vec<u8>>::open(&heap, "map").unwrap();
        std::thread::scope(|scope| {
            for first in 0..2 {
                let map = &map;
                scope.spawn(move || {
                    montage_testkit::lowest_priority();
                    for key in (first..KEYS).step_by(2) {
                        map.put(key, value(key)).unwrap();
                    }
                });
            }
        });
        heap.sync().unwrap();
        drop(map);
        check(&heap);
        heap.close().unwrap();
        check(&Heap::open(&config).unwrap());
    });
}

#[test]
fn entries_written_and_removed_in_one_epoch_reuse_their_blocks() {
    common::check_churn_in_one_epoch(common::open_hash_map);
}
