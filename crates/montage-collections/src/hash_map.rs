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
//! lock order on every key agrees with epoch order, and recovery to any epoch boundary gives
//! the state after a prefix of that order.
//!
//! [`get`](HashMap::get) and [`contains_key`](HashMap::contains_key) run in no operation:
//! a read changes nothing recovery could keep or lose, so it needs no epoch. Under the
//! stripe lock the block the index names is live (it leaves the index, under the same lock,
//! before it is retired, and is reclaimed two epochs later) and its bytes are still (every
//! write to it holds the lock). Because every reader of a block holds its stripe, a delete
//! of a block written in the same epoch hands it out again as soon as its operation ends
//! ([`OpGuard::delete_unshared`]), while it is still in the processor's cache. A read may
//! return a value written in an epoch newer than the clock the reader last saw; a `sync`
//! the reader calls afterwards reads a clock at least that new, so it covers the write
//! before the reader acknowledges what it read.
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
use montage_core::stamped::StampedGuard;
use montage_core::{Attached, BlockView, Codec, Heap, OpGuard, PBlock, Result, StampedLock};
// The error variants the docs name.
#[cfg(doc)]
use montage_core::Error;

use crate::entry;
use crate::structure;
#[cfg(doc)]
use crate::together;
use crate::together::{Staged, StagedId, Together};

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
    fn insert_new(&mut self, hash: u64, key: K, block: PBlock, hasher: &impl BuildHasher)
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

    /// Removes `key`; returns it as the stripe held it, with its block.
    fn remove<Q>(&mut self, hash: u64, key: &Q) -> Option<(K, PBlock)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let entry = self
            .blocks
            .find_entry(hash, |(k, _)| k.borrow() == key)
            .ok()?;
        Some(entry.remove().0)
    }

    /// Takes back a change `undo` describes (the entries are found by their blocks).
    fn undo(&mut self, undo: Undo<K>, hasher: &impl BuildHasher)
    where
        K: Hash,
    {
        match undo {
            Undo::Added { hash, block } => {
                if let Ok(entry) = self.blocks.find_entry(hash, |&(_, b)| b == block) {
                    entry.remove();
                }
            }
            Undo::Replaced { hash, old, new } => {
                if let Some((_, slot)) = self.blocks.find_mut(hash, |&(_, b)| b == new) {
                    *slot = old;
                }
            }
            Undo::Removed { hash, key, block } => self.insert_new(hash, key, block, hasher),
        }
    }
}

/// A change of one entry in a stripe, as a [`together()`] takes it back.
#[derive(Debug)]
enum Undo<K> {
    /// The key whose hash is `hash` was added with `block`: remove it.
    Added { hash: u64, block: PBlock },
    /// The key whose hash is `hash` moved from `old` to `new`: point it back.
    Replaced { hash: u64, old: PBlock, new: PBlock },
    /// `key` (whose hash is `hash`) was removed from `block`: put it back.
    Removed { hash: u64, key: K, block: PBlock },
}

/// What a write reads of the entry it replaces, before it writes.
enum Replaced<'a, V> {
    /// Nothing.
    Nothing,
    /// The value.
    Value(&'a mut Option<V>),
    /// The entry's length, in [`HashMap::entry_len`]'s measure.
    Len(&'a mut Option<u64>),
}

/// How an entry's payload is rewritten.
#[derive(Debug, Clone, Copy)]
enum Rewrite {
    /// In place when it may be (written in this epoch, and the bytes fit): a single
    /// operation, which cannot fail after the write.
    InPlace,
    /// Always as a new version: in a [`together()`], whose rollback cannot restore bytes
    /// written in place.
    Copy,
}

/// A concurrent hash map whose entries survive crashes (module docs).
///
/// Keys are hashed and compared in DRAM (`K: Hash + Eq + Clone`) and stored, like values,
/// through [`Codec`]: byte strings (`Vec<u8>`, `String`), integers, or
/// `#[derive(Payload)]` types.
///
/// `S` hashes the keys for the index, as `std`'s map's `S` does: `std`'s `RandomState`
/// (`SipHash`, seeded at random) by default, or a faster hasher through
/// [`open_with_hasher`](Self::open_with_hasher) where keys do not come from an adversary
/// who could make them collide. Only the index in DRAM depends on it, so a map may be
/// reopened with another hasher.
pub struct HashMap<K, V, S = RandomState> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    hasher: S,
    stripes: Box<[CachePadded<StampedLock<Stripe<K>>>]>,
    _value: PhantomData<fn() -> V>,
}

impl<K, V, S> std::fmt::Debug for HashMap<K, V, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashMap")
            .field("owner", &self.attached.owner())
            .field("stripes", &self.stripes.len())
            .finish_non_exhaustive()
    }
}

impl<K, V> HashMap<K, V> {
    /// The payload length of an entry whose key and value encode to `key_bytes` and
    /// `value_bytes` bytes: with [`block_size`](montage_core::limits::block_size), the room
    /// the entry takes in the heap (a cache that evicts to make room for an entry frees
    /// entries of the same block size).
    #[must_use]
    pub fn entry_len(key_bytes: usize, value_bytes: usize) -> u64 {
        entry::len(key_bytes, value_bytes)
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
        HashMap::open_with_hasher(heap, name, RandomState::new(), visit)
    }
}

impl<K, V, S> HashMap<K, V, S>
where
    K: Codec + Hash + Eq + Clone,
    V: Codec,
    S: BuildHasher,
{
    /// Opens the map as [`open_with`](HashMap::open_with) does, with `hasher` hashing its
    /// keys for the index.
    ///
    /// ```
    /// use montage_collections::HashMap;
    /// use montage_core::{Heap, HeapConfig};
    ///
    /// let heap = Heap::create(&HeapConfig::in_memory(4 << 20))?;
    /// // Any `BuildHasher`: here `std`'s hasher with fixed keys, the same in every run.
    /// type Fixed = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;
    /// let map: HashMap<u64, u64, Fixed> =
    ///     HashMap::open_with_hasher(&heap, "m", Fixed::default(), |_, _| {})?;
    /// map.insert(1, 2)?;
    /// assert_eq!(map.get(&1)?, Some(2));
    /// # Ok::<(), montage_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](HashMap::open).
    pub fn open_with_hasher(
        heap: &Heap,
        name: &str,
        hasher: S,
        visit: impl Fn(&K, &V) + Sync,
    ) -> Result<HashMap<K, V, S>>
    where
        S: Sync,
    {
        let type_id = entry::type_id::<K, V>("hash-map")?;
        let attached = heap.attach(name)?;
        let existed = attached.existed();
        let map = HashMap {
            attached,
            type_id,
            hasher,
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
    fn rebuild(&self, visit: &(impl Fn(&K, &V) + Sync)) -> Result<()>
    where
        S: Sync,
    {
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
        (hash, &self.stripes[self.stripe_index(hash)])
    }

    /// The stripe a key whose hash is `hash` is in.
    fn stripe_index(&self, hash: u64) -> usize {
        // Bits 32 and up pick the stripe; the stripe's table uses the lowest bits for its
        // buckets and the top seven as tags, so the choices do not correlate below 1024
        // stripes.
        (hash >> 32) as usize & (self.stripes.len() - 1)
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
            Some(block) => entry::read_locked_value(self.attached.heap(), block).map(Some),
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
                self.put_in(op, &key, bytes, Replaced::Value(&mut old))?;
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
                .run_op(|op| self.put_in(op, &key, bytes, Replaced::Nothing))
        })
    }

    /// Sets `key` to a value given in any form that encodes as a `V`, as
    /// [`put_ref`](Self::put_ref) does; returns the length of the entry it replaced (in
    /// [`entry_len`](Self::entry_len)'s measure), or `None` if the key was absent. For a
    /// caller that accounts for its entries' sizes (a cache's byte count) without reading the
    /// value it replaces: the length is in the old block's header, which the write reads
    /// anyway.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `insert`
    pub fn put_ref_len<Q: EncodeAs<V> + ?Sized>(&self, key: K, value: &Q) -> Result<Option<u64>> {
        entry::with_encoded::<K, V, Q, _>(&key, value, |bytes| {
            self.attached.heap().run_op(|op| {
                let mut len = None;
                self.put_in(op, &key, bytes, Replaced::Len(&mut len))?;
                Ok(len)
            })
        })
    }

    /// Writes the entry `bytes` for `key`; returns whether the key was present, and reads
    /// what `old` asks for of the entry it replaces.
    fn put_in(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        bytes: &[u8],
        old: Replaced<'_, V>,
    ) -> Result<bool> {
        let (hash, stripe) = self.stripe(key);
        let mut stripe = stripe.lock(op)?;
        let (present, _) =
            self.put_locked(op, &mut stripe, hash, key, bytes, old, Rewrite::InPlace)?;
        Ok(present)
    }

    /// [`put_in`](Self::put_in)'s step with `key`'s stripe locked (`stripe`); also returns
    /// how to take the change back.
    #[allow(clippy::too_many_arguments)] // the parts of one step, each used once
    fn put_locked(
        &self,
        op: &OpGuard<'_>,
        stripe: &mut StampedGuard<'_, Stripe<K>>,
        hash: u64,
        key: &K,
        bytes: &[u8],
        old: Replaced<'_, V>,
        rewrite: Rewrite,
    ) -> Result<(bool, Undo<K>)> {
        let found = stripe.get(hash, key);
        let mut replaced_len = None;
        if let Some(found) = found {
            match old {
                Replaced::Nothing => {}
                Replaced::Value(value) if matches!(rewrite, Rewrite::InPlace) => {
                    // The header the view read is the one the update needs: no second read.
                    let view = op.view(found)?;
                    *value = Some(entry::view_value(&view)?);
                    let (undo, _) = self.write_found(
                        op,
                        stripe,
                        hash,
                        key,
                        Some(found),
                        Some(&view),
                        bytes,
                        rewrite,
                    )?;
                    return Ok((true, undo));
                }
                Replaced::Value(value) => *value = Some(entry::read_value(op, found)?),
                // In the old block's header, which the write reads and reports.
                Replaced::Len(len) => replaced_len = Some(len),
            }
        }
        let (undo, replaced) =
            self.write_found(op, stripe, hash, key, found, None, bytes, rewrite)?;
        if let Some(len) = replaced_len {
            *len = replaced.map(u64::from);
        }
        Ok((found.is_some(), undo))
    }

    /// With `key`'s stripe locked (`stripe`), writes the entry `bytes` for `key`, whose block
    /// is `found` (`None` if absent), viewed in this operation as `viewed` if the caller read
    /// it (an update in place then takes the view's header); returns how to take the change
    /// back, and the length of the entry it replaced (read from the old block's header, which
    /// the update reads anyway), `None` if the key was absent.
    #[allow(clippy::too_many_arguments)] // the parts of one step, each used once
    fn write_found(
        &self,
        op: &OpGuard<'_>,
        stripe: &mut StampedGuard<'_, Stripe<K>>,
        hash: u64,
        key: &K,
        found: Option<PBlock>,
        viewed: Option<&BlockView<'_>>,
        bytes: &[u8],
        rewrite: Rewrite,
    ) -> Result<(Undo<K>, Option<u32>)> {
        let Some(old) = found else {
            let block = op.alloc(self.attached.owner(), self.type_id, bytes)?;
            stripe.insert_new(hash, key.clone(), block, &self.hasher);
            return Ok((Undo::Added { hash, block }, None));
        };
        let (new, replaced) = match rewrite {
            Rewrite::InPlace => match viewed {
                Some(view) => (op.update_viewed(view, bytes)?, *view.info()),
                None => op.update_replacing(old, bytes)?,
            },
            Rewrite::Copy => op.copy_update_replacing(old, bytes)?,
        };
        stripe.set(hash, key, new);
        Ok((Undo::Replaced { hash, old, new }, Some(replaced.len)))
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
        Ok(Self::remove_locked(op, &mut stripe, hash, key, old)?.is_some())
    }

    /// [`remove_in`](Self::remove_in)'s step with `key`'s stripe locked (`stripe`); returns
    /// how to take the change back, or `None` if `key` was absent.
    fn remove_locked<Q>(
        op: &OpGuard<'_>,
        stripe: &mut StampedGuard<'_, Stripe<K>>,
        hash: u64,
        key: &Q,
        old: Option<&mut Option<V>>,
    ) -> Result<Option<Undo<K>>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let Some(found) = stripe.get(hash, key) else {
            return Ok(None);
        };
        match old {
            // Every reader of the map's blocks holds the key's stripe, which this operation
            // holds: a block written in this epoch can be reused as soon as it ends.
            Some(old) => {
                let view = op.view(found)?;
                *old = Some(entry::view_value(&view)?);
                op.delete_viewed_unshared(&view)?;
            }
            None => op.delete_unshared(found)?,
        }
        Ok(stripe
            .remove(hash, key)
            .map(|(key, block)| Undo::Removed { hash, key, block }))
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
        let (result, _) = self.compute_locked(op, &mut stripe, hash, key, f, Rewrite::InPlace)?;
        Ok(result)
    }

    /// [`compute`](Self::compute)'s step with `key`'s stripe locked (`stripe`); returns
    /// `f`'s result and how to take the change back.
    fn compute_locked<R>(
        &self,
        op: &OpGuard<'_>,
        stripe: &mut StampedGuard<'_, Stripe<K>>,
        hash: u64,
        key: &K,
        f: impl FnOnce(Option<V>) -> (Change<V>, R),
        rewrite: Rewrite,
    ) -> Result<(R, Option<Undo<K>>)> {
        let found = stripe.get(hash, key);
        let current = found.map(|b| entry::read_value(op, b)).transpose()?;
        let (change, result) = f(current);
        let undo = match change {
            Change::Keep => None,
            // Encoded into this thread's buffer: no allocation (and no regrowth) per write.
            Change::Set(new) => Some(entry::with_encoded::<K, V, V, _>(key, &new, |bytes| {
                self.write_found(op, stripe, hash, key, found, None, bytes, rewrite)
                    .map(|(undo, _)| undo)
            })?),
            Change::Remove => Self::remove_locked(op, stripe, hash, key, None)?,
        };
        Ok((result, undo))
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

impl<'h, 'o> Together<'h, '_, 'o> {
    /// Changes `map` in this [`together()`]: `f` gets a view of it whose methods read and
    /// write as the map's own do, and see the changes made before them; they are kept
    /// (and a crash keeps them) with the together's other changes, or taken back with
    /// them. Each stripe a key picks stays locked until the together ends.
    ///
    /// ```
    /// use montage_collections::{HashMap, Queue, together};
    /// use montage_core::{Heap, HeapConfig};
    ///
    /// let heap = Heap::create(&HeapConfig::in_memory(4 << 20))?;
    /// let jobs: HashMap<u64, String> = HashMap::open(&heap, "jobs")?;
    /// let ready: Queue<u64> = Queue::open(&heap, "ready")?;
    /// jobs.insert(7, "resize".to_owned())?;
    /// // A job moves to the queue: both changes, or (after a crash) neither.
    /// together(&heap, |tx| {
    ///     if tx.hash_map(&jobs, |jobs| jobs.delete(&7))? {
    ///         tx.queue(&ready, |ready| ready.push_back(7))?;
    ///     }
    ///     Ok(())
    /// })?;
    /// assert_eq!((jobs.len(), ready.pop_front()?), (0, Some(7)));
    /// # Ok::<(), montage_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What `f` returns; [`Error::Unsupported`] for a map
    /// of another heap or one taken already in this together.
    pub fn hash_map<K, V, S, R>(
        &mut self,
        map: &'h HashMap<K, V, S>,
        f: impl FnOnce(&mut TogetherMap<'_, 'o, 'h, K, V, S>) -> Result<R>,
    ) -> Result<R>
    where
        K: Codec + Hash + Eq + Clone + 'h,
        V: Codec + 'h,
        S: BuildHasher + 'h,
    {
        let part = |_: &OpGuard<'_>| {
            Ok(MapPart {
                map,
                stripes: Vec::new(),
                undo: Vec::new(),
            })
        };
        self.with_part(map.heap(), map, part, |part, op| {
            f(&mut TogetherMap { part, op })
        })
    }
}

/// The stripes of a map one [`together()`] locked, and how to take back its changes.
struct MapPart<'h, K: Hash + Eq, V, S: BuildHasher> {
    map: &'h HashMap<K, V, S>,
    /// Each locked stripe's index and guard.
    stripes: Vec<(usize, StampedGuard<'h, Stripe<K>>)>,
    /// The changes, in order, each with its stripe's place in `stripes`.
    undo: Vec<(usize, Undo<K>)>,
}

impl<'h, K: Hash + Eq, V, S: BuildHasher> Staged<'h> for MapPart<'h, K, V, S> {
    fn id(&self) -> StagedId {
        (std::ptr::from_ref(self.map).cast(), 0)
    }

    fn commit(&mut self) {
        self.undo.clear();
    }
}

/// Takes the changes back, last first, unless they were kept: the operation was rolled
/// back, and the stripes are still locked.
impl<K: Hash + Eq, V, S: BuildHasher> Drop for MapPart<'_, K, V, S> {
    fn drop(&mut self) {
        while let Some((at, undo)) = self.undo.pop() {
            self.stripes[at].1.undo(undo, &self.map.hasher);
        }
    }
}

/// A [`HashMap`] changed in a [`together()`] ([`Together::hash_map`]).
pub struct TogetherMap<'a, 'o, 'h, K: Hash + Eq, V, S: BuildHasher = RandomState> {
    part: &'a mut MapPart<'h, K, V, S>,
    op: &'a OpGuard<'o>,
}

impl<K: Hash + Eq, V, S: BuildHasher> std::fmt::Debug for TogetherMap<'_, '_, '_, K, V, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TogetherMap")
            .field("owner", &self.part.map.attached.owner())
            .field("locked_stripes", &self.part.stripes.len())
            .field("changes", &self.part.undo.len())
            .finish()
    }
}

impl<K, V, S> TogetherMap<'_, '_, '_, K, V, S>
where
    K: Codec + Hash + Eq + Clone,
    V: Codec,
    S: BuildHasher,
{
    /// The hash of `key` and the place of its stripe's guard, which is locked first if it
    /// is not yet.
    fn locked<Q: Hash + ?Sized>(&mut self, key: &Q) -> Result<(u64, usize)> {
        let map = self.part.map;
        let hash = map.hasher.hash_one(key);
        let index = map.stripe_index(hash);
        if let Some(at) = self.part.stripes.iter().position(|&(i, _)| i == index) {
            return Ok((hash, at));
        }
        let guard = map.stripes[index].lock(self.op)?;
        self.part.stripes.push((index, guard));
        Ok((hash, self.part.stripes.len() - 1))
    }

    /// As [`HashMap::get`].
    ///
    /// # Errors
    ///
    /// As [`HashMap::get`]; [`Error::Aborted`] when the
    /// together must run again (return it from the closure).
    pub fn get<Q>(&mut self, key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, at) = self.locked(key)?;
        match self.part.stripes[at].1.get(hash, key) {
            Some(block) => entry::read_value(self.op, block).map(Some),
            None => Ok(None),
        }
    }

    /// As [`HashMap::contains_key`].
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn contains_key<Q>(&mut self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, at) = self.locked(key)?;
        Ok(self.part.stripes[at].1.get(hash, key).is_some())
    }

    /// As [`HashMap::insert`].
    ///
    /// # Errors
    ///
    /// As [`HashMap::insert`] and [`get`](Self::get).
    #[allow(clippy::needless_pass_by_value)] // as `HashMap::insert`
    pub fn insert(&mut self, key: K, value: V) -> Result<Option<V>> {
        let mut old = None;
        entry::with_encoded::<K, V, V, _>(&key, &value, |bytes| {
            self.put_bytes(&key, bytes, Some(&mut old))
        })?;
        Ok(old)
    }

    /// As [`HashMap::put`].
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `HashMap::insert`
    pub fn put(&mut self, key: K, value: V) -> Result<bool> {
        self.put_ref(key, &value)
    }

    /// As [`HashMap::put_ref`].
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `HashMap::insert`
    pub fn put_ref<Q: EncodeAs<V> + ?Sized>(&mut self, key: K, value: &Q) -> Result<bool> {
        entry::with_encoded::<K, V, Q, _>(&key, value, |bytes| self.put_bytes(&key, bytes, None))
    }

    fn put_bytes(&mut self, key: &K, bytes: &[u8], old: Option<&mut Option<V>>) -> Result<bool> {
        let (hash, at) = self.locked(key)?;
        let part = &mut *self.part;
        let stripe = &mut part.stripes[at].1;
        let old = old.map_or(Replaced::Nothing, Replaced::Value);
        let (present, undo) =
            part.map
                .put_locked(self.op, stripe, hash, key, bytes, old, Rewrite::Copy)?;
        part.undo.push((at, undo));
        Ok(present)
    }

    /// As [`HashMap::remove`].
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn remove<Q>(&mut self, key: &Q) -> Result<Option<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut old = None;
        self.remove_in(key, Some(&mut old))?;
        Ok(old)
    }

    /// As [`HashMap::delete`].
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn delete<Q>(&mut self, key: &Q) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove_in(key, None)
    }

    fn remove_in<Q>(&mut self, key: &Q, old: Option<&mut Option<V>>) -> Result<bool>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, at) = self.locked(key)?;
        let stripe = &mut self.part.stripes[at].1;
        let undo = HashMap::<K, V, S>::remove_locked(self.op, stripe, hash, key, old)?;
        let present = undo.is_some();
        self.part.undo.extend(undo.map(|undo| (at, undo)));
        Ok(present)
    }

    /// As [`HashMap::compute`], with `f` run once.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn compute<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(Option<V>) -> (Change<V>, R),
    ) -> Result<R> {
        let (hash, at) = self.locked(key)?;
        let part = &mut *self.part;
        let stripe = &mut part.stripes[at].1;
        let (result, undo) =
            part.map
                .compute_locked(self.op, stripe, hash, key, f, Rewrite::Copy)?;
        part.undo.extend(undo.map(|undo| (at, undo)));
        Ok(result)
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
                    map.put_in(old, &1, &bytes, Replaced::Nothing),
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
