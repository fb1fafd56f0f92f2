//! Which items to evict when the heap is full: the least recently used of the block size the
//! new item needs, as memcached evicts from the least recently used end of one slab class.
//!
//! A freed block holds only a payload of its own size (see
//! [`block_size`](montage_core::limits::block_size)), so, as in memcached, each block size has
//! its own order. It lives in DRAM only: after a restart it is rebuilt from each item's last
//! store time (what the heap keeps), so an item read often but stored long ago starts out
//! old. Keys are spread over [`SHARDS`] shards, each with its own lock and its own list per
//! block size, so that reads of different keys do not contend; each use is stamped with the
//! time, and eviction merges the shards' lists by those stamps, so the order it takes is
//! least recently used across the shards too.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use foldhash::fast::RandomState;
use lru::LruCache;

/// How many independently locked shards the keys are spread over.
pub const SHARDS: usize = 64;

/// What a list knows of an item: the cas unique of the version it last saw, when the item
/// was last used (a stamp, for the order, and in Unix seconds, for meta get's `l`), and
/// whether it was read since it was stored (meta get's `h`).
#[derive(Debug, Clone, Copy)]
struct Seen {
    cas: u64,
    used: u64,
    accessed: i64,
    fetched: bool,
}

/// One list per block size, least recently used at its end. Every hash here (the shard's,
/// the size's, the lists' own, which `lru` takes from `hashbrown`) is foldhash, each table
/// seeded at random as `hashbrown` seeds its own: a read hashes its key twice and its size
/// once, and with `SipHash` the shard's and the size's hashes were about 350 of an `mg`
/// hit's 3,300 instructions.
type Lists = HashMap<u64, LruCache<Box<[u8]>, Seen>, RandomState>;

/// The recency order of a store's items, per block size.
pub struct Recency {
    shards: Box<[Mutex<Lists>]>,
    hasher: RandomState,
    /// Use stamps are nanoseconds since this, plus `base`.
    start: Instant,
    /// Above every stamp the rebuild gave.
    base: u64,
}

impl std::fmt::Debug for Recency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recency")
            .field("items", &self.len())
            .finish_non_exhaustive()
    }
}

impl Default for Recency {
    fn default() -> Self {
        Recency::rebuilt(std::iter::empty())
    }
}

impl Recency {
    /// The order of `items` (key, block size, cas unique, store time in Unix seconds),
    /// given least recently used first.
    pub fn rebuilt(items: impl IntoIterator<Item = (Vec<u8>, u64, u64, i64)>) -> Recency {
        let mut recency = Recency {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            start: Instant::now(),
            base: 0,
        };
        let mut stamp = 0;
        for (key, size, cas, stored) in items {
            stamp += 1;
            let seen = Seen {
                cas,
                used: stamp,
                accessed: stored,
                fetched: false,
            };
            recency.insert(&key, size, seen);
        }
        recency.base = stamp + 1;
        recency
    }

    fn now(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.base.saturating_add(elapsed)
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Lists> {
        let hash = self.hasher.hash_one(key);
        // The high bits: the lists' own tables use the low ones (the hashers differ, but
        // this costs nothing).
        let index = usize::try_from(hash >> 32).unwrap_or(0) % self.shards.len();
        lock(&self.shards[index])
    }

    fn insert(&self, key: &[u8], size: u64, seen: Seen) {
        insert_into(&mut self.shard(key), key, size, seen);
    }

    /// Records that `key`'s item, in a block of `size` bytes, was just stored (version
    /// `cas`) at `now` (Unix seconds): it becomes the most recently used, not yet read.
    /// `previous` is the block size of the version it replaced, if any, and `same_version`
    /// whether that was the same version rewritten (a new expiry, say), which keeps
    /// whether it was read.
    pub fn used(&self, key: &[u8], size: u64, cas: u64, previous: Option<u64>, now: i64) {
        self.stored(key, size, cas, previous, now, false);
    }

    /// [`used`](Self::used) for a rewrite of the version the lists know (a new expiry or a
    /// mark): whether it was read is kept.
    pub fn rewritten(&self, key: &[u8], size: u64, cas: u64, previous: Option<u64>, now: i64) {
        self.stored(key, size, cas, previous, now, true);
    }

    fn stored(
        &self,
        key: &[u8],
        size: u64,
        cas: u64,
        previous: Option<u64>,
        now: i64,
        same_version: bool,
    ) {
        let used = self.now();
        // One lock for the old list and the new: the key's shard holds both.
        let mut lists = self.shard(key);
        let mut fetched = false;
        if let Some(old) = previous
            && let Some(list) = lists.get_mut(&old)
        {
            let known = if old == size {
                list.peek(key).copied()
            } else {
                list.pop(key)
            };
            fetched = same_version && known.is_some_and(|seen| seen.fetched);
        }
        let seen = Seen {
            cas,
            used,
            accessed: now,
            fetched,
        };
        insert_into(&mut lists, key, size, seen);
    }

    /// Records that `key`'s item, in a block of `size` bytes, was read at `now` (Unix
    /// seconds): it becomes the most recently used. No allocation: an item the lists do not
    /// know stays unknown.
    pub fn read(&self, key: &[u8], size: u64, now: i64) {
        let stamp = self.now();
        if let Some(seen) = self
            .shard(key)
            .get_mut(&size)
            .and_then(|list| list.get_mut(key))
        {
            seen.used = stamp;
            seen.accessed = now;
            seen.fetched = true;
        }
    }

    /// Whether `key`'s item, in a block of `size` bytes, was read since it was stored, and
    /// when it was last used (Unix seconds); `None` if the lists do not know it.
    pub fn access(&self, key: &[u8], size: u64) -> Option<(bool, i64)> {
        let lists = self.shard(key);
        let seen = lists.get(&size)?.peek(key)?;
        Some((seen.fetched, seen.accessed))
    }

    /// Forgets `key`'s item, in a block of `size` bytes (it was deleted).
    pub fn forget(&self, key: &[u8], size: u64) {
        if let Some(list) = self.shard(key).get_mut(&size) {
            list.pop(key);
        }
    }

    /// Takes up to `count` of the least recently used items in blocks of `size` bytes out of
    /// the lists, least recently used first: each key with the cas unique of the version the
    /// lists last saw.
    pub fn oldest(&self, size: u64, count: usize) -> Vec<(Box<[u8]>, u64)> {
        let oldest_of = |lists: &mut Lists| {
            lists
                .get(&size)
                .and_then(LruCache::peek_lru)
                .map(|(_, seen)| seen.used)
        };
        // Each shard's least recently used item, by its stamp; a shard is locked only
        // while its list is read or taken from.
        let mut heads: BinaryHeap<Reverse<(u64, usize)>> = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(index, shard)| Some(Reverse((oldest_of(&mut lock(shard))?, index))))
            .collect();
        let mut taken = Vec::new();
        while taken.len() < count
            && let Some(Reverse((_, index))) = heads.pop()
        {
            let mut lists = lock(&self.shards[index]);
            if let Some((key, seen)) = lists.get_mut(&size).and_then(LruCache::pop_lru) {
                taken.push((key, seen.cas));
            }
            if let Some(next) = oldest_of(&mut lists) {
                heads.push(Reverse((next, index)));
            }
        }
        taken
    }

    /// The block size, other than `except`, whose least recently used item is the least
    /// recently used of all (`None` if no other size has items).
    pub fn oldest_size(&self, except: u64) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|shard| {
                let lists = lock(shard);
                lists
                    .iter()
                    .filter(|&(&size, _)| size != except)
                    .filter_map(|(&size, list)| Some((list.peek_lru()?.1.used, size)))
                    .min()
            })
            .min()
            .map(|(_, size)| size)
    }

    /// How many items the lists hold.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).values().map(LruCache::len).sum::<usize>())
            .sum()
    }

    /// Whether the lists hold no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Makes `key`'s item, in a block of `size` bytes, the most recently used of `lists` (a
/// shard's), as `seen`.
fn insert_into(lists: &mut Lists, key: &[u8], size: u64, seen: Seen) {
    let list = lists.entry(size).or_insert_with(LruCache::unbounded);
    match list.get_mut(key) {
        Some(known) => *known = seen,
        None => {
            list.push(key.into(), seen);
        }
    }
}

fn lock(shard: &Mutex<Lists>) -> MutexGuard<'_, Lists> {
    // A panic while a list was changed leaves at worst an order slightly off.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(taken: Vec<(Box<[u8]>, u64)>) -> Vec<Vec<u8>> {
        taken.into_iter().map(|(key, _)| key.into_vec()).collect()
    }

    #[test]
    fn the_least_recently_used_of_the_size_goes_first_across_the_shards() {
        let recency = Recency::default();
        let names: Vec<Vec<u8>> = (0..500).map(|i| format!("key{i}").into_bytes()).collect();
        for key in &names {
            recency.used(key, 128, 1, None, 0);
        }
        recency.used(b"big", 256, 1, None, 0);
        // Read every tenth key: they become the most recently used.
        for key in names.iter().step_by(10) {
            recency.read(key, 128, 0);
        }
        let unread = names.iter().enumerate().filter(|(i, _)| i % 10 != 0);
        let mut expected: Vec<Vec<u8>> = unread.map(|(_, key)| key.clone()).collect();
        expected.extend(names.iter().step_by(10).cloned());
        assert_eq!(keys(recency.oldest(128, 1000)), expected);
        assert_eq!(keys(recency.oldest(256, 1000)), vec![b"big".to_vec()]);
        assert!(recency.is_empty());
    }

    #[test]
    fn the_oldest_size_is_the_one_whose_oldest_item_is_oldest() {
        let recency = Recency::default();
        assert_eq!(recency.oldest_size(64), None);
        recency.used(b"a", 128, 1, None, 0);
        recency.used(b"b", 256, 1, None, 0);
        recency.used(b"c", 64, 1, None, 0);
        assert_eq!(recency.oldest_size(64), Some(128));
        assert_eq!(recency.oldest_size(128), Some(256));
        recency.read(b"a", 128, 0);
        assert_eq!(recency.oldest_size(64), Some(256));
    }

    #[test]
    fn reads_are_remembered_until_a_new_version_is_stored() {
        let recency = Recency::default();
        recency.used(b"k", 64, 1, None, 100);
        assert_eq!(recency.access(b"k", 64), Some((false, 100)));
        recency.read(b"k", 64, 150);
        assert_eq!(recency.access(b"k", 64), Some((true, 150)));
        // A new expiry for the same version keeps the read.
        recency.rewritten(b"k", 64, 1, Some(64), 160);
        assert_eq!(recency.access(b"k", 64), Some((true, 160)));
        recency.used(b"k", 128, 2, Some(64), 170);
        assert_eq!(recency.access(b"k", 128), Some((false, 170)));
        assert_eq!(recency.access(b"k", 64), None);
    }

    #[test]
    fn an_item_whose_size_changed_moves_to_its_new_list() {
        let recency = Recency::default();
        recency.used(b"k", 128, 1, None, 0);
        recency.used(b"k", 256, 2, Some(128), 0);
        assert!(recency.oldest(128, 10).is_empty());
        assert_eq!(recency.oldest(256, 10), vec![(Box::from(&b"k"[..]), 2)]);
        recency.used(b"k", 256, 3, None, 0);
        recency.forget(b"k", 256);
        assert!(recency.is_empty());
    }

    #[test]
    fn a_rebuilt_order_is_the_order_given_and_older_than_any_use() {
        let items = (0..100u64).map(|i| (i.to_string().into_bytes(), 64, i, 0));
        let recency = Recency::rebuilt(items);
        recency.used(b"new", 64, 1000, None, 0);
        recency.read(b"7", 64, 0);
        let order = recency.oldest(64, 200);
        let cas: Vec<u64> = order.iter().map(|&(_, cas)| cas).collect();
        let mut expected: Vec<u64> = (0..100).filter(|&i| i != 7).collect();
        expected.extend([1000, 7]);
        assert_eq!(cas, expected);
    }
}
