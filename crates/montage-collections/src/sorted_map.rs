//! [`SortedMap`]: a buffered durably linearizable ordered map with range scans.
//!
//! Entries are payloads laid out as the hash map's (key length, key, value); the DRAM
//! index is a concurrent skip list (crossbeam-skiplist) from each key to a slot: the
//! payload's current block, or none for a key removed recently, and the epoch of the last
//! operation that changed the key. Lookups and scans walk the skip list without locks;
//! each key's slot has its own lock.
//!
//! # Linearization points
//!
//! `insert`, `remove` and `update` run in one operation, and `get`, `contains_key` and the
//! scans in none (they read as `HashMap`'s do: `docs/design.md`, "Reads outside
//! operations"); each holds the key's slot lock while it reads or writes its payload and
//! linearizes at that access (at the slot or skip-list lookup for an absent key). An
//! operation of an older epoch than the slot's stamp aborts and is retried, so each key's
//! lock order agrees with epoch order.
//! A removed key keeps its slot, stamped, until the clock is two epochs past the removal
//! (no operation of an older epoch can run then); until that point the stamp makes an
//! older operation that finds the key absent abort.
//!
//! Scans ([`range`](SortedMap::range), [`iter`](SortedMap::iter), and both ends) read each
//! key as `get` does, under its slot lock, in key order (either direction): every entry they
//! return was the key's value at some point during the scan, but the scan as a whole is
//! not a snapshot while others write.
//!
//! Every read of an entry's payload holds the key's slot lock, and a removal takes the block
//! out of the slot under it, so a removal of an entry written in the same epoch hands the
//! block out again as soon as its operation ends ([`OpGuard::delete_viewed_unshared`]).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Mutex;

use crossbeam_skiplist::SkipMap;
use montage_core::stamped::StampedGuard;
use montage_core::{Attached, Codec, Epoch, Heap, OpGuard, PBlock, Result, StampedLock};
// The error variants the docs name.
#[cfg(doc)]
use montage_core::Error;

use crate::count::Count;
use crate::entry;
use crate::structure::lock;

/// One key's state in the index.
#[derive(Debug)]
struct Slot {
    /// The payload's current block; `None` after a removal (until the slot is purged).
    block: Option<PBlock>,
}

type Index<K> = SkipMap<K, StampedLock<Slot>>;

/// A concurrent ordered map whose entries survive crashes (module docs).
pub struct SortedMap<K, V> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    index: Index<K>,
    len: Count,
    /// Removed keys, with the stamp of their removal, in removal order.
    removed: Mutex<VecDeque<(K, Epoch)>>,
    _value: PhantomData<fn() -> V>,
}

impl<K, V> std::fmt::Debug for SortedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SortedMap")
            .field("owner", &self.attached.owner())
            .field("len", &self.len.get())
            .finish_non_exhaustive()
    }
}

impl<K, V> SortedMap<K, V>
where
    K: Codec + Ord + Clone,
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
    pub fn open(heap: &Heap, name: &str) -> Result<SortedMap<K, V>> {
        let type_id = entry::type_id::<K, V>("sorted-map")?;
        let attached = heap.attach(name)?;
        let existed = attached.existed();
        let map = SortedMap {
            attached,
            type_id,
            index: SkipMap::new(),
            len: Count::default(),
            removed: Mutex::new(VecDeque::new()),
            _value: PhantomData,
        };
        if existed {
            map.rebuild()?;
        }
        Ok(map)
    }

    fn rebuild(&self) -> Result<()> {
        entry::rebuild_index::<K, V>(
            self.attached.heap(),
            self.attached.owner(),
            self.type_id,
            "montage_collections::SortedMap entry",
            "two live entries of a sorted map have the same key",
            |key, _, block| {
                let slot = self
                    .index
                    .get_or_insert_with(key, || StampedLock::new(Slot { block: Some(block) }));
                let new = slot.value().lock_outside_op().block == Some(block);
                if new {
                    self.len.increment();
                }
                Ok(new)
            },
        )
    }

    /// Runs `f` on `key`'s slot, locked and checked against `op`'s epoch, creating the slot
    /// if `create` and it is missing; `f` gets `None` for a missing slot.
    fn with_slot<R>(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        create: bool,
        mut f: impl FnMut(Option<&mut StampedGuard<'_, Slot>>) -> Result<R>,
    ) -> Result<R> {
        loop {
            let found = if create {
                Some(
                    self.index
                        .get_or_insert_with(key.clone(), || StampedLock::new(Slot { block: None })),
                )
            } else {
                self.index.get(key)
            };
            let Some(found) = found else {
                return f(None);
            };
            let mut slot = found.value().lock(op)?;
            if found.is_removed() {
                // Purged between the lookup and the lock: look again.
                continue;
            }
            return f(Some(&mut slot));
        }
    }

    /// The value of `key`.
    ///
    /// # Errors
    ///
    /// A heap error ([`Error::Corrupted`] for an entry that does not decode, ...).
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        // No operation: the slot lock keeps the block live and its bytes still while it is
        // read (module docs).
        self.with_slot_outside_op(key, |block| match block {
            Some(block) => entry::read_locked_value(self.attached.heap(), block).map(Some),
            None => Ok(None),
        })
    }

    /// Whether the map holds `key`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn contains_key(&self, key: &K) -> Result<bool> {
        self.with_slot_outside_op(key, |block| Ok(block.is_some()))
    }

    /// Runs `f` on the block `key`'s slot holds (`None` for a missing slot or a removed
    /// key), with the slot locked outside any operation: for reads, which need no epoch
    /// (`docs/design.md`, "Reads outside operations").
    fn with_slot_outside_op<R>(
        &self,
        key: &K,
        f: impl FnOnce(Option<PBlock>) -> Result<R>,
    ) -> Result<R> {
        loop {
            let Some(found) = self.index.get(key) else {
                return f(None);
            };
            let slot = found.value().lock_outside_op();
            if found.is_removed() {
                // Purged between the lookup and the lock: look again.
                continue;
            }
            return f(slot.block);
        }
    }

    /// Sets `key` to `value`; returns the value it replaced.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); as [`get`](Self::get).
    // By value, as `std`'s; the key is cloned into the index because an aborted attempt
    // must be able to run again.
    #[allow(clippy::needless_pass_by_value)]
    pub fn insert(&self, key: K, value: V) -> Result<Option<V>> {
        let bytes = entry::encode(&key, &value)?;
        let result = self
            .attached
            .heap()
            .run_op(|op| self.insert_in(op, &key, &bytes));
        if result.is_err() {
            // A slot created for a failed insert holds nothing; let the purge drop it.
            lock(&self.removed).push_back((key, Epoch::ZERO));
        }
        result
    }

    fn insert_in(&self, op: &OpGuard<'_>, key: &K, bytes: &[u8]) -> Result<Option<V>> {
        self.with_slot(op, key, true, |slot| {
            let Some(slot) = slot else {
                unreachable!("with_slot creates the slot")
            };
            let old = if let Some(block) = slot.block {
                let old = entry::read_value(op, block)?;
                slot.block = Some(op.update(block, bytes)?);
                Some(old)
            } else {
                slot.block = Some(op.alloc(self.attached.owner(), self.type_id, bytes)?);
                self.len.increment();
                None
            };
            Ok(old)
        })
    }

    /// Removes `key`; returns its value.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn remove(&self, key: &K) -> Result<Option<V>> {
        let removed = self.attached.heap().run_op(|op| self.remove_in(op, key))?;
        if let Some((_, stamp)) = removed {
            lock(&self.removed).push_back((key.clone(), stamp));
        }
        self.purge();
        Ok(removed.map(|(value, _)| value))
    }

    /// Removes `key`, returning its value and the epoch of the removal.
    fn remove_in(&self, op: &OpGuard<'_>, key: &K) -> Result<Option<(V, Epoch)>> {
        self.with_slot(op, key, false, |slot| {
            let Some(slot) = slot else { return Ok(None) };
            let Some(block) = slot.block else {
                return Ok(None);
            };
            let view = op.view(block)?;
            let old = entry::view_value(&view)?;
            // Every reader of the block holds the slot lock, which this removal holds.
            op.delete_viewed_unshared(&view)?;
            slot.block = None;
            self.len.decrement();
            Ok(Some((old, op.epoch())))
        })
    }

    /// Drops the slots of keys removed at least two epochs ago and not written since.
    ///
    /// Called after every removal: the due keys are taken under one acquisition of the
    /// removal list; if another thread holds it, this one skips (a later removal purges).
    fn purge(&self) {
        let now = self.attached.heap().epoch();
        let due: Vec<(K, Epoch)> = match self.removed.try_lock() {
            Ok(mut removed) => {
                let count = removed
                    .iter()
                    .take_while(|(_, stamp)| stamp.plus(2) <= now)
                    .count();
                removed.drain(..count).collect()
            }
            Err(_) => return,
        };
        for (key, stamp) in due {
            if let Some(found) = self.index.get(&key) {
                let slot = found.value().lock_outside_op();
                if slot.block.is_none() && slot.stamp() == stamp {
                    // Under the slot lock: whoever locks it next sees `is_removed`.
                    found.remove();
                }
            }
        }
    }

    /// Replaces the value of `key` with `f(&value)` atomically; returns the new value, or
    /// `None` (calling nothing) if the key is absent. `f` may run more than once.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn update(&self, key: &K, mut f: impl FnMut(&V) -> V) -> Result<Option<V>>
    where
        V: Clone,
    {
        self.attached.heap().run_op(|op| {
            self.with_slot(op, key, false, |slot| {
                let Some(slot) = slot else { return Ok(None) };
                let Some(block) = slot.block else {
                    return Ok(None);
                };
                let new = f(&entry::read_value(op, block)?);
                slot.block = Some(op.update(block, &entry::encode(key, &new)?)?);
                Ok(Some(new))
            })
        })
    }

    /// The entries this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged):
    /// their blocks, left out of it and never returned as data. Empty for an undamaged heap.
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    /// The number of entries (exact when no other thread is writing).
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Whether the map has no entries (as [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries whose keys lie in `range`, in key order; `.rev()` walks it backwards.
    /// Each entry is read in its own operation (module docs); an error is yielded once and
    /// ends the scan.
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> Range<'_, K, V, R> {
        Range {
            map: self,
            inner: self.index.range(range),
            failed: false,
        }
    }

    /// Every entry, in key order (as [`range`](Self::range) over everything).
    pub fn iter(&self) -> Range<'_, K, V, std::ops::RangeFull> {
        self.range(..)
    }

    /// The entry with the smallest key.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn first_key_value(&self) -> Result<Option<(K, V)>> {
        self.iter().next().transpose()
    }

    /// The entry with the largest key.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn last_key_value(&self) -> Result<Option<(K, V)>> {
        self.iter().next_back().transpose()
    }

    /// Reads the entry of an index slot, with the slot locked outside any operation (as
    /// [`get`](Self::get)); `None` for a removed key (a purged slot holds none either).
    fn read_slot(&self, key: &K, slot: &StampedLock<Slot>) -> Result<Option<(K, V)>> {
        match slot.lock_outside_op().block {
            Some(block) => {
                let value = entry::read_locked_value(self.attached.heap(), block)?;
                Ok(Some((key.clone(), value)))
            }
            None => Ok(None),
        }
    }

    /// The heap the map lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}

impl<'m, K, V> IntoIterator for &'m SortedMap<K, V>
where
    K: Codec + Ord + Clone,
    V: Codec,
{
    type Item = Result<(K, V)>;
    type IntoIter = Range<'m, K, V, std::ops::RangeFull>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The iterator of [`SortedMap::range`] and [`SortedMap::iter`].
pub struct Range<'m, K: Ord, V, R: RangeBounds<K>> {
    map: &'m SortedMap<K, V>,
    inner: crossbeam_skiplist::map::Range<'m, K, R, K, StampedLock<Slot>>,
    failed: bool,
}

impl<K: Ord, V, R: RangeBounds<K>> std::fmt::Debug for Range<'_, K, V, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range").finish_non_exhaustive()
    }
}

impl<K, V, R> Range<'_, K, V, R>
where
    K: Codec + Ord + Clone,
    V: Codec,
    R: RangeBounds<K>,
{
    /// Reads index entries from the front (or the back) until one holds a live entry.
    fn advance(&mut self, back: bool) -> Option<Result<(K, V)>> {
        if self.failed {
            return None;
        }
        loop {
            let found = if back {
                self.inner.next_back()?
            } else {
                self.inner.next()?
            };
            match self.map.read_slot(found.key(), found.value()) {
                Ok(Some(entry)) => return Some(Ok(entry)),
                Ok(None) => {}
                Err(err) => {
                    self.failed = true;
                    return Some(Err(err));
                }
            }
        }
    }
}

impl<K, V, R> Iterator for Range<'_, K, V, R>
where
    K: Codec + Ord + Clone,
    V: Codec,
    R: RangeBounds<K>,
{
    type Item = Result<(K, V)>;

    fn next(&mut self) -> Option<Result<(K, V)>> {
        self.advance(false)
    }
}

impl<K, V, R> DoubleEndedIterator for Range<'_, K, V, R>
where
    K: Codec + Ord + Clone,
    V: Codec,
    R: RangeBounds<K>,
{
    fn next_back(&mut self) -> Option<Result<(K, V)>> {
        self.advance(true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use montage_core::sim::SimMode;
    use montage_core::{Error, HeapConfig};

    /// An operation of epoch `e` that finds a key absent because an operation of `e + 1`
    /// removed it must abort (module docs), and the removed key's slot is purged once the
    /// clock is two epochs past the removal.
    #[test]
    fn an_older_operation_that_meets_a_newer_removal_aborts() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let map: SortedMap<u64, u64> = SortedMap::open(&heap, "m").unwrap();
        map.insert(1, 10).unwrap();
        crate::structure::with_older_operation(
            &heap,
            || assert_eq!(map.remove(&1).unwrap(), Some(10)),
            |old| {
                let bytes = entry::encode(&1u64, &11u64).unwrap();
                assert!(matches!(
                    map.insert_in(old, &1, &bytes),
                    Err(Error::Aborted)
                ));
                // A read runs in no operation and has no epoch: it sees the removal.
                assert_eq!(map.get(&1).unwrap(), None);
            },
        );
        assert!(
            map.index.get(&1).is_some(),
            "the stamped slot stays for now"
        );
        heap.advance_epoch().unwrap();
        heap.advance_epoch().unwrap();
        map.purge();
        assert!(
            map.index.get(&1).is_none(),
            "purged two epochs after the removal"
        );
        assert_eq!(map.get(&1).unwrap(), None);
    }
}
