//! [`NbHashMap`]: a nonblocking buffered durably linearizable hash map.
//!
//! Entries are payloads laid out as [`HashMap`](crate::HashMap)'s. The DRAM index is a
//! fixed array of buckets from key to the offset of the entry's current payload, each a
//! [`VerifiedBucket`]: montage-core's lock-free sorted list, whose changes are
//! epoch-verified swaps, behind one entry held in the bucket itself for a key that fits a
//! word (the integer types), so that most lookups of such keys read no list node. No
//! method takes a lock.
//!
//! # Linearization points
//!
//! An update first does all its payload work (a new payload; for a replacement, a new
//! version of the old one, which claims the old block through its retired bit; for a
//! removal, the anti-block), then publishes it with one epoch-verified swap of the key's
//! value word in its bucket: that swap is the linearization point, and it succeeds only
//! while the clock still reads the operation's epoch (INV-CAS-1). If the swap fails
//! (another operation changed the key first, or the epoch moved), the operation aborts,
//! which undoes its payload work, and runs again. A read inside an operation linearizes
//! at its load of the value word (and aborts if that holds a payload or a removal of a
//! newer epoch); one outside an operation, below, at its last load of it.
//!
//! # Reads
//!
//! [`get`](NbHashMap::get) and [`contains_key`](NbHashMap::contains_key) read without an
//! operation, as [`HashMap`](crate::HashMap)'s do, but with no lock to keep the entry
//! still: [`VerifiedBucket::peek`] loads the key's value word (linearizing there, as a read
//! inside an operation does), and [`Heap::read_named`] reads the payload it names and keeps
//! what it read only if the bucket still names that payload afterwards and the block was
//! not freed and handed out again meanwhile (INV-READ-1); the read then linearizes at that
//! second load. A swap in progress in the bucket, a dead list node, or a block changed
//! under the read sends the call into an operation instead, which decides the swap and
//! reports damage. Like `HashMap`'s reads, these may return a write of an epoch newer than
//! the clock the caller last saw; a `sync` after them covers it (`docs/design.md`, "Reads
//! outside operations").
//!
//! # Progress
//!
//! A swap fails only because another operation's swap succeeded or the clock moved on,
//! and no thread waits for another inside a swap (a thread that meets one in progress
//! completes it), so the map is lock-free. (A thread in its teardown, whose thread id is
//! gone, swaps through the clock's verify handshake instead, which a thread stalled inside
//! it holds back at the end of an epoch; so does a thread whose id is beyond 65,535.)
//!
//! The bucket count is fixed when the map is opened ([`NbHashMap::with_buckets`]); lists
//! grow as needed, so a map far larger than its bucket count works, only slower.

use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

use montage_core::payload::EncodeAs;
use montage_core::verified::{Peek, VerifiedBucket};
use montage_core::{Attached, Codec, Error, Heap, OpGuard, PBlock, Result};

use crate::count::Count;
use crate::entry;
use crate::structure::{self, contended};

/// The default number of buckets.
pub const DEFAULT_BUCKETS: usize = 1 << 16;

/// A nonblocking concurrent hash map whose entries survive crashes (module docs).
pub struct NbHashMap<K, V> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    hasher: std::collections::hash_map::RandomState,
    buckets: Box<[VerifiedBucket<K>]>,
    len: Count,
    _value: PhantomData<fn() -> V>,
}

impl<K, V> std::fmt::Debug for NbHashMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbHashMap")
            .field("owner", &self.attached.owner())
            .field("buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

/// What a read of a key found: its payload block and value.
struct Found<V> {
    block: PBlock,
    value: V,
}

impl<K, V> NbHashMap<K, V>
where
    K: Codec + Hash + Ord + Clone,
    V: Codec,
{
    /// Opens the map named `name` in `heap` with [`DEFAULT_BUCKETS`] buckets (see
    /// [`with_buckets`](Self::with_buckets)).
    ///
    /// # Errors
    ///
    /// As [`with_buckets`](Self::with_buckets).
    pub fn open(heap: &Heap, name: &str) -> Result<NbHashMap<K, V>> {
        NbHashMap::with_buckets(heap, name, DEFAULT_BUCKETS)
    }

    /// Opens the map named `name` in `heap` with `buckets` buckets (rounded up to a power of
    /// two), creating it if the heap has no structure of that name and rebuilding its index
    /// from its payloads (scanned in parallel) if it has.
    ///
    /// The table does not grow. A bucket (24 bytes of DRAM) holds the first integer key
    /// that lands in it itself ([`Codec::key_word`]) and every
    /// other key in a list searched node by node (a cache miss a node): give it about as
    /// many buckets as it will hold keys. With a million keys in the default 65,536 buckets
    /// and every key in a list, reads ran at 0.4x the striped [`HashMap`]'s; with a million
    /// buckets for half a million `u64` keys, the three mixes of the harness ran at 0.87x
    /// to 1.16x of it (geometric means of two runs; `docs/PERFORMANCE.md`, nineteenth
    /// round).
    ///
    /// [`HashMap`]: crate::HashMap
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the map was written with other key or value types;
    /// [`Error::Corrupted`] if an entry does not decode or a key appears twice;
    /// [`Error::DirectoryFull`] or [`Error::BadName`] when creating it.
    pub fn with_buckets(heap: &Heap, name: &str, buckets: usize) -> Result<NbHashMap<K, V>> {
        let attached = heap.attach(name)?;
        let (owner, existed) = (attached.owner(), attached.existed());
        let map = NbHashMap {
            attached,
            type_id: entry::type_id::<K, V>("hash-map")?,
            hasher: std::collections::hash_map::RandomState::new(),
            buckets: (0..buckets.max(1).next_power_of_two())
                .map(|_| VerifiedBucket::new())
                .collect(),
            len: Count::default(),
            _value: PhantomData,
        };
        if existed {
            entry::rebuild_index::<K, V>(
                heap,
                owner,
                map.type_id,
                "montage_collections::NbHashMap entry",
                "two live entries of a hash map have the same key",
                |key, _, block| {
                    let bucket = map.bucket(&key);
                    let inserted = heap.run_op(|op| bucket.insert(op, &key, block.offset()))?;
                    if inserted.is_ok() {
                        map.len.increment();
                    }
                    Ok(inserted.is_ok())
                },
            )?;
        }
        Ok(map)
    }

    fn bucket(&self, key: &K) -> &VerifiedBucket<K> {
        let hash = self.hasher.hash_one(key);
        &self.buckets[hash as usize & (self.buckets.len() - 1)]
    }

    /// `key`'s bucket, for a method about to begin an operation on it: its line is asked
    /// for first, so that it arrives while the operation begins.
    fn bucket_ahead(&self, key: &K) -> &VerifiedBucket<K> {
        let bucket = self.bucket(key);
        bucket.prefetch();
        bucket
    }

    /// The key's payload and value as `op` sees them. A payload replaced between the load
    /// of its offset and the read (it becomes invalid when the replacing operation ends)
    /// is looked up again.
    fn find(op: &OpGuard<'_>, bucket: &VerifiedBucket<K>, key: &K) -> Result<Option<Found<V>>> {
        Self::find_with(op, bucket, key, |block| entry::read_value(op, block))
    }

    /// The key's payload, checked live (as [`find`](Self::find), without reading the value).
    fn find_block(op: &OpGuard<'_>, bucket: &VerifiedBucket<K>, key: &K) -> Result<Option<PBlock>> {
        Ok(
            Self::find_with(op, bucket, key, |block| op.info(block).map(|_| ()))?
                .map(|found| found.block),
        )
    }

    /// The key's payload and what `read` makes of it, looking the key up again when the
    /// payload was replaced between the load of its offset and the read.
    fn find_with<T>(
        op: &OpGuard<'_>,
        bucket: &VerifiedBucket<K>,
        key: &K,
        read: impl Fn(PBlock) -> Result<T>,
    ) -> Result<Option<Found<T>>> {
        let mut last = None;
        loop {
            let Some(offset) = bucket.get(op, key)? else {
                return Ok(None);
            };
            let block = PBlock::from_offset(offset);
            match read(block) {
                Ok(value) => return Ok(Some(Found { block, value })),
                // The same offset twice: not a concurrent replacement but a broken index.
                Err(Error::InvalidBlock { .. }) if last != Some(offset) => last = Some(offset),
                Err(err) => return Err(err),
            }
        }
    }

    /// The value of `key`.
    ///
    /// It reads without an operation when it can (module docs, "Reads"), and inside one
    /// otherwise.
    ///
    /// # Errors
    ///
    /// A heap error ([`Error::Corrupted`] for an entry that does not decode, ...).
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        let bucket = self.bucket_ahead(key);
        match self.peek(bucket, key) {
            Peek::Found(value) => return Ok(Some(value)),
            Peek::Absent => return Ok(None),
            Peek::Undecided => {}
        }
        self.attached
            .heap()
            .run_op(|op| Ok(Self::find(op, bucket, key)?.map(|found| found.value)))
    }

    /// The value of `key` read without an operation (module docs, "Reads"), or
    /// [`Peek::Undecided`]: the caller reads inside an operation instead.
    fn peek(&self, bucket: &VerifiedBucket<K>, key: &K) -> Peek<V> {
        let heap = self.attached.heap();
        bucket.peek_with(key, |offset, still_named| {
            heap.read_named(PBlock::from_offset(offset), entry::view_value, still_named)
        })
    }

    /// Whether the map holds `key`.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn contains_key(&self, key: &K) -> Result<bool> {
        let bucket = self.bucket_ahead(key);
        match bucket.peek(key) {
            Peek::Found(_) => return Ok(true),
            Peek::Absent => return Ok(false),
            Peek::Undecided => {}
        }
        self.attached
            .heap()
            .run_op(|op| Ok(Self::find(op, bucket, key)?.is_some()))
    }

    /// Sets `key` to `value`; returns the value it replaced.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); as [`get`](Self::get).
    #[allow(clippy::needless_pass_by_value)] // as `std`'s: the map keeps the value (encoded)
    pub fn insert(&self, key: K, value: V) -> Result<Option<V>> {
        let bucket = self.bucket_ahead(&key);
        entry::with_encoded::<K, V, V, _>(&key, &value, |bytes| {
            self.attached
                .heap()
                .run_op(|op| match Self::find(op, bucket, &key)? {
                    Some(old) => {
                        Self::replace_in(op, bucket, &key, old.block, bytes)?;
                        Ok(Some(old.value))
                    }
                    None => self.insert_new(op, bucket, &key, bytes).map(|()| None),
                })
        })
    }

    /// Sets `key` to `value` as [`insert`](Self::insert) does, without reading the value it
    /// replaces; returns whether the key was present.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `insert`
    pub fn put(&self, key: K, value: V) -> Result<bool> {
        self.put_ref(key, &value)
    }

    /// Sets `key` to a value given in any form that encodes as a `V` (see [`EncodeAs`]), as
    /// [`put`](Self::put) does; returns whether the key was present. See
    /// [`HashMap::put_ref`](crate::HashMap::put_ref).
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    #[allow(clippy::needless_pass_by_value)] // as `insert`
    pub fn put_ref<Q: EncodeAs<V> + ?Sized>(&self, key: K, value: &Q) -> Result<bool> {
        let bucket = self.bucket_ahead(&key);
        entry::with_encoded::<K, V, Q, _>(&key, value, |bytes| {
            self.attached
                .heap()
                .run_op(|op| match Self::find_block(op, bucket, &key)? {
                    Some(block) => Self::replace_in(op, bucket, &key, block, bytes).map(|()| true),
                    None => self.insert_new(op, bucket, &key, bytes).map(|()| false),
                })
        })
    }

    /// Replaces the entry `old` of `key` with a new version holding `bytes`.
    fn replace_in(
        op: &OpGuard<'_>,
        bucket: &VerifiedBucket<K>,
        key: &K,
        old: PBlock,
        bytes: &[u8],
    ) -> Result<()> {
        let new = op.copy_update(old, bytes).map_err(contended)?;
        bucket
            .replace(op, key, old.offset(), new.offset())?
            .map_err(|_| Error::Aborted)
    }

    /// Adds an entry holding `bytes` for `key`, which `op` found absent.
    fn insert_new(
        &self,
        op: &OpGuard<'_>,
        bucket: &VerifiedBucket<K>,
        key: &K,
        bytes: &[u8],
    ) -> Result<()> {
        let new = op.alloc(self.attached.owner(), self.type_id, bytes)?;
        bucket
            .insert(op, key, new.offset())?
            .map_err(|_| Error::Aborted)?;
        self.len.increment();
        Ok(())
    }

    /// Removes `key`; returns its value.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn remove(&self, key: &K) -> Result<Option<V>> {
        let bucket = self.bucket_ahead(key);
        self.attached.heap().run_op(|op| {
            let Some(old) = Self::find(op, bucket, key)? else {
                return Ok(None);
            };
            self.remove_in(op, bucket, key, old.block)?;
            Ok(Some(old.value))
        })
    }

    /// Removes `key` as [`remove`](Self::remove) does, without reading its value; returns
    /// whether it was present.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn delete(&self, key: &K) -> Result<bool> {
        let bucket = self.bucket_ahead(key);
        self.attached.heap().run_op(|op| {
            let Some(block) = Self::find_block(op, bucket, key)? else {
                return Ok(false);
            };
            self.remove_in(op, bucket, key, block).map(|()| true)
        })
    }

    /// Deletes the entry `old` of `key`.
    fn remove_in(
        &self,
        op: &OpGuard<'_>,
        bucket: &VerifiedBucket<K>,
        key: &K,
        old: PBlock,
    ) -> Result<()> {
        op.delete(old).map_err(contended)?;
        bucket
            .remove(op, key, old.offset())?
            .map_err(|_| Error::Aborted)?;
        self.len.decrement();
        Ok(())
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
        let bucket = self.bucket_ahead(key);
        self.attached.heap().run_op(|op| {
            let Some(old) = Self::find(op, bucket, key)? else {
                return Ok(None);
            };
            let new = f(&old.value);
            let block = op
                .copy_update(old.block, &entry::encode(key, &new)?)
                .map_err(contended)?;
            bucket
                .replace(op, key, old.block.offset(), block.offset())?
                .map_err(|_| Error::Aborted)?;
            Ok(Some(new))
        })
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
        let bucket = self.bucket_ahead(key);
        self.attached.heap().run_op(|op| {
            let Some(old) = Self::find(op, bucket, key)? else {
                return Ok(Err(None));
            };
            if old.value != *current {
                return Ok(Err(Some(old.value)));
            }
            let block = op.copy_update(old.block, &bytes).map_err(contended)?;
            bucket
                .replace(op, key, old.block.offset(), block.offset())?
                .map_err(|_| Error::Aborted)?;
            Ok(Ok(()))
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

    /// An iterator over every entry. It reads one bucket at a time, each in one operation,
    /// so while others write it is not a snapshot of the whole map; an error ends it.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V)>> + '_ {
        structure::parts(self.buckets.len(), |index| self.bucket_entries(index))
    }

    /// The entries of bucket `index`, read in one operation.
    fn bucket_entries(&self, index: usize) -> Result<Vec<(K, V)>> {
        self.attached.heap().run_op(|op| {
            self.buckets[index]
                .entries(op)?
                .into_iter()
                .map(|(key, offset)| {
                    let value = entry::read_value(op, PBlock::from_offset(offset));
                    Ok((key, value.map_err(contended)?))
                })
                .collect()
        })
    }

    /// The heap the map lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}
