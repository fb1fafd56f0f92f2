//! The transient upper bounds: the same striped index as montage's `HashMap` with its values
//! in DRAM and no persistence at all, `DashMap`, locked `BTreeMap`s and a locked `VecDeque`.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use crossbeam_utils::CachePadded;

use super::{MapStore, QueueStore, Result};

/// As many stripes as `montage_collections::HashMap` has.
const STRIPES: usize = 1024;

/// `montage_collections::HashMap`'s index (lock stripes of std hash maps, chosen by the high
/// bits of one hash) holding the values themselves.
pub(crate) struct TransientMap {
    hasher: RandomState,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
}

type Stripe = std::collections::HashMap<u64, Vec<u8>>;

impl TransientMap {
    pub(crate) fn new() -> TransientMap {
        TransientMap {
            hasher: RandomState::new(),
            stripes: (0..STRIPES)
                .map(|_| CachePadded::new(Mutex::default()))
                .collect(),
        }
    }

    fn stripe(&self, key: u64) -> MutexGuard<'_, Stripe> {
        let hash = self.hasher.hash_one(key);
        let stripe = &self.stripes[(hash >> 32) as usize & (STRIPES - 1)];
        stripe.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl MapStore for TransientMap {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        // A copy out, as a persistent map's read must make.
        let value = self.stripe(key).get(&key).cloned();
        Ok(value.map(|v| std::hint::black_box(v).len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        let value = value.to_vec();
        self.stripe(key).insert(key, value);
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        let old = self.stripe(key).remove(&key);
        drop(old);
        Ok(())
    }

    fn sync(&self) -> Result {
        Ok(())
    }
}

/// `DashMap` with its default shard count.
#[derive(Default)]
pub(crate) struct Dash(dashmap::DashMap<u64, Vec<u8>>);

impl MapStore for Dash {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let value = self.0.get(&key).map(|v| v.value().clone());
        Ok(value.map(|v| std::hint::black_box(v).len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        self.0.insert(key, value.to_vec());
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        self.0.remove(&key);
        Ok(())
    }

    fn sync(&self) -> Result {
        Ok(())
    }
}

/// `BTreeMap`s in DRAM, each under a reader-writer lock, a key going to one by a hash: what
/// the logged `BTreeMap` contenders are measured against.
pub(crate) struct LockedTrees(Box<[CachePadded<LockedTree>]>);

/// One map of [`LockedTrees`].
type LockedTree = RwLock<BTreeMap<u64, Vec<u8>>>;

impl LockedTrees {
    pub(crate) fn new(shards: usize) -> LockedTrees {
        LockedTrees((0..shards).map(|_| CachePadded::default()).collect())
    }

    fn tree(&self, key: u64) -> &LockedTree {
        // Fibonacci hashing: the high half of key * 2^64 / phi, times the shard count.
        let hash = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let shard = (u128::from(hash) * self.0.len() as u128) >> 64;
        &self.0[shard as usize]
    }
}

impl MapStore for LockedTrees {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let tree = self
            .tree(key)
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let value = tree.get(&key).cloned();
        drop(tree);
        Ok(value.map(|v| std::hint::black_box(v).len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        let value = value.to_vec();
        let old = self
            .tree(key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, value);
        drop(old);
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        let old = self
            .tree(key)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        drop(old);
        Ok(())
    }

    fn sync(&self) -> Result {
        Ok(())
    }
}

/// A `VecDeque` under one lock.
#[derive(Default)]
pub(crate) struct TransientQueue(Mutex<VecDeque<Vec<u8>>>);

impl QueueStore for TransientQueue {
    fn push(&self, value: &[u8]) -> Result {
        let value = value.to_vec();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(value);
        Ok(())
    }

    fn pop(&self) -> Result<Option<usize>> {
        let value = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        Ok(value.map(|v| v.len()))
    }
}
