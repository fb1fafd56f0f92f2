//! [`VerifiedBucket`]: a bucket of a nonblocking hash map: one entry kept in the bucket
//! itself, a key word beside a value word, in front of a [`VerifiedList`] for the rest.
//!
//! A lookup in a bare list follows the head to a node: a cache miss the bucket's own line
//! does not pay for. Keys that fit a word ([`BucketKey::key_word`]: the integers) can sit in the
//! bucket instead, so that a bucket holding one such key (most of them, in a table with
//! about as many buckets as keys) answers from its own line.
//!
//! # The inline entry (INV-BUCKET-1)
//!
//! The key word starts empty and is claimed once, by a compare-and-swap, by the first
//! insertion of a key with a word into the bucket; it never changes again (so no reader
//! ever needs a node's lifetime to read it). The value word moves through the list's
//! states (live, removed in an epoch), starting as removed in epoch 0, which every
//! operation sees as absent; inserting into it, replacing it and removing it are
//! epoch-verified swaps exactly as on a list node's value word (INV-LIST-1, INV-CAS-1). A
//! removed inline value stays removed until the key is inserted again: no purge is needed,
//! since nothing is ever unlinked.
//!
//! Where a key lives: a key whose word the inline key word holds lives inline, and only
//! there; every other key (keys with no word, the one whose word is the empty marker, and
//! keys that found the inline entry claimed by another) lives in the list. A key with a
//! word enters the list only after its inserter read the key word claimed by another key,
//! so a reader that finds the key word still empty knows that, at that read, the bucket
//! held no such key anywhere: it answers "absent" without searching the list. (Every access
//! to the key word and the list's words is sequentially consistent: the reader's load of
//! the empty word precedes the claim in that single order, which precedes any insertion
//! into the list by a thread that read the claim.)

use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
use crate::primitive::{AtomicU64, Ordering};
use crate::verified::Peek;
use crate::verified::atomic::{Clock, VerifiedAtomic};
use crate::verified::list::{REMOVED, VerifiedList, live, peek_word, swap_live, swap_word};

/// A key a [`VerifiedBucket`] can hold: ordered for its list, and, where its values fit
/// one, with a word to keep inline. Every [`Codec`](crate::Codec) key has it, through the
/// codec's [`key_word`](crate::Codec::key_word) (the integers have words, other types
/// none); a key type without a codec can implement it itself.
pub trait BucketKey: Ord + Clone + Send + Sync + 'static {
    /// The key as one word, if it has one. It must be injective and agree with equality
    /// (two keys have the same word exactly when they are equal).
    fn key_word(&self) -> Option<u64>;

    /// The key whose [`key_word`](Self::key_word) is `word`, if any.
    fn from_key_word(word: u64) -> Option<Self>;
}

/// The key word of an inline entry no key has claimed. A key whose word this is lives in
/// the list.
const EMPTY: u64 = u64::MAX;

/// Where a key lives in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the inline entry.
    Inline,
    /// In the list.
    List,
    /// Nowhere: the inline key word was still empty (module docs).
    Absent,
}

/// A bucket of a nonblocking map from keys to value words: one inline entry, then a
/// [`VerifiedList`] (module docs). Its methods are the list's.
pub struct VerifiedBucket<K> {
    /// The inline entry's key word: [`EMPTY`] until claimed, then that key's word for good.
    key: AtomicU64,
    /// The inline entry's value word (list value states).
    value: VerifiedAtomic<u64>,
    list: VerifiedList<K>,
}

impl<K> std::fmt::Debug for VerifiedBucket<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedBucket").finish_non_exhaustive()
    }
}

impl<K> Default for VerifiedBucket<K> {
    fn default() -> Self {
        VerifiedBucket {
            key: AtomicU64::new(EMPTY),
            value: VerifiedAtomic::new(REMOVED),
            list: VerifiedList::default(),
        }
    }
}

impl<K: BucketKey> VerifiedBucket<K> {
    /// An empty bucket.
    pub fn new() -> VerifiedBucket<K> {
        VerifiedBucket::default()
    }

    /// Asks the CPU for the bucket's lines (see [`VerifiedList::prefetch`]): a bucket is
    /// three words and may straddle two lines.
    #[inline]
    pub fn prefetch(&self) {
        crate::persist::prefetch_for_read(&self.key);
        self.list.prefetch();
    }

    /// Where `key` lives; an insertion (`claim`) claims the inline entry for it if no key
    /// has.
    #[inline]
    fn place(&self, key: &K, claim: bool) -> Place {
        let Some(word) = key.key_word().filter(|&word| word != EMPTY) else {
            return Place::List;
        };
        // ORDERING: SeqCst, as every access to the list's words: the module docs' argument
        // for `Absent` needs one total order of this load, the claim and the list's swaps.
        let mut found = self.key.load(Ordering::SeqCst);
        if found == EMPTY && claim {
            // ORDERING: as above.
            found = match self
                .key
                .compare_exchange(EMPTY, word, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => word,
                Err(other) => other,
            };
        }
        if found == word {
            Place::Inline
        } else if found == EMPTY {
            Place::Absent
        } else {
            Place::List
        }
    }

    /// The value of `key`, or `None`.
    ///
    /// # Errors
    ///
    /// As [`VerifiedList::get`].
    pub fn get(&self, op: &OpGuard<'_>, key: &K) -> Result<Option<u64>> {
        match self.place(key, false) {
            Place::Inline => live(op, self.value.load_in(Clock::of(op))),
            Place::List => self.list.get(op, key),
            Place::Absent => Ok(None),
        }
    }

    /// The value of `key` as [`get`](Self::get) finds it, for a reader outside any
    /// operation, or [`Peek::Undecided`] when it cannot tell without one (see
    /// [`VerifiedList::peek`], which it is for a key in the list). An inline value is read
    /// as the list reads a node's: a live value is the key's at that load, a removed one
    /// says it was absent then.
    #[inline]
    pub fn peek(&self, key: &K) -> Peek<u64> {
        self.peek_with(key, |value, _| Some(value))
    }

    /// [`peek`](Self::peek), and what `read` makes of a live value, with a second load of
    /// the same value word (as [`VerifiedList::peek_with`]; the inline entry's key word never
    /// changes once claimed, so its value word is the key's for good).
    #[inline]
    pub fn peek_with<T>(
        &self,
        key: &K,
        read: impl FnOnce(u64, &dyn Fn() -> bool) -> Option<T>,
    ) -> Peek<T> {
        match self.place(key, false) {
            Place::Inline => peek_word(&self.value, read),
            Place::List => self.list.peek_with(key, read),
            Place::Absent => Peek::Absent,
        }
    }

    /// Sets `key` to `value` if it is absent; otherwise returns its value.
    ///
    /// # Errors
    ///
    /// As [`VerifiedList::insert`].
    ///
    /// # Panics
    ///
    /// If `value > MAX_LIST_VALUE`.
    pub fn insert(&self, op: &OpGuard<'_>, key: &K, value: u64) -> Result<Result<(), u64>> {
        assert!(value <= super::MAX_LIST_VALUE, "list values are below 2^61");
        if self.place(key, true) != Place::Inline {
            return self.list.insert(op, key, value);
        }
        loop {
            let found = self.value.load_in(Clock::of(op));
            if let Some(v) = live(op, found)? {
                return Ok(Err(v));
            }
            if swap_word(&self.value, op, found, value)?.is_ok() {
                return Ok(Ok(()));
            }
        }
    }

    /// Replaces `key`'s value `current` with `new`; otherwise returns the value found
    /// (`None` if the key is absent).
    ///
    /// # Errors
    ///
    /// As [`VerifiedList::replace`].
    ///
    /// # Panics
    ///
    /// If `new > MAX_LIST_VALUE`.
    pub fn replace(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        current: u64,
        new: u64,
    ) -> Result<Result<(), Option<u64>>> {
        assert!(new <= super::MAX_LIST_VALUE, "list values are below 2^61");
        match self.place(key, false) {
            Place::Inline => swap_live(&self.value, op, current, new),
            Place::List => self.list.replace(op, key, current, new),
            Place::Absent => Ok(Err(None)),
        }
    }

    /// Removes `key` if its value is `current`; otherwise returns the value found (`None` if
    /// the key is absent).
    ///
    /// # Errors
    ///
    /// As [`VerifiedList::remove`].
    pub fn remove(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        current: u64,
    ) -> Result<Result<(), Option<u64>>> {
        match self.place(key, false) {
            Place::Inline => swap_live(&self.value, op, current, REMOVED | op.epoch().get()),
            Place::List => self.list.remove(op, key, current),
            Place::Absent => Ok(Err(None)),
        }
    }

    /// Every live key and value: the inline entry's first, then the list's in key order.
    ///
    /// # Errors
    ///
    /// As [`VerifiedList::entries`].
    pub fn entries(&self, op: &OpGuard<'_>) -> Result<Vec<(K, u64)>> {
        let mut out = Vec::new();
        // ORDERING: as in `place`.
        let word = self.key.load(Ordering::SeqCst);
        if word != EMPTY
            && let Some(v) = live(op, self.value.load_in(Clock::of(op)))?
        {
            // A claimed word came from `key_word` of a key, which `from_key_word` must give
            // back (the codec's contract).
            let key = K::from_key_word(word).ok_or_else(|| Error::Encode {
                type_name: std::any::type_name::<K>(),
                why: format!("its `BucketKey::from_key_word` gives no key for {word:#x}"),
            })?;
            out.push((key, v));
        }
        out.extend(self.list.entries(op)?);
        Ok(out)
    }
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use super::*;
    use crate::config::SimMode;
    use crate::{Heap, HeapConfig};

    fn heap() -> Heap {
        Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap()
    }

    #[test]
    fn the_first_key_with_a_word_lives_inline_and_the_rest_in_the_list() {
        let heap = heap();
        let bucket = VerifiedBucket::<u64>::new();
        heap.run_op(|op| {
            assert_eq!(bucket.get(op, &7)?, None);
            assert_eq!(bucket.remove(op, &7, 1)?, Err(None));
            assert_eq!(bucket.replace(op, &7, 1, 2)?, Err(None));
            assert_eq!(
                bucket.place(&7, false),
                Place::Absent,
                "nothing claimed yet"
            );
            assert_eq!(bucket.insert(op, &7, 70)?, Ok(()));
            assert_eq!(bucket.place(&7, false), Place::Inline);
            // The empty marker's key, and any other key, go to the list.
            for k in [u64::MAX, 3, 9] {
                assert_eq!(bucket.insert(op, &k, k % 100)?, Ok(()));
                assert_eq!(bucket.place(&k, false), Place::List);
            }
            assert_eq!(bucket.insert(op, &7, 71)?, Err(70));
            assert_eq!(bucket.replace(op, &7, 70, 72)?, Ok(()));
            assert_eq!(bucket.get(op, &7)?, Some(72));
            assert_eq!(bucket.remove(op, &7, 70)?, Err(Some(72)));
            assert_eq!(bucket.remove(op, &7, 72)?, Ok(()));
            assert_eq!(bucket.get(op, &7)?, None);
            assert_eq!(bucket.replace(op, &7, 72, 1)?, Err(None));
            assert_eq!(bucket.entries(op)?, vec![(3, 3), (9, 9), (u64::MAX, 15)]);
            // Revived in place: the key keeps the inline entry.
            assert_eq!(bucket.insert(op, &7, 73)?, Ok(()));
            assert_eq!(
                bucket.entries(op)?,
                vec![(7, 73), (3, 3), (9, 9), (u64::MAX, 15)]
            );
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn an_older_operation_that_finds_an_inline_key_removed_later_aborts() {
        let heap = heap();
        let bucket = VerifiedBucket::<i32>::new();
        heap.run_op(|op| bucket.insert(op, &-5, 50).map(|_| ()))
            .unwrap();
        let old = heap.begin_op().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                heap.advance_epoch().unwrap();
                heap.run_op(|op| bucket.remove(op, &-5, 50).map(|_| ()))
                    .unwrap();
            });
        });
        assert!(matches!(bucket.get(&old, &-5), Err(Error::Aborted)));
        assert!(matches!(bucket.insert(&old, &-5, 1), Err(Error::Aborted)));
        drop(old);
        heap.run_op(|op| {
            assert_eq!(bucket.get(op, &-5)?, None);
            assert_eq!(bucket.insert(op, &-5, 51)?, Ok(()));
            assert_eq!(bucket.entries(op)?, vec![(-5, 51)]);
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn keys_without_a_word_use_only_the_list() {
        let heap = heap();
        let bucket = VerifiedBucket::<String>::new();
        heap.run_op(|op| {
            assert_eq!(bucket.insert(op, &"b".to_owned(), 2)?, Ok(()));
            assert_eq!(bucket.insert(op, &"a".to_owned(), 1)?, Ok(()));
            assert_eq!(bucket.get(op, &"a".to_owned())?, Some(1));
            Ok(())
        })
        .unwrap();
        // ORDERING: a single-threaded test.
        assert_eq!(bucket.key.load(Ordering::SeqCst), EMPTY);
        let entries = heap.run_op(|op| bucket.entries(op)).unwrap();
        assert_eq!(entries, vec![("a".to_owned(), 1), ("b".to_owned(), 2)]);
    }
}
