//! [`HashMap`]: a buffered durably linearizable hash map with lock-striped buckets.
//!
//! Every entry is one payload in the heap holding its key and value (the key's length, the
//! key, the value); the DRAM index maps each key to its payload's current block. The index
//! is split into stripes, each a hash table (which grows as it fills) under its own lock,
//! chosen by the key's hash. The map keeps no shared counter: [`len`](HashMap::len) adds up
//! the stripes' own counts.
//!
//! # Linearization points
//!
//! Every method holds the key's stripe lock while it reads or writes the key's payload; it
//! linearizes at that payload access (for a key that is absent, at the stripe lookup).
//! Operations on one key are therefore totally ordered by the stripe lock.
//!
//! Every method that changes the map runs in one operation, and each stripe is a
//! `StampedLock`, which remembers the epoch of the last operation that changed it: an
//! operation of an older epoch that meets it aborts and is retried in a new operation, so the
//! lock order on
//! every key agrees with epoch order, and recovery to any epoch boundary gives the state
//! after a prefix of that order.
//!
//! [`get`](HashMap::get) and [`contains_key`](HashMap::contains_key) run in no operation:
//! a read changes nothing recovery could keep or lose, so it needs no epoch. Under the
//! stripe lock the block the index names is live (it leaves the index, under the same lock,
//! before it is retired, and is reclaimed two epochs later) and its bytes are still (every
//! write to it holds the lock). A read may return a value written in an epoch newer than
//! the clock the reader last saw; a `sync` the reader calls afterwards reads a clock at
//! least that new, so it covers the write before the reader acknowledges what it read.
//!
//! [`iter`](HashMap::iter) and [`len`](HashMap::len) are not linearizable as a whole while
//! other threads write: `iter` visits the stripes one at a time, each in one operation.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use montage_core::payload::EncodeAs;
use montage_core::{Attached, Codec, Heap, OpGuard, PBlock, Result, StampedLock};
// The error variants the docs name.
#[cfg(doc)]
use montage_core::Error;

use crate::entry;
use crate::structure;

/// What [`HashMap::compute`] does with the entry it looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<V> {
    /// Leave the entry as it is (present or absent).
    Keep,
    /// Set the entry to this value, inserting it if absent.
    Set(V),
    /// Remove the entry (nothing happens if it is absent).
    Remove,
}

/// Stripes in a new map's index (a power of two).
const STRIPES: usize = 1024;

/// One stripe of the index: the keys whose hash picks it, each with its payload's block.
/// The table takes the hash the map computed to pick the stripe, so an operation hashes its
/// key once.
#[derive(Debug)]
struct Stripe<K> {
    blocks: HashTable<(K, PBlock)>,
}

impl<K: Eq> Stripe<K> {
    /// The block of `key` (whose hash is `hash`).
    fn get<Q>(&self, hash: u64, key: &Q) -> Option<PBlock>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.blocks
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|&(_, block)| block)
    }

    /// The slot holding the block of `key`.
    fn get_mut<Q>(&mut self, hash: u64, key: &Q) -> Option<&mut PBlock>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.blocks
            .find_mut(hash, |(k, _)| k.borrow() == key)
            .map(|(_, block)| block)
    }

    /// Adds `key`, which the stripe does not hold; `hasher` rehashes keys when the table grows.
    fn insert_new(&mut self, hash: u64, key: K, block: PBlock, hasher: &RandomState)
    where
        K: Hash,
    {
        self.blocks
            .insert_unique(hash, (key, block), |(k, _)| hasher.hash_one(k));
    }

    /// Points `key`, which the stripe holds, at its updated block (no clone of the key, as
    /// an insert would need).
    fn set<Q>(&mut self, hash: u64, key: &Q, block: PBlock)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        if let Some(slot) = self.get_mut(hash, key) {
            *slot = block;
        }
    }

    /// Removes `key`; returns its block.
    fn remove<Q>(&mut self, hash: u64, key: &Q) -> Option<PBlock>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let entry = self
            .blocks
            .find_entry(hash, |(k, _)| k.borrow() == key)
            .ok()?;
        Some(entry.remove().0.1)
    }
}

/// A concurrent hash map whose entries survive crashes (module docs).
///
/// Keys are hashed and compared in DRAM (`K: Hash + Eq + Clone`) and stored, like values,
/// through [`Codec`]: byte strings (`Vec<u8>`, `String`), integers, or
/// `#[derive(Payload)]` types.
pub struct HashMap<K, V> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    hasher: RandomState,
    stripes: Box<[CachePadded<StampedLock<Stripe<K>>>]>,
    _value: PhantomData<fn() -> V>,
}

impl<K, V> std::fmt::Debug for HashMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashMap")
            .field("owner", &self.attached.owner())
            .field("stripes", &self.stripes.len())
            .finish_non_exhaustive()
    }
}

impl<K, V> HashMap<K, V>
where
    K: Codec + Hash + Eq + Clone,
    V: Codec,
{
    /// Opens the map named `name` in `heap`, creating it if the heap has no structure of that
    /// name, and rebuilding its index from its payloads (scanned in parallel) if it has.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the map was written with other key or value types;
    /// [`Error::Corrupted`] if an entry does not decode or a key appears twice;
    /// [`Error::DirectoryFull`] or [`Error::BadName`] when creating it.
    pub fn open(heap: &Heap, name: &str) -> Result<HashMap<K, V>> {
        Self::open_with(heap, name, |_, _| {})
    }

    /// Opens the map as [`open`](Self::open) does, and calls `visit` with every entry the
    /// rebuild finds, on the scan's threads and in no particular order. A structure built on
    /// the map can derive its own state (counters, maxima, markers) from the scan that reads
    /// the entries anyway, instead of reading them all again.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_with(
        heap: &Heap,
        name: &str,
        visit: impl Fn(&K, &V) + Sync,
    ) -> Result<HashMap<K, V>> {
        let type_id = entry::type_id::<K, V>("hash-map")?;
        let attached = heap.attach(name)?;
        let existed = attached.existed();
        let map = HashMap {
            attached,
            type_id,
            hasher: RandomState::new(),
            stripes: (0..STRIPES)
                .map(|_| {
                    CachePadded::new(StampedLock::new(Stripe {
                        blocks: HashTable::new(),
                    }))
                })
                .collect(),
            _value: PhantomData,
        };
        if existed {
            map.rebuild(&visit)?;
        }
        Ok(map)
    }

    /// Fills the index from the payloads recovery kept, showing each entry to `visit`.
    fn rebuild(&self, visit: &(impl Fn(&K, &V) + Sync)) -> Result<()> {
        entry::rebuild_index::<K, V>(
            self.attached.heap(),
            self.attached.owner(),
            self.type_id,
            "montage_collections::HashMap entry",
            "two live entries of a hash map have the same key",
            |key, value, block| {
                visit(&key, &value);
                let (hash, stripe) = self.stripe(&key);
                let mut stripe = stripe.lock_outside_op();
                if stripe.get(hash, &key).is_some() {
                    return Ok(false);
                }
                stripe.insert_new(hash, key, block, &self.hasher);
                Ok(true)
            },
        )
    }

    /// The hash of `key` and the stripe it picks.
    fn stripe<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &StampedLock<Stripe<K>>) {
        let hash = self.hasher.hash_one(key);
        // Bits 32 and up pick the stripe; the stripe's table uses the lowest bits for its
        // buckets and the top seven as tags, so the choices do not correlate below 1024
        // stripes.
        let stripe = &self.stripes[(hash >> 32) as usize & (self.stripes.len() - 1)];
        (hash, stripe)
    }

    /// The value of `key`. As with `std`'s map, the key may be any borrowed form of `K`
    /// (a `&[u8]` for `Vec<u8>` keys, a `&str` for `String` keys).
    ///
    /// # Errors
    ///
    /// A heap error ([`Error::Corrupted`] for an entry that does not decode, [`Error::Poisoned`]...).
    pub fn get<Q>(&self, key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // No operation: the stripe lock keeps the block live and its bytes still while it is
        // read (module docs).
        let (hash, stripe) = self.stripe(key);
        let stripe = stripe.lock_outside_op();
        match stripe.get(hash, key) {
            Some(block) => entry::view_value(&self.attached.heap().view(block)?).map(Some),
            None => Ok(None),
        }
    }

    /// Whether the map holds `key`.
    ///
    /// # Errors
    ///
    /// None today; the signature leaves room for a heap error, as [`get`](Self::get)'s.
    pub fn contains_key<Q>(&self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, stripe) = self.stripe(key);
        Ok(stripe.lock_outside_op().get(hash, key).is_some())
    }

    /// Sets `key` to `value`; returns the value it replaced.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); as [`get`](Self::get).
    // By value, as `std`'s: the map keeps the value (encoded) and the key (cloned into the
    // index, since an aborted attempt must be able to run again).
    #[allow(clippy::needless_pass_by_value)]
    pub fn insert(&self, key: K, value: V) -> Result<Option<V>> {
        entry::with_encoded::<K, V, V, _>(&key, &value, |bytes| {
            self.attached.heap().run_op(|op| {
                let mut old = None;
                self.put_in(op, &key, bytes, Some(&mut old))?;
                Ok(old)
            })
        })
    }

    /// Sets `key` to `value` as [`insert`](Self::insert) does, without reading the value it
    /// replaces; returns whether the key was present. The faster write when the old value is
    /// not wanted (a cache's `set`).
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `insert`
    pub fn put(&self, key: K, value: V) -> Result<bool> {
        self.put_ref(key, &value)
    }

    /// Sets `key` to a value given in any form that encodes as a `V` (see [`EncodeAs`]: a
    /// `&[u8]` for `Vec<u8>` values, a `&str` for `String` ones, or a `&V`), as
    /// [`put`](Self::put) does; returns whether the key was present. The map only copies a
    /// value into the heap, so a caller holding bytes need not build an owned `V` first.
    ///
    /// ```
    /// # use montage_core::{Heap, HeapConfig};
    /// # use montage_collections::HashMap;
    /// # let heap = Heap::create(&HeapConfig::in_memory(8 << 20))?;
    /// let map: HashMap<u64, Vec<u8>> = HashMap::open(&heap, "blobs")?;
    /// let received: &[u8] = b"straight from a socket buffer";
    /// map.put_ref(7, received)?;
    /// assert_eq!(map.get(&7)?.as_deref(), Some(received));
    /// # Ok::<(), montage_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `insert`
    pub fn put_ref<Q: EncodeAs<V> + ?Sized>(&self, key: K, value: &Q) -> Result<bool> {
        entry::with_encoded::<K, V, Q, _>(&key, value, |bytes| {
            self.attached
                .heap()
                .run_op(|op| self.put_in(op, &key, bytes, None))
        })
    }

    /// Writes the entry `bytes` for `key`; returns whether the key was present, and reads the
    /// value it replaces into `old` if asked to.
    fn put_in(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        bytes: &[u8],
        old: Option<&mut Option<V>>,
    ) -> Result<bool> {
        let (hash, stripe) = self.stripe(key);
        let mut stripe = stripe.lock(op)?;
        if let Some(block) = stripe.get(hash, key) {
            if let Some(old) = old {
                *old = Some(entry::read_value(op, block)?);
            }
            let block = op.update(block, bytes)?;
            stripe.set(hash, key, block);
            Ok(true)
        } else {
            let block = op.alloc(self.attached.owner(), self.type_id, bytes)?;
            stripe.insert_new(hash, key.clone(), block, &self.hasher);
            Ok(false)
        }
    }

    /// Removes `key` (any borrowed form of `K`, as in [`get`](Self::get)); returns its value.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn remove<Q>(&self, key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.attached.heap().run_op(|op| {
            let mut old = None;
            self.remove_in(op, key, Some(&mut old))?;
            Ok(old)
        })
    }

    /// Removes `key` as [`remove`](Self::remove) does, without reading its value; returns
    /// whether it was present.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn delete<Q>(&self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.attached
            .heap()
            .run_op(|op| self.remove_in(op, key, None))
    }

    /// Removes `key`'s entry; returns whether it was present, and reads its value into `old`
    /// if asked to.
    fn remove_in<Q>(&self, op: &OpGuard<'_>, key: &Q, old: Option<&mut Option<V>>) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, stripe) = self.stripe(key);
        let mut stripe = stripe.lock(op)?;
        let Some(block) = stripe.get(hash, key) else {
            return Ok(false);
        };
        if let Some(old) = old {
            *old = Some(entry::read_value(op, block)?);
        }
        op.delete(block)?;
        stripe.remove(hash, key);
        Ok(true)
    }

    /// Replaces the value of `key` with `f(&value)` atomically; returns the new value, or
    /// `None` (calling nothing) if the key is absent. `f` may run more than once (when the
    /// operation is retried) and must not touch the map.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn update(&self, key: &K, mut f: impl FnMut(&V) -> V) -> Result<Option<V>>
    where
        V: Clone,
    {
        self.compute(key, |current| match current {
            Some(value) => {
                let new = f(&value);
                (Change::Set(new.clone()), Some(new))
            }
            None => (Change::Keep, None),
        })
    }

    /// Looks at `key`'s value (or its absence) and changes the entry as `f` decides, in one
    /// atomic step; returns what `f` returned. Conditional writes are built on it: insert
    /// if absent, replace if present, remove if equal, and so on.
    ///
    /// `f` may run more than once (when the operation is retried, each time with a freshly
    /// read value) and must not touch the map; only the last run's decision takes effect.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert); after an error nothing changed.
    pub fn compute<R>(&self, key: &K, mut f: impl FnMut(Option<V>) -> (Change<V>, R)) -> Result<R> {
        self.attached
            .heap()
            .run_op(|op| self.compute_in(op, key, &mut f))
    }

    fn compute_in<R>(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        f: &mut impl FnMut(Option<V>) -> (Change<V>, R),
    ) -> Result<R> {
        let (hash, stripe) = self.stripe(key);
        let mut stripe = stripe.lock(op)?;
        let block = stripe.get(hash, key);
        let current = block.map(|b| entry::read_value(op, b)).transpose()?;
        let (change, result) = f(current);
        match (change, block) {
            (Change::Keep, _) | (Change::Remove, None) => return Ok(result),
            (Change::Set(new), Some(block)) => {
                let block = op.update(block, &entry::encode(key, &new)?)?;
                stripe.set(hash, key, block);
            }
            (Change::Set(new), None) => {
                let block = op.alloc(
                    self.attached.owner(),
                    self.type_id,
                    &entry::encode(key, &new)?,
                )?;
                stripe.insert_new(hash, key.clone(), block, &self.hasher);
            }
            (Change::Remove, Some(block)) => {
                op.delete(block)?;
                stripe.remove(hash, key);
            }
        }
        Ok(result)
    }

    /// Sets `key` to `new` if its value equals `current` (an absent key never does);
    /// otherwise returns the value found.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // the map keeps `new` (encoded)
    pub fn compare_and_set(&self, key: &K, current: &V, new: V) -> Result<Result<(), Option<V>>>
    where
        V: PartialEq,
    {
        let bytes = entry::encode(key, &new)?;
        let (hash, stripe) = self.stripe(key);
        self.attached.heap().run_op(|op| {
            let mut stripe = stripe.lock(op)?;
            let Some(block) = stripe.get(hash, key) else {
                return Ok(Err(None));
            };
            let found: V = entry::read_value(op, block)?;
            if found != *current {
                return Ok(Err(Some(found)));
            }
            let block = op.update(block, &bytes)?;
            stripe.set(hash, key, block);
            Ok(Ok(()))
        })
    }

    /// The entries this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged):
    /// their blocks, left out of it and never returned as data. Empty for an undamaged heap.
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    /// The number of entries (exact when no other thread is writing). It adds up the
    /// stripes' own counts, one stripe lock at a time: writes keep no shared counter, whose
    /// cache line would pass between the writing cores on every insert and remove.
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|stripe| stripe.lock_outside_op().blocks.len())
            .sum()
    }

    /// Whether the map has no entries (as [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.stripes
            .iter()
            .all(|stripe| stripe.lock_outside_op().blocks.is_empty())
    }

    /// An iterator over every entry. It reads one stripe at a time, each in one operation,
    /// so while others write it is not a snapshot of the whole map; an error ends it.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V)>> + '_ {
        structure::parts(self.stripes.len(), |index| self.stripe_entries(index))
    }

    /// The entries of stripe `index`, read in one operation.
    fn stripe_entries(&self, index: usize) -> Result<Vec<(K, V)>> {
        self.attached.heap().run_op(|op| {
            let stripe = self.stripes[index].lock(op)?;
            stripe
                .blocks
                .iter()
                .map(|&(ref key, block)| Ok((key.clone(), entry::read_value(op, block)?)))
                .collect()
        })
    }

    /// The heap the map lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use montage_core::sim::SimMode;
    use montage_core::{Error, HeapConfig};

    /// An operation of epoch `e` that finds a key absent because an operation of `e + 1`
    /// removed it must abort: otherwise recovery to the end of `e` could keep both its
    /// insert and the entry the removal (lost with `e + 1`) had removed.
    #[test]
    fn an_older_operation_that_meets_a_newer_removal_aborts() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
        map.insert(1, 10).unwrap();
        structure::with_older_operation(
            &heap,
            || assert_eq!(map.remove(&1).unwrap(), Some(10)),
            |old| {
                let bytes = entry::encode(&1u64, &11u64).unwrap();
                assert!(matches!(
                    map.put_in(old, &1, &bytes, None),
                    Err(Error::Aborted)
                ));
                assert!(matches!(map.remove_in(old, &1, None), Err(Error::Aborted)));
                let mut keep = |_: Option<u64>| (Change::Keep, ());
                assert!(matches!(
                    map.compute_in(old, &1, &mut keep),
                    Err(Error::Aborted)
                ));
            },
        );
        // A read (in no operation) sees the removal.
        assert_eq!(map.get(&1).unwrap(), None);
        assert!(!map.contains_key(&1).unwrap());
    }
}
