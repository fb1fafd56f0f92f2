//! The item store: memcached's storage semantics on montage's persistent hash map.
//!
//! Every item is one entry of a [`HashMap`] from key to [`Item`]; every command that changes
//! an item is one [`HashMap::compute`], so it is atomic and survives a crash exactly as the
//! map's operations do (buffered durable: a `sync` makes it durable). Expiry is lazy: an
//! expired or flushed item is treated as absent by every command and overwritten or
//! removed by the next write to its key.
//!
//! When the heap is full, a write evicts the least recently used items of the block size it
//! needs (see [`Recency`]) and tries again, as memcached does at its memory limit; an eviction
//! is a delete, as durable as any other. [`Store::without_evictions`] turns that off: a full
//! heap then refuses writes.
//!
//! `flush_all` is itself durable: it writes a marker entry under a key no client can send
//! (it holds spaces, which end a key in the protocol), read back when the store opens.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use montage_collections::{Change, HashMap};
use montage_core::limits::{SPAN_SIZE, block_size};
use montage_core::payload::{EncodeAs, Encoded, Fingerprint};
use montage_core::{Codec, Error, Heap, Result};

use crate::protocol::{StoreMode, number};
use crate::recency::Recency;

/// One cached item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The client's opaque flags.
    pub flags: u32,
    /// When the item expires, in Unix seconds (0: never).
    pub exptime: i64,
    /// When the item was last stored, in Unix seconds.
    pub stored: i64,
    /// The item's cas unique: different for every stored version (below 2^62).
    pub cas: u64,
    /// Marked stale by a meta delete with `I` (or a meta set with `I` and an older cas
    /// unique): a meta get reports it with `X`.
    pub stale: bool,
    /// A meta get has already told a client it won the right to recache the item (`W`);
    /// later ones report `Z`.
    pub won: bool,
    /// The value.
    pub data: Vec<u8>,
}

impl Item {
    /// A newly stored item, stored at `stored` as version `cas`, without marks.
    pub(crate) fn fresh(flags: u32, exptime: i64, stored: i64, cas: u64, data: Vec<u8>) -> Item {
        Item {
            flags,
            exptime,
            stored,
            cas,
            stale: false,
            won: false,
            data,
        }
    }
}

/// The cas word's bits above the unique: the item's marks.
const STALE_BIT: u64 = 1 << 63;
const WON_BIT: u64 = 1 << 62;

/// Cas uniques stay below this, so that the marks fit in the cas word's top bits.
const CAS_LIMIT: u64 = 1 << 62;

/// The bytes of an item before its data.
const ITEM_HEADER: usize = 4 + 8 + 8 + 8;

impl Codec for Item {
    const CODEC_ID: u64 = Fingerprint::new()
        .str("montage-kv item, version 1")
        .finish();

    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        let item = ItemRef {
            flags: self.flags,
            exptime: self.exptime,
            stored: self.stored,
            cas: self.cas,
            stale: self.stale,
            won: self.won,
            data: &self.data,
        };
        item.encode_as(out)
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let (header, data) = bytes.split_first_chunk::<ITEM_HEADER>()?;
        Some(Item::from_parts(header, data.to_vec()))
    }

    /// The header into a buffer on the stack and the data straight into its vector: every
    /// byte copied once, one allocation (the default would copy the whole item into a
    /// buffer of its own first, which past 256 bytes is an allocation too).
    fn decode_from(encoded: Encoded<'_>) -> Result<Option<Self>> {
        let Some((head, data)) = encoded.split_at(ITEM_HEADER) else {
            return Ok(None);
        };
        let mut header = [0u8; ITEM_HEADER];
        head.read(&mut header)?;
        Ok(Some(Item::from_parts(&header, data.to_vec()?)))
    }
}

impl Item {
    /// The item whose encoded header is `header` and whose data is `data`.
    fn from_parts(header: &[u8; ITEM_HEADER], data: Vec<u8>) -> Item {
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&header[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let cas = word(20);
        Item {
            flags: u32::from_le_bytes([header[0], header[1], header[2], header[3]]),
            exptime: word(4).cast_signed(),
            stored: word(12).cast_signed(),
            cas: cas & (CAS_LIMIT - 1),
            stale: cas & STALE_BIT != 0,
            won: cas & WON_BIT != 0,
            data,
        }
    }
}

/// An [`Item`] whose data is borrowed: what a write that does not read the item it replaces
/// stores, without copying the data into an item first.
struct ItemRef<'a> {
    flags: u32,
    exptime: i64,
    stored: i64,
    cas: u64,
    stale: bool,
    won: bool,
    data: &'a [u8],
}

impl EncodeAs<Item> for ItemRef<'_> {
    fn encode_as(&self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.exptime.to_le_bytes());
        out.extend_from_slice(&self.stored.to_le_bytes());
        // The marks share the cas word (format unchanged: an item stored before they
        // existed has neither).
        let mut word = self.cas & (CAS_LIMIT - 1);
        if self.stale {
            word |= STALE_BIT;
        }
        if self.won {
            word |= WON_BIT;
        }
        out.extend_from_slice(&word.to_le_bytes());
        out.extend_from_slice(self.data);
        Ok(())
    }
}

/// The bytes an item counts for in [`Store::bytes`].
fn size(key: &[u8], item: &Item) -> i64 {
    i64::try_from(key.len() + item.data.len()).unwrap_or(i64::MAX)
}

/// The bytes of the block an item takes in the heap (the lists [`Recency`] keeps are per
/// block size).
pub(crate) fn block(key: &[u8], item: &Item) -> u64 {
    block_size(HashMap::<Vec<u8>, Item>::entry_len(
        key.len(),
        ITEM_HEADER + item.data.len(),
    ))
}

/// What a change does to the recency lists.
#[derive(Debug, Clone, Copy)]
enum Recent {
    /// Nothing: the item did not change.
    Same,
    /// A new version, in a block of `size` bytes (`previous`: the replaced one's; `same`:
    /// the replaced one had the same cas unique, so it is that version rewritten).
    Used {
        size: u64,
        cas: u64,
        previous: Option<u64>,
        same: bool,
    },
    /// The item, in a block of this many bytes, was removed.
    Gone(u64),
}

/// How many times a write that finds the heap full evicts and tries again before it gives up
/// (a size no span is carved for may take several spans' worth of others; see
/// [`Store::evict`]).
const EVICTION_ROUNDS: u32 = 16;

/// One eviction frees at least this fraction of the heap's limit (in items of the size the
/// write needs): each eviction waits for the clock to give the freed blocks back, so it frees
/// room for the next writes too.
const EVICTION_SHARE: u64 = 256;

/// The most items one eviction removes.
const EVICTION_MAX_ITEMS: u64 = 4096;

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
        // The coarse clock: whole seconds are all an item's times hold, and it reads in a few
        // instructions where `SystemTime::now` and `duration_since` take about 300 (every
        // request reads the time). It lags the precise clock by at most a scheduler tick,
        // where memcached's own clock moves once a second.
        #[cfg(target_os = "linux")]
        let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse).tv_sec;
        #[cfg(not(target_os = "linux"))]
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        now
    }
}

/// Expiry times up to this many seconds are relative to now; larger ones are Unix times.
const RELATIVE_LIMIT: i64 = 60 * 60 * 24 * 30;

/// `exptime` as memcached reads it, made absolute at `now` (0 stays "never"; negative is
/// already past; up to 30 days is relative; more is a Unix time).
pub(crate) fn absolute(exptime: i64, now: i64) -> i64 {
    match exptime {
        0 => 0,
        e if e < 0 => now.saturating_sub(1).max(1),
        e if e <= RELATIVE_LIMIT => now.saturating_add(e),
        e => e,
    }
}

/// `item` after an `incr` (`incr`, wrapping at 2^64) or `decr` (stopping at 0) by `delta`,
/// stored at `now` as version `cas`, and its new value; `None` if its value is not a number
/// as memcached reads it (`strtoull`: white space before it, and anything after white space,
/// allowed; an empty value is no number). A result no longer than the value overwrites it,
/// padded with spaces to its length, as memcached does in place.
pub(crate) fn incremented(
    item: &Item,
    incr: bool,
    delta: u64,
    now: i64,
    cas: u64,
) -> Option<(Item, u64)> {
    let value = Some(&item.data[..])
        .filter(|data| !data.is_empty())
        .and_then(number::c_ulonglong)?;
    let new = if incr {
        value.wrapping_add(delta)
    } else {
        value.saturating_sub(delta)
    };
    let mut data = new.to_string().into_bytes();
    if data.len() < item.data.len() {
        data.resize(item.data.len(), b' ');
    }
    let item = Item {
        flags: item.flags,
        exptime: item.exptime,
        stored: now,
        cas,
        stale: item.stale,
        won: item.won,
        data,
    };
    Some((item, new))
}

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

/// How the map's index hashes keys: foldhash, seeded at random per store, which runs an
/// `mg` hit about 200 instructions fewer than the map's default `SipHash`. Neither stops a
/// client that can time its requests from finding colliding keys (foldhash says so of
/// itself), and the recency lists' tables hash the same keys with foldhash already, so
/// `SipHash` here bought no protection the server as a whole had.
type KeyHasher = foldhash::fast::RandomState;

/// The items of one cache, on one heap.
pub struct Store<C = SystemClock> {
    map: HashMap<Vec<u8>, Item, KeyHasher>,
    /// Key and data bytes of the items the map holds (expired ones until they are removed).
    bytes: AtomicI64,
    next_cas: AtomicU64,
    /// A delayed `flush_all`: from this time on, items stored before it are gone (0: none).
    flush_at: AtomicI64,
    /// Immediate `flush_all`s: items with a cas unique up to this are gone (0: none).
    flush_cas: AtomicU64,
    /// Serializes `flush_all`s, so the marker and the two fields above agree.
    flushing: Mutex<()>,
    /// The items' recency, for eviction (`None`: a full heap refuses writes).
    recency: Option<Recency>,
    /// One eviction at a time: writes that find the heap full meanwhile wait for it and then
    /// try again.
    evicting: Mutex<()>,
    /// Live items evicted since the store was opened.
    evictions: AtomicU64,
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
        // Every item's last store time, key, block size and cas unique: the recency order
        // after a restart is the order the items were last stored in.
        let ages = Mutex::new(Vec::new());
        let hasher = KeyHasher::default();
        let map = HashMap::open_with_hasher(heap, name, hasher, |key: &Vec<u8>, item: &Item| {
            // ORDERING: the scan's threads are joined before `open_with` returns.
            if key == FLUSH_KEY {
                *flush.lock().unwrap_or_else(PoisonError::into_inner) = (item.exptime, item.cas);
            } else {
                bytes.fetch_add(size(key, item), Ordering::Relaxed);
                let age = (item.stored, item.cas, key.clone(), block(key, item));
                ages.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(age);
            }
            // New items must get uniques above every stored one and above an immediate
            // flush's threshold, or the flush would hide them.
            max_cas.fetch_max(item.cas, Ordering::Relaxed);
        })?;
        let (flush_at, flush_cas) = flush.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut ages = ages.into_inner().unwrap_or_else(PoisonError::into_inner);
        // Oldest first; within a second, by cas unique (the order they were stored in).
        ages.sort_unstable_by_key(|&(stored, cas, _, _)| (stored, cas));
        let recency = Recency::rebuilt(
            ages.into_iter()
                .map(|(stored, cas, key, size)| (key, size, cas, stored)),
        );
        Ok(Store {
            map,
            bytes,
            next_cas: AtomicU64::new(max_cas.into_inner().saturating_add(1)),
            flush_at: AtomicI64::new(flush_at),
            flush_cas: AtomicU64::new(flush_cas),
            flushing: Mutex::new(()),
            recency: Some(recency),
            evicting: Mutex::new(()),
            evictions: AtomicU64::new(0),
            clock,
        })
    }

    /// The store without evictions: a write that finds the heap full fails with
    /// [`Error::OutOfSpace`] and changes nothing (memcached's `-M`).
    #[must_use]
    pub fn without_evictions(self) -> Self {
        Store {
            recency: None,
            ..self
        }
    }

    /// Whether a full heap evicts items (see [`without_evictions`](Self::without_evictions)).
    pub fn evicts(&self) -> bool {
        self.recency.is_some()
    }

    /// Live items evicted to make room since the store was opened (memcached's `evictions`).
    pub fn evictions(&self) -> u64 {
        // ORDERING: a statistic.
        self.evictions.load(Ordering::Relaxed)
    }

    /// Sets the [`evictions`](Self::evictions) count back to zero (`stats reset`).
    pub fn reset_evictions(&self) {
        // ORDERING: a statistic.
        self.evictions.store(0, Ordering::Relaxed);
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
    /// byte count and the recency lists in step with the change that took effect. When the
    /// heap is full, evicts (unless turned off) and tries again.
    fn change<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<Item>) -> (Change<Item>, R),
    ) -> Result<R> {
        self.with_room(|| self.change_once(key, &mut f))
    }

    /// Runs `attempt` (one write); when it finds the heap full, evicts (unless turned off)
    /// and runs it again.
    fn with_room<R>(&self, mut attempt: impl FnMut() -> Result<R>) -> Result<R> {
        let mut rounds = 0;
        loop {
            let result = attempt();
            let Err(Error::OutOfSpace { requested, .. }) = result else {
                return result;
            };
            // A delete's anti-block (`requested` 0) comes from the delete reserve, which no
            // eviction refills sooner.
            if requested == 0 || rounds == EVICTION_ROUNDS || !self.evict(requested)? {
                return result;
            }
            rounds += 1;
        }
    }

    /// One attempt of [`change`](Self::change).
    fn change_once<R>(
        &self,
        key: &[u8],
        f: &mut impl FnMut(Option<Item>) -> (Change<Item>, R),
    ) -> Result<R> {
        let (outcome, delta, recent) = self.map.compute(&key.to_vec(), |current| {
            let old_cas = current.as_ref().map(|item| item.cas);
            let old = current
                .as_ref()
                .map(|item| (size(key, item), block(key, item)));
            let old_size = old.map_or(0, |(bytes, _)| bytes);
            let previous = old.map(|(_, block)| block);
            let (change, outcome) = f(current);
            let (delta, recent) = match &change {
                Change::Keep => (0, Recent::Same),
                Change::Set(new) => (
                    size(key, new) - old_size,
                    Recent::Used {
                        size: block(key, new),
                        cas: new.cas,
                        previous,
                        same: old_cas == Some(new.cas),
                    },
                ),
                Change::Remove => (-old_size, previous.map_or(Recent::Same, Recent::Gone)),
            };
            (change, (outcome, delta, recent))
        })?;
        self.settle(key, delta, recent, self.clock.now());
        Ok(outcome)
    }

    /// Brings the byte count (by `delta`) and the recency lists (`recent`, at `now`) in step
    /// with a write to `key` that took effect.
    fn settle(&self, key: &[u8], delta: i64, recent: Recent, now: i64) {
        // ORDERING: a statistic.
        self.bytes.fetch_add(delta, Ordering::Relaxed);
        let Some(recency) = &self.recency else {
            return;
        };
        match recent {
            Recent::Used {
                size,
                cas,
                previous,
                same: true,
            } => recency.rewritten(key, size, cas, previous, now),
            Recent::Used {
                size,
                cas,
                previous,
                same: false,
            } => recency.used(key, size, cas, previous, now),
            Recent::Gone(size) => recency.forget(key, size),
            Recent::Same => {}
        }
    }

    /// Makes room for a payload of `requested` bytes by removing the least recently used
    /// items of its block size: at least one, and enough for a share of the heap (see
    /// [`EVICTION_SHARE`]). When no item has that block size (a size first written after
    /// the heap filled, whose blocks no span is carved for), it removes a span's worth of the
    /// items of the block size whose least recently used item is the oldest of all, as
    /// memcached moves a page between slab classes: the oldest items of a size were mostly
    /// written together, into the same spans, and a span whose blocks are all free serves any
    /// size again. Returns whether it removed any item (dead ones count: they free room too,
    /// but not as evictions); `false` when evictions are off or the store holds nothing it
    /// could remove.
    fn evict(&self, requested: u64) -> Result<bool> {
        let Some(recency) = &self.recency else {
            return Ok(false);
        };
        let _one = self.evicting.lock().unwrap_or_else(PoisonError::into_inner);
        let needed = block_size(requested);
        let limit = self.heap().max_size();
        let share = (limit / EVICTION_SHARE / needed.max(1)).clamp(1, EVICTION_MAX_ITEMS);
        let mut size = needed;
        let mut count = share;
        loop {
            let victims = recency.oldest(size, usize::try_from(count).unwrap_or(1));
            if victims.is_empty() {
                if size != needed {
                    return Ok(false);
                }
                let Some(other) = recency.oldest_size(needed) else {
                    return Ok(false);
                };
                size = other;
                count = (SPAN_SIZE / other).max(1);
                continue;
            }
            // Entries the lists kept of items already gone remove nothing: take more.
            if self.remove_victims(victims)? {
                return Ok(true);
            }
        }
    }

    /// Removes each of `victims` (key and the cas unique the recency lists saw) that still
    /// holds that version; returns whether it removed any.
    fn remove_victims(&self, victims: Vec<(Box<[u8]>, u64)>) -> Result<bool> {
        let mut removed = false;
        for (key, cas) in victims {
            let now = self.clock.now();
            let outcome = self.change_once(&key, &mut |current| match current {
                // Only the version the lists saw: a newer one was just stored.
                Some(item) if item.cas == cas => {
                    let evicted = if self.live(&item, now) {
                        Outcome::Deleted
                    } else {
                        Outcome::NotFound
                    };
                    (Change::Remove, evicted)
                }
                _ => (Change::Keep, Outcome::NotStored),
            });
            match outcome {
                Ok(Outcome::Deleted) => {
                    // ORDERING: a statistic.
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    removed = true;
                }
                Ok(Outcome::NotFound) => removed = true,
                Ok(_) => {}
                // The delete reserve ran out: what was removed so far frees room.
                Err(Error::OutOfSpace { .. }) if removed => break,
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// A new cas unique.
    pub(crate) fn cas(&self) -> u64 {
        // ORDERING: only uniqueness matters; the map orders the items themselves. Below
        // `CAS_LIMIT` for 146 years at a billion writes a second.
        self.next_cas.fetch_add(1, Ordering::Relaxed) & (CAS_LIMIT - 1)
    }

    /// The store's current time, in Unix seconds.
    pub(crate) fn now(&self) -> i64 {
        self.clock.now()
    }

    /// Runs `f` on `key`'s live item (`None` if absent, expired or flushed) and the current
    /// time in one [`HashMap::compute`], as the storage commands do (with eviction when the
    /// heap is full). A dead item `f` keeps is removed.
    ///
    /// # Errors
    ///
    /// A heap error.
    pub(crate) fn update<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<Item>, i64) -> (Change<Item>, R),
    ) -> Result<R> {
        let now = self.clock.now();
        self.change(key, |current| {
            let dead = current.as_ref().is_some_and(|item| !self.live(item, now));
            let (change, result) = f(current.filter(|_| !dead), now);
            match change {
                Change::Keep if dead => (Change::Remove, result),
                change => (change, result),
            }
        })
    }

    /// Whether `key`'s item (`item`) was read since it was stored, and when it was last
    /// used, in Unix seconds (its store time if the recency lists do not know it).
    pub(crate) fn access(&self, key: &[u8], item: &Item) -> (bool, i64) {
        self.recency
            .as_ref()
            .and_then(|recency| recency.access(key, block(key, item)))
            .unwrap_or((false, item.stored))
    }

    /// Records a read of `key`'s item (`item`): it becomes the most recently used.
    pub(crate) fn bump(&self, key: &[u8], item: &Item) {
        if let Some(recency) = &self.recency {
            recency.read(key, block(key, item), self.clock.now());
        }
    }

    /// [`lookup`](Self::lookup) without the bump of a hit (meta get's `u`, `h` and `l`).
    ///
    /// # Errors
    ///
    /// A heap error.
    pub(crate) fn lookup_quietly(&self, key: &[u8]) -> Result<Lookup<Item>> {
        self.lookup_with(key, false)
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
        self.lookup_with(key, true)
    }

    fn lookup_with(&self, key: &[u8], bump: bool) -> Result<Lookup<Item>> {
        let now = self.clock.now();
        let Some(item) = self.map.get(key)? else {
            return Ok(Lookup::Miss);
        };
        let Some(dead) = self.why_dead(&item, now) else {
            if bump {
                self.bump(key, &item);
            }
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
        if mode == StoreMode::Set {
            return self.set(key, flags, exptime, data).map(|_| Outcome::Stored);
        }
        let now = self.clock.now();
        let fresh = |data, flags, exptime| Item::fresh(flags, exptime, now, self.cas(), data);
        let exptime = absolute(exptime, now);
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

    /// `set` (and meta set's default mode): stores `data` under `key` whatever it held, and
    /// returns the new item's cas unique. It does not read the item it replaces: the map
    /// reports the replaced entry's length, all that the byte count and the recency lists
    /// need.
    ///
    /// # Errors
    ///
    /// A heap error (`OutOfSpace` when the heap is full; nothing changed).
    pub fn set(&self, key: &[u8], flags: u32, exptime: i64, data: &[u8]) -> Result<u64> {
        let now = self.clock.now();
        let exptime = absolute(exptime, now);
        let (cas, replaced) = self.with_room(|| {
            let item = ItemRef {
                flags,
                exptime,
                stored: now,
                cas: self.cas(),
                stale: false,
                won: false,
                data,
            };
            let replaced = self.map.put_ref_len(key.to_vec(), &item)?;
            Ok((item.cas, replaced))
        })?;
        // The replaced item counted its entry's length less what every entry holds besides
        // its key and data.
        let fixed = HashMap::<Vec<u8>, Item>::entry_len(0, ITEM_HEADER);
        let old_size = replaced.map_or(0, |len| {
            i64::try_from(len.saturating_sub(fixed)).unwrap_or(i64::MAX)
        });
        let new_size = i64::try_from(key.len() + data.len()).unwrap_or(i64::MAX);
        let entry = HashMap::<Vec<u8>, Item>::entry_len(key.len(), ITEM_HEADER + data.len());
        let recent = Recent::Used {
            size: block_size(entry),
            cas,
            previous: replaced.map(block_size),
            // A new cas unique: a new version.
            same: false,
        };
        self.settle(key, new_size - old_size, recent, now);
        Ok(cas)
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
            let Some((item, new)) = incremented(&item, incr, delta, now, self.cas()) else {
                return (Change::Keep, Outcome::NonNumeric);
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
        let exptime = absolute(exptime, now);
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
        let exptime = absolute(exptime, now);
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
            Some(d) => (absolute(d, now), self.flush_cas.load(Ordering::Acquire)),
        };
        let marker = Item::fresh(0, at, now, cas, Vec::new());
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
    use montage_core::sim::{SimMode, SplitMix64};
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
    fn a_set_over_an_item_counts_its_bytes_and_moves_it_to_its_new_size() {
        let heap = Heap::create(&HeapConfig::simulated(4 << 20, SimMode::Prefix)).unwrap();
        let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
        let small = store.set(b"k", 1, 0, b"v").unwrap();
        assert_eq!(store.bytes(), 2);
        let large = vec![b'x'; 500];
        let cas = store.set(b"k", 2, 0, &large).unwrap();
        assert!(cas > small);
        assert_eq!(store.bytes(), 501);
        let item = store.get(b"k").unwrap().unwrap();
        assert_eq!((item.flags, item.cas, item.data), (2, cas, large.clone()));
        let recency = store.recency.as_ref().unwrap();
        assert_eq!(recency.len(), 1);
        // Known under the new block size only.
        let small_block = block_size(HashMap::<Vec<u8>, Item>::entry_len(1, ITEM_HEADER + 1));
        let large_block = block(b"k", &store.get(b"k").unwrap().unwrap());
        assert_ne!(small_block, large_block);
        assert!(recency.oldest(small_block, 10).is_empty());
        assert_eq!(
            recency.oldest(large_block, 10),
            vec![(Box::from(&b"k"[..]), cas)]
        );
        // After a delete, a set stores anew.
        assert_eq!(store.delete(b"k").unwrap(), Outcome::Deleted);
        assert_eq!(store.bytes(), 0);
        store.set(b"k", 3, 0, b"again").unwrap();
        assert_eq!(store.bytes(), 6);
        assert_eq!(store.get(b"k").unwrap().unwrap().data, b"again");
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

    /// A heap of 1 MiB: a few thousand items of a few hundred bytes fill it.
    fn small_heap(mode: SimMode) -> Heap {
        Heap::create(&HeapConfig::simulated(1 << 20, mode)).unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("key{i}").into_bytes()
    }

    #[test]
    fn a_full_heap_evicts_the_least_recently_used_items_of_the_size_needed() {
        let heap = small_heap(SimMode::Prefix);
        let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
        let value = [7u8; 200];
        // Items of another size, never read: none of them goes, as no write needs their
        // block size.
        for i in 0..50 {
            set(&store, StoreMode::Set, &key(1_000_000 + i), &[1; 600]);
        }
        set(&store, StoreMode::Set, b"hot", &value);
        let writes = 20_000;
        for i in 0..writes {
            assert_eq!(
                set(&store, StoreMode::Set, &key(i), &value),
                Outcome::Stored
            );
            if i % 50 == 0 {
                assert!(store.get(b"hot").unwrap().is_some(), "hot key gone at {i}");
            }
        }
        let evictions = store.evictions();
        assert!(evictions > writes / 2, "{evictions} evictions");
        store.reset_evictions();
        assert_eq!(store.evictions(), 0);
        // The newest items are all there, the oldest all gone.
        let held = u64::try_from(store.len()).unwrap() - 51;
        for i in writes - held / 2..writes {
            assert!(store.get(&key(i)).unwrap().is_some(), "recent {i} evicted");
        }
        for i in 0..writes / 2 {
            assert!(store.get(&key(i)).unwrap().is_none(), "old {i} kept");
        }
        for i in 0..50 {
            assert!(store.get(&key(1_000_000 + i)).unwrap().is_some());
        }
        // Every write is held or was evicted; the byte count agrees with what is held.
        assert_eq!(held + evictions, writes);
        let bytes: usize = contents(&store)
            .iter()
            .map(|(key, data)| key.len() + data.len())
            .sum();
        assert_eq!(store.bytes(), u64::try_from(bytes).unwrap());
    }

    #[test]
    fn without_evictions_a_full_heap_refuses_writes_and_keeps_every_item() {
        let heap = small_heap(SimMode::Prefix);
        let store = Store::open(&heap, "cache", clock_at(1000))
            .unwrap()
            .without_evictions();
        let value = [7u8; 200];
        let mut stored = 0;
        let refused = loop {
            match store.store(StoreMode::Set, &key(stored), 0, 0, &value, None) {
                Ok(outcome) => assert_eq!(outcome, Outcome::Stored),
                Err(e) => break e,
            }
            stored += 1;
        };
        assert!(matches!(refused, Error::OutOfSpace { .. }), "{refused}");
        assert_eq!(store.evictions(), 0);
        assert_eq!(u64::try_from(store.len()).unwrap(), stored);
        for i in 0..stored {
            assert_eq!(store.get(&key(i)).unwrap().unwrap().data, value);
        }
    }

    #[test]
    fn a_reopened_store_evicts_in_the_order_items_were_last_stored() {
        let heap = small_heap(SimMode::Prefix);
        let clock = clock_at(1000);
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        let value = [7u8; 200];
        let mut i = 0;
        // Fill the heap until the first eviction, a second apart every 100 items.
        while store.evictions() == 0 {
            set(&store, StoreMode::Set, &key(i), &value);
            i += 1;
            if i % 100 == 0 {
                clock.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Store the oldest surviving items again: they become the newest.
        let first = (0..i)
            .find(|&k| store.get(&key(k)).unwrap().is_some())
            .unwrap();
        for k in first..first + 100 {
            clock.0.fetch_add(1, Ordering::Relaxed);
            set(&store, StoreMode::Set, &key(k), &value);
        }
        drop(store);
        heap.sync().unwrap();
        let image = heap.simulator().unwrap().crash(1);
        drop(heap);
        let heap =
            Heap::open_image(image, &HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let store = Store::open(&heap, "cache", clock.clone()).unwrap();
        let before = store.evictions();
        let mut j = 0;
        while store.evictions() < before + 200 {
            set(&store, StoreMode::Set, &key(1_000_000 + j), &value);
            j += 1;
        }
        for k in first..first + 100 {
            assert!(
                store.get(&key(k)).unwrap().is_some(),
                "restored {k} evicted"
            );
        }
        assert!(store.get(&key(first + 100)).unwrap().is_none());
    }

    /// Every item the store holds: key to value.
    fn contents<C: Clock>(store: &Store<C>) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
        store
            .map
            .iter()
            .map(Result::unwrap)
            .filter(|(key, _)| key != FLUSH_KEY)
            .map(|(key, item)| (key, item.data))
            .collect()
    }

    /// Threads write and read their own keys while others' writes evict: a read sees the
    /// version its thread wrote last or nothing (evicted), never an older one; no write
    /// fails; the counts agree with the items held at the end.
    #[test]
    fn concurrent_writes_evict_without_losing_order_or_count() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
        let threads = 4u64;
        let keys_each = 1500u64;
        std::thread::scope(|scope| {
            for t in 0..threads {
                let store = &store;
                scope.spawn(move || {
                    let mut rng = SplitMix64::new(t);
                    let mut last = vec![None; usize::try_from(keys_each).unwrap()];
                    for n in 0..6000u64 {
                        let k = rng.below_or_equal(keys_each - 1);
                        let name = key(t * keys_each + k);
                        let slot = usize::try_from(k).unwrap();
                        if rng.below_or_equal(2) == 0 {
                            let got = store.get(&name).unwrap().map(|item| item.data);
                            assert!(got.is_none() || got == last[slot], "{got:?}");
                        } else {
                            let mut value = format!("{t}:{n}").into_bytes();
                            value.resize(200, b'.');
                            assert_eq!(set(store, StoreMode::Set, &name, &value), Outcome::Stored);
                            last[slot] = Some(value);
                        }
                    }
                });
            }
        });
        assert!(store.evictions() > 0);
        let items = contents(&store);
        assert_eq!(store.len(), items.len());
        let bytes: usize = items.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(store.bytes(), u64::try_from(bytes).unwrap());
        // The lists know exactly the items held.
        assert_eq!(store.recency.as_ref().unwrap().len(), items.len());
    }

    type Items = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

    /// Whether `recovered` is what a crash may leave while a write of `key` took `before` to
    /// `after`: either, or `before` less some of the items the write evicted (each eviction
    /// is an operation of its own, ahead of the write's).
    fn during(before: &Items, after: &Items, key: &[u8], recovered: &Items) -> bool {
        recovered == after
            || (recovered.iter().all(|(k, v)| before.get(k) == Some(v))
                && before
                    .keys()
                    .filter(|k| !recovered.contains_key(*k))
                    .all(|k| k == key || !after.contains_key(k)))
    }

    /// Writes with evictions, syncs now and then, and crashes at a random point: the
    /// recovered items are exactly what some prefix of the writes and the evictions they
    /// made left, at least up to the last sync that returned before the crash. So an
    /// eviction never takes an item it did not choose, and is as durable as a delete.
    #[test]
    fn a_crash_among_evictions_recovers_a_prefix_of_the_writes() {
        montage_testkit::for_each_seed("montage-kv evictions", 6, |seed| {
            let mode = montage_testkit::crash_mode(seed);
            let heap = small_heap(mode);
            let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
            let mut rng = SplitMix64::new(seed);
            let mut written = 0u64;
            let mut write = |rng: &mut SplitMix64| {
                let k = rng.below_or_equal(4999);
                let written_key = key(k);
                // Two block sizes, so that a write evicts only its own size.
                let len = if rng.below_or_equal(3) == 0 { 600 } else { 200 };
                let mut value = format!("{written}:").into_bytes();
                value.resize(len, b'.');
                written += 1;
                store
                    .store(StoreMode::Set, &written_key, 0, 0, &value, None)
                    .unwrap();
                written_key
            };
            while store.evictions() < 300 {
                write(&mut rng);
            }
            heap.sync().unwrap();
            let sim = heap.simulator().unwrap();
            let step = sim.events() + rng.below_or_equal(40_000);
            sim.crash_at(step);
            let mut states = vec![contents(&store)];
            let mut keys = Vec::new();
            // (index of the state it covers, event count when it returned)
            let mut syncs = Vec::new();
            for _ in 0..40 {
                keys.push(write(&mut rng));
                states.push(contents(&store));
                if rng.below_or_equal(9) == 0 {
                    heap.sync().unwrap();
                    syncs.push((states.len() - 1, sim.events()));
                }
            }
            let evictions = store.evictions();
            drop(store);
            let image = sim.crash(seed);
            drop(heap);
            let heap = Heap::open_image(image, &HeapConfig::simulated(1 << 20, mode)).unwrap();
            let store = Store::open(&heap, "cache", clock_at(1000)).unwrap();
            let recovered = contents(&store);
            // The writes the recovered items include all of.
            let prefix = states
                .iter()
                .position(|state| *state == recovered)
                .or_else(|| {
                    (0..keys.len())
                        .find(|&i| during(&states[i], &states[i + 1], &keys[i], &recovered))
                })
                .unwrap_or_else(|| {
                    let diff = |state: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>| {
                        let keys: std::collections::BTreeSet<&Vec<u8>> =
                            state.keys().chain(recovered.keys()).collect();
                        keys.into_iter()
                            .filter(|k| state.get(*k) != recovered.get(*k))
                            .map(|k| {
                                let short = |v: Option<&Vec<u8>>| {
                                    v.map(|v| String::from_utf8_lossy(&v[..8]).into_owned())
                                };
                                (
                                    String::from_utf8_lossy(k).into_owned(),
                                    short(state.get(k)),
                                    short(recovered.get(k)),
                                )
                            })
                            .collect::<Vec<_>>()
                    };
                    panic!(
                        "seed {seed}: the recovered items are no prefix; against the first \
                         state: {:?}; against the last: {:?}",
                        diff(&states[0]),
                        diff(&states[states.len() - 1])
                    )
                });
            for &(covers, returned_at) in &syncs {
                assert!(
                    returned_at > step || prefix >= covers,
                    "seed {seed}: a sync returned at event {returned_at} before the crash at \
                     {step}, but the recovered items are those of write {prefix} < {covers}"
                );
            }
            assert!(evictions > 300);
            // The recovered store counts its items and evicts again.
            assert_eq!(store.len(), recovered.len());
            let bytes: usize = recovered.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert_eq!(store.bytes(), u64::try_from(bytes).unwrap());
            let mut rng = SplitMix64::new(!seed);
            let mut written = 0u64;
            while store.evictions() < 50 {
                let mut value = format!("{written}").into_bytes();
                value.resize(200, b'.');
                written += 1;
                let k = 10_000 + rng.below_or_equal(4999);
                store
                    .store(StoreMode::Set, &key(k), 0, 0, &value, None)
                    .unwrap();
            }
        });
    }

    #[test]
    fn items_round_trip_and_short_bytes_do_not_decode() {
        for (stale, won) in [(false, false), (true, false), (false, true), (true, true)] {
            let item = Item {
                flags: 9,
                exptime: -5,
                stored: 77,
                cas: CAS_LIMIT - 1,
                stale,
                won,
                data: b"data".to_vec(),
            };
            let mut bytes = Vec::new();
            item.encode(&mut bytes).unwrap();
            assert_eq!(Item::decode(&bytes), Some(item.clone()));
            assert_eq!(Item::decode(&bytes[..ITEM_HEADER - 1]), None);
            // From where a structure found the bytes, as from a slice.
            let found = Item::decode_from(Encoded::from_bytes(&bytes)).unwrap();
            assert_eq!(found, Some(item));
            let short = Encoded::from_bytes(&bytes[..ITEM_HEADER - 1]);
            assert_eq!(Item::decode_from(short).unwrap(), None);
        }
        // An item written before the marks existed: its cas word is the unique alone.
        let mut old = Vec::new();
        old.extend_from_slice(&3u32.to_le_bytes());
        old.extend_from_slice(&0i64.to_le_bytes());
        old.extend_from_slice(&5i64.to_le_bytes());
        old.extend_from_slice(&42u64.to_le_bytes());
        old.extend_from_slice(b"v");
        let item = Item::decode(&old).unwrap();
        assert_eq!((item.cas, item.stale, item.won), (42, false, false));
    }
}
