//! The item store: memcached's storage semantics on montage's persistent hash map.
//!
//! Every item is one entry of a [`HashMap`] from key to [`Item`]; every command that changes
//! an item is one [`HashMap::compute`], so it is atomic and survives a crash exactly as the
//! map's operations do (buffered durable: a `sync` makes it durable). Expiry is lazy: an
//! expired or flushed item is treated as absent by every command and overwritten or
//! removed by the next write to its key.
//!
//! `flush_all` is itself durable: it writes a marker entry under a key no client can send
//! (it holds spaces, which end a key in the protocol), read back when the store opens.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use montage_collections::{Change, HashMap};
use montage_core::payload::Fingerprint;
use montage_core::{Codec, Heap, Result};

use crate::protocol::{StoreMode, number};

/// One cached item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The client's opaque flags.
    pub flags: u32,
    /// When the item expires, in Unix seconds (0: never).
    pub exptime: i64,
    /// When the item was last stored, in Unix seconds.
    pub stored: i64,
    /// The item's cas unique: different for every stored version.
    pub cas: u64,
    /// The value.
    pub data: Vec<u8>,
}

/// The bytes of an item before its data.
const ITEM_HEADER: usize = 4 + 8 + 8 + 8;

impl Codec for Item {
    const CODEC_ID: u64 = Fingerprint::new()
        .str("montage-kv item, version 1")
        .finish();

    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.exptime.to_le_bytes());
        out.extend_from_slice(&self.stored.to_le_bytes());
        out.extend_from_slice(&self.cas.to_le_bytes());
        out.extend_from_slice(&self.data);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let header = bytes.get(..ITEM_HEADER)?;
        let word = |at: usize| -> Option<[u8; 8]> { header.get(at..at + 8)?.try_into().ok() };
        Some(Item {
            flags: u32::from_le_bytes(header.get(..4)?.try_into().ok()?),
            exptime: i64::from_le_bytes(word(4)?),
            stored: i64::from_le_bytes(word(12)?),
            cas: u64::from_le_bytes(word(20)?),
            data: bytes[ITEM_HEADER..].to_vec(),
        })
    }
}

/// The bytes an item counts for in [`Store::bytes`].
fn size(key: &[u8], item: &Item) -> i64 {
    i64::try_from(key.len() + item.data.len()).unwrap_or(i64::MAX)
}

/// What a command did, as the protocol reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`: the condition of `add`, `replace`, `append` or `prepend` failed.
    NotStored,
    /// `EXISTS`: the item changed since the client read its cas unique.
    Exists,
    /// `NOT_FOUND`.
    NotFound,
    /// `DELETED`.
    Deleted,
    /// `TOUCHED`.
    Touched,
    /// The new value of an `incr` or `decr`.
    Value(u64),
    /// `incr`/`decr` of a value that is not a decimal number.
    NonNumeric,
}

/// The current time in Unix seconds.
pub trait Clock: Send + Sync {
    /// Seconds since the Unix epoch.
    fn now(&self) -> i64;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

/// Expiry times up to this many seconds are relative to now; larger ones are Unix times.
const RELATIVE_LIMIT: i64 = 60 * 60 * 24 * 30;

/// The key of the `flush_all` marker: spaces keep it out of clients' reach.
const FLUSH_KEY: &[u8] = b"montage-kv flush_all marker";

/// What a lookup found: the item, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    /// A live item.
    Hit(T),
    /// No item.
    Miss,
    /// An item past its expiry time.
    Expired,
    /// An item that a `flush_all` invalidated.
    Flushed,
}

/// The items of one cache, on one heap.
pub struct Store<C = SystemClock> {
    map: HashMap<Vec<u8>, Item>,
    /// Key and data bytes of the items the map holds (expired ones until they are removed).
    bytes: AtomicI64,
    next_cas: AtomicU64,
    /// A delayed `flush_all`: from this time on, items stored before it are gone (0: none).
    flush_at: AtomicI64,
    /// Immediate `flush_all`s: items with a cas unique up to this are gone (0: none).
    flush_cas: AtomicU64,
    /// Serializes `flush_all`s, so the marker and the two fields above agree.
    flushing: Mutex<()>,
    clock: C,
}

impl<C> std::fmt::Debug for Store<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("map", &self.map)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Store<C> {
    /// Opens (or creates) the cache named `name` in `heap`, recovering its items.
    ///
    /// # Errors
    ///
    /// As [`HashMap::open`], and a heap error while reading the items back.
    pub fn open(heap: &Heap, name: &str, clock: C) -> Result<Self> {
        // Derived from the map's own rebuild scan, which reads every item anyway.
        let max_cas = AtomicU64::new(0);
        let bytes = AtomicI64::new(0);
        let flush = Mutex::new((0, 0));
        let map = HashMap::open_with(heap, name, |key: &Vec<u8>, item: &Item| {
            // ORDERING: the scan's threads are joined before `open_with` returns.
            if key == FLUSH_KEY {
                *flush.lock().unwrap_or_else(PoisonError::into_inner) = (item.exptime, item.cas);
            } else {
                bytes.fetch_add(size(key, item), Ordering::Relaxed);
            }
            // New items must get uniques above every stored one and above an immediate
            // flush's threshold, or the flush would hide them.
            max_cas.fetch_max(item.cas, Ordering::Relaxed);
        })?;
        let (flush_at, flush_cas) = flush.into_inner().unwrap_or_else(PoisonError::into_inner);
        Ok(Store {
            map,
            bytes,
            next_cas: AtomicU64::new(max_cas.into_inner().saturating_add(1)),
            flush_at: AtomicI64::new(flush_at),
            flush_cas: AtomicU64::new(flush_cas),
            flushing: Mutex::new(()),
            clock,
        })
    }

    /// The heap the items live in (to `sync` it).
    pub fn heap(&self) -> &Heap {
        self.map.heap()
    }

    /// How many items the map holds, expired ones included (until a write removes them).
    pub fn len(&self) -> usize {
        // ORDERING: a statistic.
        let marker = self.flush_at.load(Ordering::Relaxed) != 0
            || self.flush_cas.load(Ordering::Relaxed) != 0;
        let marker = usize::from(marker);
        self.map.len().saturating_sub(marker)
    }

    /// Whether the store holds no items (as [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Key and data bytes of the items held (as [`len`](Self::len), expired ones included).
    pub fn bytes(&self) -> u64 {
        // ORDERING: a statistic.
        u64::try_from(self.bytes.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Runs `f` on `key`'s item (or its absence) in one [`HashMap::compute`], keeping the
    /// byte count in step with the change that took effect.
    fn change(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<Item>) -> (Change<Item>, Outcome),
    ) -> Result<Outcome> {
        let (outcome, delta) = self.map.compute(&key.to_vec(), |current| {
            let old = current.as_ref().map_or(0, |item| size(key, item));
            let (change, outcome) = f(current);
            let delta = match &change {
                Change::Keep => 0,
                Change::Set(new) => size(key, new) - old,
                Change::Remove => -old,
            };
            (change, (outcome, delta))
        })?;
        // ORDERING: a statistic.
        self.bytes.fetch_add(delta, Ordering::Relaxed);
        Ok(outcome)
    }

    fn cas(&self) -> u64 {
        // ORDERING: only uniqueness matters; the map orders the items themselves.
        self.next_cas.fetch_add(1, Ordering::Relaxed)
    }

    /// `exptime` as memcached reads it, made absolute (0 stays "never").
    fn absolute(exptime: i64, now: i64) -> i64 {
        match exptime {
            0 => 0,
            e if e < 0 => now.saturating_sub(1).max(1),
            e if e <= RELATIVE_LIMIT => now.saturating_add(e),
            e => e,
        }
    }

    /// Whether `item` is visible at `now`: not expired and not flushed.
    fn live(&self, item: &Item, now: i64) -> bool {
        self.why_dead(item, now).is_none()
    }

    /// Why `item` is not visible at `now` ([`Lookup::Expired`] or [`Lookup::Flushed`]), or
    /// `None` if it is.
    fn why_dead(&self, item: &Item, now: i64) -> Option<Lookup<Item>> {
        if item.exptime != 0 && item.exptime <= now {
            return Some(Lookup::Expired);
        }
        // ORDERING: the flush fields are set before the marker's operation returns.
        let at = self.flush_at.load(Ordering::Acquire);
        let cas = self.flush_cas.load(Ordering::Acquire);
        (item.cas <= cas || (at != 0 && at <= now && item.stored < at)).then_some(Lookup::Flushed)
    }

    /// The item stored under `key`, if it is live.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn get(&self, key: &[u8]) -> Result<Option<Item>> {
        Ok(match self.lookup(key)? {
            Lookup::Hit(item) => Some(item),
            _ => None,
        })
    }

    /// The item stored under `key` if it is live, or why there is none (for `stats`).
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn lookup(&self, key: &[u8]) -> Result<Lookup<Item>> {
        let now = self.clock.now();
        let Some(item) = self.map.get(key)? else {
            return Ok(Lookup::Miss);
        };
        let Some(dead) = self.why_dead(&item, now) else {
            return Ok(Lookup::Hit(item));
        };
        // As memcached, an item found dead goes (unless a write replaced it meanwhile).
        self.change(key, |current| match current {
            Some(item) if !self.live(&item, now) => (Change::Remove, Outcome::NotFound),
            _ => (Change::Keep, Outcome::NotFound),
        })?;
        Ok(dead)
    }

    /// A storage command (`set`, `add`, `replace`, `append`, `prepend`, `cas`).
    ///
    /// # Errors
    ///
    /// A heap error (`OutOfSpace` when the heap is full; nothing changed).
    pub fn store(
        &self,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: i64,
        data: &[u8],
        cas_unique: Option<u64>,
    ) -> Result<Outcome> {
        let now = self.clock.now();
        let fresh = |data: Vec<u8>, flags, exptime| Item {
            flags,
            exptime,
            stored: now,
            cas: self.cas(),
            data,
        };
        let exptime = Self::absolute(exptime, now);
        self.change(key, |current| {
            let live = current.filter(|item| self.live(item, now));
            let set = || Change::Set(fresh(data.to_vec(), flags, exptime));
            match (mode, live) {
                (StoreMode::Set, _) | (StoreMode::Add, None) | (StoreMode::Replace, Some(_)) => {
                    (set(), Outcome::Stored)
                }
                (StoreMode::Add, Some(_))
                | (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                    (Change::Keep, Outcome::NotStored)
                }
                (StoreMode::Append | StoreMode::Prepend, Some(old)) => {
                    // The item keeps its flags and expiry, as in memcached.
                    let joined = if mode == StoreMode::Append {
                        [&old.data[..], data].concat()
                    } else {
                        [data, &old.data[..]].concat()
                    };
                    (
                        Change::Set(fresh(joined, old.flags, old.exptime)),
                        Outcome::Stored,
                    )
                }
                (StoreMode::Cas, None) => (Change::Keep, Outcome::NotFound),
                (StoreMode::Cas, Some(old)) if Some(old.cas) != cas_unique => {
                    (Change::Keep, Outcome::Exists)
                }
                (StoreMode::Cas, Some(_)) => (set(), Outcome::Stored),
            }
        })
    }

    /// `delete`.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn delete(&self, key: &[u8]) -> Result<Outcome> {
        let now = self.clock.now();
        self.change(key, |current| match current {
            Some(item) if self.live(&item, now) => (Change::Remove, Outcome::Deleted),
            // An expired item goes too, but the client hears it was not there.
            Some(_) => (Change::Remove, Outcome::NotFound),
            None => (Change::Keep, Outcome::NotFound),
        })
    }

    /// `incr` (wrapping at 2^64, as memcached) or `decr` (stopping at 0).
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64) -> Result<Outcome> {
        let now = self.clock.now();
        self.change(key, |current| {
            let Some(item) = current.filter(|item| self.live(item, now)) else {
                return (Change::Keep, Outcome::NotFound);
            };
            // As memcached reads it: a number as `strtoull` takes it (white space before it,
            // and anything after white space, allowed).
            let Some(value) = Some(&item.data[..])
                .filter(|data| !data.is_empty())
                .and_then(number::c_ulonglong)
            else {
                return (Change::Keep, Outcome::NonNumeric);
            };
            let new = if incr {
                value.wrapping_add(delta)
            } else {
                value.saturating_sub(delta)
            };
            // A result no longer than the value overwrites it, padded with spaces to its
            // length, as memcached does in place.
            let mut data = new.to_string().into_bytes();
            if data.len() < item.data.len() {
                data.resize(item.data.len(), b' ');
            }
            let item = Item {
                stored: now,
                cas: self.cas(),
                data,
                ..item
            };
            (Change::Set(item), Outcome::Value(new))
        })
    }

    /// `gat`: the live item stored under `key`, given the new expiry `exptime` (as
    /// [`touch`](Self::touch)).
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn get_and_touch(&self, key: &[u8], exptime: i64) -> Result<Option<Item>> {
        let now = self.clock.now();
        let exptime = Self::absolute(exptime, now);
        let mut touched = None;
        self.change(key, |current| {
            match current.filter(|item| self.live(item, now)) {
                Some(item) => {
                    let item = Item { exptime, ..item };
                    touched = Some(item.clone());
                    (Change::Set(item), Outcome::Touched)
                }
                None => (Change::Keep, Outcome::NotFound),
            }
        })?;
        Ok(touched)
    }

    /// `touch`: a new expiry for a live item.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn touch(&self, key: &[u8], exptime: i64) -> Result<Outcome> {
        let now = self.clock.now();
        let exptime = Self::absolute(exptime, now);
        self.change(key, |current| {
            match current.filter(|item| self.live(item, now)) {
                Some(item) => (Change::Set(Item { exptime, ..item }), Outcome::Touched),
                None => (Change::Keep, Outcome::NotFound),
            }
        })
    }

    /// `flush_all`: every item stored before the flush takes effect (now, or after `delay`)
    /// becomes invisible. As in memcached, an immediate flush also cancels a pending
    /// delayed one, and a delayed flush leaves earlier immediate ones in force. The marker
    /// is an entry of the map, so the flush is as durable as any write.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub fn flush_all(&self, delay: Option<i64>) -> Result<()> {
        let _serial = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        // ORDERING: the fields change only under `flushing`, held here.
        let (at, cas) = match delay {
            None | Some(0) => (0, self.cas()),
            Some(d) => (
                Self::absolute(d, now),
                self.flush_cas.load(Ordering::Acquire),
            ),
        };
        let marker = Item {
            flags: 0,
            exptime: at,
            stored: now,
            cas,
            data: Vec::new(),
        };
        self.map.insert(FLUSH_KEY.to_vec(), marker)?;
        // ORDERING: pairs with the Acquire loads in `live`.
        self.flush_cas.store(cas, Ordering::Release);
        self.flush_at.store(at, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use montage_core::HeapConfig;
    use montage_core::sim::SimMode;
    use std::sync::Arc;

    /// A clock the test moves by hand.
    #[derive(Clone, Default)]
    struct TestClock(Arc<AtomicI64>);

    impl Clock for TestClock {
        fn now(&self) -> i64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    fn heap() -> Heap {
        Heap::create(&HeapConfig::simulated(4 << 20, SimMode::Prefix)).unwrap()
    }

    fn clock_at(now: i64) -> TestClock {
        TestClock(Arc::new(AtomicI64::new(now)))
    }

    fn set(store: &Store<TestClock>, mode: StoreMode, key: &[u8], data: &[u8]) -> Outcome {
        store.store(mode, key, 7, 0, data, None).unwrap()
    }

    #[test]
    fn storage_commands_follow_memcached() {
        let heap = heap();
        let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
        assert_eq!(
            set(&store, StoreMode::Replace, b"k", b"x"),
            Outcome::NotStored
        );
        assert_eq!(
            set(&store, StoreMode::Append, b"k", b"x"),
            Outcome::NotStored
        );
        assert_eq!(set(&store, StoreMode::Add, b"k", b"b"), Outcome::Stored);
        assert_eq!(set(&store, StoreMode::Add, b"k", b"z"), Outcome::NotStored);
        assert_eq!(set(&store, StoreMode::Append, b"k", b"c"), Outcome::Stored);
        assert_eq!(set(&store, StoreMode::Prepend, b"k", b"a"), Outcome::Stored);
        let item = store.get(b"k").unwrap().unwrap();
        assert_eq!((item.data.as_slice(), item.flags), (&b"abc"[..], 7));
        let stale = Some(item.cas.wrapping_sub(1));
        assert_eq!(
            store
                .store(StoreMode::Cas, b"k", 1, 0, b"new", stale)
                .unwrap(),
            Outcome::Exists
        );
        assert_eq!(
            store
                .store(StoreMode::Cas, b"k", 1, 0, b"new", Some(item.cas))
                .unwrap(),
            Outcome::Stored
        );
        assert_eq!(
            store
                .store(StoreMode::Cas, b"gone", 1, 0, b"new", Some(1))
                .unwrap(),
            Outcome::NotFound
        );
        assert_eq!(store.get(b"k").unwrap().unwrap().data, b"new");
        assert_eq!(store.bytes(), 4);
        assert_eq!(store.delete(b"k").unwrap(), Outcome::Deleted);
        assert_eq!(store.delete(b"k").unwrap(), Outcome::NotFound);
        assert!(store.is_empty());
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn incr_wraps_and_decr_stops_at_zero() {
        let heap = heap();
        let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
        assert_eq!(store.arith(b"n", true, 1).unwrap(), Outcome::NotFound);
        set(&store, StoreMode::Set, b"n", b"18446744073709551615");
        assert_eq!(store.arith(b"n", true, 2).unwrap(), Outcome::Value(1));
        assert_eq!(store.arith(b"n", false, 5).unwrap(), Outcome::Value(0));
        // A shorter result is padded with spaces to the value's length, as memcached
        // writes it in place; a longer one takes the room it needs.
        assert_eq!(
            store.get(b"n").unwrap().unwrap().data,
            format!("{:<20}", 0).as_bytes()
        );
        set(&store, StoreMode::Set, b"m", b"99");
        assert_eq!(store.arith(b"m", true, 1).unwrap(), Outcome::Value(100));
        assert_eq!(store.get(b"m").unwrap().unwrap().data, b"100");
        // As `strtoull` reads it: white space before and after the digits.
        set(&store, StoreMode::Set, b"w", b" 12 x");
        assert_eq!(store.arith(b"w", true, 1).unwrap(), Outcome::Value(13));
        assert_eq!(store.get(b"w").unwrap().unwrap().data, b"13   ");
        for bad in [&b"12a"[..], b"", b"-1"] {
            set(&store, StoreMode::Set, b"s", bad);
            assert_eq!(store.arith(b"s", true, 1).unwrap(), Outcome::NonNumeric);
        }
    }

    #[test]
    fn items_expire_and_touch_extends_them() {
        let heap = heap();
        // Past 30 days of seconds, so that a Unix time reads as one.
        let start = 10_000_000;
        let clock = clock_at(start);
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        store
            .store(StoreMode::Set, b"short", 0, 10, b"v", None)
            .unwrap();
        store
            .store(StoreMode::Set, b"unix", 0, start + 500, b"v", None)
            .unwrap();
        store
            .store(StoreMode::Set, b"dead", 0, -1, b"v", None)
            .unwrap();
        assert!(store.get(b"dead").unwrap().is_none());
        assert_eq!(store.touch(b"short", 100).unwrap(), Outcome::Touched);
        clock.0.store(start + 50, Ordering::Relaxed);
        assert!(store.get(b"short").unwrap().is_some());
        assert!(store.get(b"unix").unwrap().is_some());
        clock.0.store(start + 500, Ordering::Relaxed);
        assert!(store.get(b"unix").unwrap().is_none());
        assert!(store.get(b"short").unwrap().is_none());
        assert_eq!(store.touch(b"short", 100).unwrap(), Outcome::NotFound);
        // An expired item does not block `add`.
        assert_eq!(
            set(&store, StoreMode::Add, b"short", b"again"),
            Outcome::Stored
        );
    }

    #[test]
    fn flush_all_now_and_later_survives_a_reopen() {
        let heap = heap();
        let clock = clock_at(1000);
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        set(&store, StoreMode::Set, b"old", b"1");
        store.flush_all(None).unwrap();
        assert!(store.get(b"old").unwrap().is_none());
        // Stored after the flush, in the same second: still there.
        set(&store, StoreMode::Set, b"new", b"2");
        assert!(store.get(b"new").unwrap().is_some());
        store.flush_all(Some(10)).unwrap();
        // The earlier immediate flush stays in force.
        assert!(store.get(b"old").unwrap().is_none());
        set(&store, StoreMode::Set, b"newer", b"3");
        assert!(store.get(b"newer").unwrap().is_some());
        // A flushed item goes when a read finds it, as in memcached: the two live ones keep
        // their bytes.
        assert_eq!(store.bytes(), 4 + 6);
        assert_eq!(store.len(), 2);
        drop(store);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(3);
        drop(heap);
        let config = HeapConfig::simulated(4 << 20, SimMode::Prefix);
        let heap = Heap::open_image(image, &config).unwrap();
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        assert_eq!(store.bytes(), 4 + 6);
        assert!(store.get(b"new").unwrap().is_some());
        assert!(store.get(b"old").unwrap().is_none());
        clock.0.store(1010, Ordering::Relaxed);
        assert!(store.get(b"new").unwrap().is_none());
        assert!(store.get(b"newer").unwrap().is_none());
        set(&store, StoreMode::Set, b"k", b"v");
        assert!(store.get(b"k").unwrap().is_some());
        // Reopened cas uniques continue past every stored one.
        let cas = store.get(b"k").unwrap().unwrap().cas;
        assert!(cas > 3, "cas {cas}");
    }

    #[test]
    fn no_client_can_name_the_flush_marker() {
        assert!(!crate::protocol::valid_key(FLUSH_KEY));
    }

    #[test]
    fn an_immediate_flush_cancels_a_pending_delayed_one() {
        let heap = heap();
        let clock = clock_at(1000);
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        store.flush_all(Some(100)).unwrap();
        store.flush_all(None).unwrap();
        set(&store, StoreMode::Set, b"k", b"v");
        clock.0.store(1200, Ordering::Relaxed);
        assert!(store.get(b"k").unwrap().is_some());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn items_round_trip_and_short_bytes_do_not_decode() {
        let item = Item {
            flags: 9,
            exptime: -5,
            stored: 77,
            cas: u64::MAX,
            data: b"data".to_vec(),
        };
        let mut bytes = Vec::new();
        item.encode(&mut bytes).unwrap();
        assert_eq!(Item::decode(&bytes), Some(item));
        assert_eq!(Item::decode(&bytes[..ITEM_HEADER - 1]), None);
    }
}
