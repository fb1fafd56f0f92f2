//! Stress tests of the lock-free indexes (`VerifiedList`, `VerifiedQueue`) under a clock
//! that advances every few tens of microseconds, so that verified swaps fail, operations
//! abort and retry, removed nodes are purged and unlinked, and freed nodes are reused by
//! the allocator while other threads traverse: a use-after-free or a lost node shows up as
//! a wrong value.
//!
//! * List, and a table of buckets (`VerifiedBucket`: an inline entry the first key with a
//!   word claims, then a list): each thread writes only its own keys (so it knows their
//!   exact state and checks every result) and reads everyone's (a value read must be one
//!   its key's owner wrote), inside operations and outside them (`peek`).
//! * Queue: producers push their own increasing numbers, consumers pop; every number is
//!   popped exactly once, and each producer's numbers come out in order.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use montage_core::sim::SplitMix64;
use montage_core::verified::{BucketKey, Peek, VerifiedBucket, VerifiedList, VerifiedQueue};
use montage_core::{EpochLength, Error, Heap, HeapConfig};
use montage_core::{OpGuard, Result};
use montage_testkit::run_with_clock;

const THREADS: u64 = 3;

/// A heap with `slots` owned thread slots: with the default 64 every worker owns one;
/// with one, the workers (whose thread ids are not the lowest) announce their operations in
/// the shared slots, under their locks.
fn heap(slots: usize) -> Heap {
    let config = HeapConfig::in_memory(8 << 20)
        .epoch_length(EpochLength::Manual)
        .thread_slots(slots);
    Heap::create(&config).unwrap()
}

const OWNED: usize = 64;
const SHARED: usize = 1;

/// Runs `work(t)` on `THREADS` threads while another thread advances the clock.
fn with_moving_clock(heap: &Heap, work: impl Fn(u64) + Sync) {
    let tick = || {
        heap.advance_epoch().unwrap();
        std::thread::sleep(Duration::from_micros(30));
    };
    run_with_clock(THREADS as usize, tick, |t| work(t as u64));
}

/// A value names its key and a version: `key << 24 | version`.
fn value(key: u64, version: u64) -> u64 {
    (key << 24) | version
}

/// What the stress test drives: a list or a bucket, which have the same methods.
trait Index<K>: Sync {
    fn get(&self, op: &OpGuard<'_>, key: &K) -> Result<Option<u64>>;
    fn insert(&self, op: &OpGuard<'_>, key: &K, value: u64) -> Result<Outcome<(), u64>>;
    fn replace(&self, op: &OpGuard<'_>, key: &K, current: u64, new: u64) -> Result<Found>;
    fn remove(&self, op: &OpGuard<'_>, key: &K, current: u64) -> Result<Found>;
    fn entries(&self, op: &OpGuard<'_>) -> Result<Vec<(K, u64)>>;
    fn peek(&self, key: &K) -> Peek<u64>;
}

type Outcome<T, E> = std::result::Result<T, E>;
type Found = Outcome<(), Option<u64>>;

/// `Index` for a type whose own methods of those names it forwards to.
macro_rules! index {
    ($ty:ident, $($bound:tt)+) => {
        impl<K: $($bound)+> Index<K> for $ty<K> {
            fn get(&self, op: &OpGuard<'_>, key: &K) -> Result<Option<u64>> {
                $ty::get(self, op, key)
            }
            fn insert(&self, op: &OpGuard<'_>, key: &K, value: u64) -> Result<Outcome<(), u64>> {
                $ty::insert(self, op, key, value)
            }
            fn replace(&self, op: &OpGuard<'_>, key: &K, current: u64, new: u64) -> Result<Found> {
                $ty::replace(self, op, key, current, new)
            }
            fn remove(&self, op: &OpGuard<'_>, key: &K, current: u64) -> Result<Found> {
                $ty::remove(self, op, key, current)
            }
            fn entries(&self, op: &OpGuard<'_>) -> Result<Vec<(K, u64)>> {
                $ty::entries(self, op)
            }
            fn peek(&self, key: &K) -> Peek<u64> {
                $ty::peek(self, key)
            }
        }
    };
}
index!(VerifiedList, Ord + Clone + Send + Sync + 'static);
index!(VerifiedBucket, BucketKey);

/// The bucket of `key` among `buckets` (a fixed hash, the same on every thread).
fn bucket_of<K: std::hash::Hash>(key: &K, buckets: usize) -> usize {
    use std::hash::BuildHasher;
    let hasher =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    hasher.hash_one(key) as usize % buckets
}

/// `count` buckets, and how to find a key's.
fn buckets<K: BucketKey + std::hash::Hash>(
    count: usize,
) -> (Vec<VerifiedBucket<K>>, impl Fn(&K) -> usize + Sync) {
    let table = (0..count).map(|_| VerifiedBucket::new()).collect();
    (table, move |key: &K| bucket_of(key, count))
}

#[test]
fn list_operations_keep_every_key_exact_under_a_moving_clock() {
    list_stress(OWNED, &[VerifiedList::new()], |_| 0, |k| k);
}

#[test]
fn list_operations_in_shared_slots_keep_every_key_exact_under_a_moving_clock() {
    list_stress(SHARED, &[VerifiedList::new()], |_| 0, |k| k);
}

/// Buckets: twelve keys a bucket race for its inline entry, and the key whose word is the
/// empty marker (`u64::MAX - 0`) must live in the list.
#[test]
fn bucket_operations_keep_every_key_exact_under_a_moving_clock() {
    let (table, pick) = buckets(4);
    list_stress(OWNED, &table, pick, |k| u64::MAX - k);
}

/// Buckets of signed keys, most of them alone in theirs, so that claims race with reads of
/// absent keys in empty buckets.
#[test]
fn bucket_operations_on_many_buckets_keep_every_key_exact_under_a_moving_clock() {
    let (table, pick) = buckets(64);
    list_stress(OWNED, &table, pick, |k| k as i32 - 24);
}

/// As above with keys that own heap memory, so that under the address sanitizer a key read
/// after its node was freed is reported as a use-after-free, not only as a wrong result when
/// it happens to show.
#[test]
fn list_operations_keep_every_owned_key_exact_under_a_moving_clock() {
    list_stress(
        OWNED,
        &[VerifiedList::new()],
        |_| 0,
        |k| format!("key {k:>4}"),
    );
}

/// The stress test of the lists or buckets `indexes`, where `pick` finds a key's, with keys
/// `key_of(0..KEYS)`, distinct for distinct numbers, in a heap of `slots` owned slots.
fn list_stress<K>(
    slots: usize,
    indexes: &[impl Index<K>],
    pick: impl Fn(&K) -> usize + Sync,
    key_of: impl Fn(u64) -> K + Sync,
) where
    K: Ord + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    const KEYS: u64 = 48;
    const OPS: u64 = 100_000;
    let heap = heap(slots);
    with_moving_clock(&heap, |t| {
        let mut rng = SplitMix64::new(t + 1);
        // This thread's keys and their state.
        let mut mine: HashMap<u64, Option<u64>> = (0..KEYS)
            .filter(|k| k % THREADS == t)
            .map(|k| (k, None))
            .collect();
        let own: Vec<u64> = mine.keys().copied().collect();
        let mut decided = 0;
        for i in 1..=OPS {
            let key = own[(rng.next_u64() % own.len() as u64) as usize];
            let state = mine[&key];
            let k = key_of(key);
            let result = heap.run_op(|op| match rng.next_u64() % 4 {
                0 => indexes[pick(&k)].get(op, &k).map(|got| {
                    assert_eq!(got, state, "thread {t} key {key}");
                    state
                }),
                1 => match state {
                    None => {
                        assert_eq!(indexes[pick(&k)].insert(op, &k, value(key, i))?, Ok(()));
                        Ok(Some(value(key, i)))
                    }
                    Some(v) => {
                        assert_eq!(indexes[pick(&k)].insert(op, &k, 1)?, Err(v));
                        Ok(state)
                    }
                },
                2 => {
                    if let Some(v) = state {
                        assert_eq!(indexes[pick(&k)].replace(op, &k, v, value(key, i))?, Ok(()));
                        Ok(Some(value(key, i)))
                    } else {
                        assert_eq!(indexes[pick(&k)].replace(op, &k, 0, 1)?, Err(None));
                        Ok(None)
                    }
                }
                _ => match state {
                    Some(v) => {
                        assert_eq!(indexes[pick(&k)].remove(op, &k, v)?, Ok(()));
                        Ok(None)
                    }
                    None => Ok(None),
                },
            });
            let new_state = result.unwrap();
            mine.insert(key, new_state);
            // Outside any operation: this thread's key as it left it, unless the read
            // cannot tell.
            let peeked = indexes[pick(&k)].peek(&k);
            if peeked != Peek::Undecided {
                assert_eq!(
                    peeked,
                    Peek::from_option(new_state),
                    "thread {t} key {key}, read outside an operation"
                );
                decided += 1;
            }
            // Read someone else's key: whatever is there was written for that key.
            let other = rng.next_u64() % KEYS;
            let other_key = key_of(other);
            match heap.run_op(|op| indexes[pick(&other_key)].get(op, &other_key)) {
                Ok(Some(v)) => assert_eq!(v >> 24, other, "a value of another key"),
                Ok(None) => {}
                Err(err) => panic!("{err}"),
            }
            if let Peek::Found(v) = indexes[pick(&other_key)].peek(&other_key) {
                assert_eq!(
                    v >> 24,
                    other,
                    "a value of another key, read outside an operation"
                );
            }
        }
        // Reads outside operations cannot tell only while a swap is in progress or a dead
        // node is still linked: most of them answer.
        assert!(
            decided > OPS / 2,
            "thread {t}: {decided} of {OPS} reads answered"
        );
        // What this thread leaves behind.
        let entries = heap
            .run_op(|op| {
                let mut all = Vec::new();
                for index in indexes {
                    all.extend(index.entries(op)?);
                }
                Ok(all)
            })
            .unwrap();
        for (key, state) in &mine {
            let k = key_of(*key);
            let found = entries.iter().find(|(e, _)| *e == k).map(|&(_, v)| v);
            // Other threads never touch this thread's keys.
            assert_eq!(found, *state, "thread {t} key {key} at the end");
        }
    });
}

#[test]
fn queue_delivers_every_element_once_in_each_producers_order() {
    queue_stress(OWNED);
}

#[test]
fn queue_in_shared_slots_delivers_every_element_once_in_each_producers_order() {
    queue_stress(SHARED);
}

/// The queue's stress test in a heap of `slots` owned slots.
fn queue_stress(slots: usize) {
    const PER_PRODUCER: u64 = 100_000;
    let heap = heap(slots);
    let queue = VerifiedQueue::new(0);
    let popped: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let producers_done = AtomicBool::new(false);
    with_moving_clock(&heap, |t| {
        if t < 2 {
            for i in 0..PER_PRODUCER {
                heap.run_op(|op| queue.push(op, (t << 32) | i, |_| Ok(())))
                    .unwrap();
            }
            if t == 1 {
                producers_done.store(true, Ordering::SeqCst);
            }
        }
        // Every thread consumes; producers once they are done.
        let mut mine = Vec::new();
        loop {
            match heap.run_op(|op| queue.pop(op, |_, _| Ok(()))) {
                Ok(Some(v)) => mine.push(v),
                Ok(None) if producers_done.load(Ordering::SeqCst) => break,
                Ok(None) => std::thread::yield_now(),
                Err(Error::Aborted) => unreachable!("run_op retries aborts"),
                Err(err) => panic!("{err}"),
            }
        }
        // Within one consumer, each producer's numbers increase.
        for producer in 0..2u64 {
            let seq: Vec<u64> = mine
                .iter()
                .filter(|v| *v >> 32 == producer)
                .copied()
                .collect();
            assert!(
                seq.windows(2).all(|w| w[0] < w[1]),
                "producer {producer} out of order"
            );
        }
        popped.lock().unwrap().extend(mine);
    });
    // The last pops may have raced with the end flag: drain what is left.
    let mut all = popped.into_inner().unwrap();
    while let Some(v) = heap.run_op(|op| queue.pop(op, |_, _| Ok(()))).unwrap() {
        all.push(v);
    }
    all.sort_unstable();
    let want: Vec<u64> = (0..2u64)
        .flat_map(|t| (0..PER_PRODUCER).map(move |i| (t << 32) | i))
        .collect();
    assert_eq!(all.len(), want.len(), "elements lost or duplicated");
    assert_eq!(all, want);
}
