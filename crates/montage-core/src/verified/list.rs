//! [`VerifiedList`]: a lock-free sorted list of keys, each with a value word, whose every
//! change that a structure's state depends on is an epoch-verified swap. It is the bucket
//! of montage-collections' nonblocking hash map; the values are payload handles.
//!
//! The list is Harris's, with Michael's traversal (2002): a node is unlinked only after
//! its `next` link is marked, and traversals unlink marked nodes they pass. On top of it
//! each node's value word moves through these states (INV-LIST-1):
//!
//! ```text
//! live(v) --remove in e--> removed(e) --insert--> live(w)
//!                          removed(e) --purge, once the clock is >= e + 2--> dead
//! ```
//!
//! Insertions of a new key (linking a node), and every change of a value word, are
//! epoch-verified swaps, so each linearizes while the clock still reads its operation's
//! epoch. A removed node keeps the epoch of its removal, and an operation older than it
//! that finds the key absent aborts (as every structure must, INV-COL-1); only when no
//! operation of an older epoch can run any more (the clock is two past it) does a
//! traversal turn it dead, mark its link and unlink it. Dead is final: a node is never
//! revived after a traversal may have begun to unlink it.
//!
//! Nodes are freed through crossbeam-epoch (leaked under loom) by the thread whose swap
//! unlinked them.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
use crate::verified::Peek;
use crate::verified::atomic::{
    CasErrorKind, Clock, Raw, VerifiedAtomic, Word, free_chain, publish_node, reclaim,
};

/// Value-word states above any live value (live values are below 2^61).
pub(super) const REMOVED: u64 = 1 << 61;
const DEAD: u64 = 1 << 62;
/// The largest value a list holds.
pub const MAX_LIST_VALUE: u64 = REMOVED - 1;

struct Node<K> {
    key: K,
    value: VerifiedAtomic<u64>,
    /// The link to the next node; marked once this node is dead.
    next: Word,
}

/// A lock-free sorted list from keys to value words (module docs). A list serves the
/// operations of one heap.
pub struct VerifiedList<K> {
    head: Word,
    _nodes: PhantomData<Box<Node<K>>>,
}

impl<K> std::fmt::Debug for VerifiedList<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedList").finish_non_exhaustive()
    }
}

impl<K> Default for VerifiedList<K> {
    fn default() -> Self {
        VerifiedList {
            head: Word::new(Raw::NULL),
            _nodes: PhantomData,
        }
    }
}

/// Where a search stopped: the link that points at `curr` (unmarked), and `curr`, the
/// first node whose key is not below the one searched for (or none).
struct Position<'g, K> {
    pred: &'g Word,
    curr_raw: Raw,
    curr: Option<&'g Node<K>>,
}

/// The node `ptr` points at.
///
/// # Safety
///
/// `ptr` is not null and was read from a link of the list (`Raw::node`) while this thread
/// was pinned by `_guard`.
unsafe fn node<K>(ptr: *mut Node<K>, _guard: &reclaim::Guard) -> &Node<K> {
    // SAFETY:
    // - links are made only by `VerifiedList::insert`, from the pointer of a live
    //   `Box<Node<K>>` (provenance kept through `Raw`), mark bit cleared by `Raw::node`;
    // - it was read from a link of the list while this thread was pinned by `_guard`, and a
    //   node is retired only after being unlinked, then freed only once every thread pinned
    //   before that has unpinned (crossbeam-epoch), so it lives at least as long as `'g`;
    //   under loom nodes are never freed;
    // - only shared references to nodes are formed; their mutable state is atomic.
    unsafe { &*ptr }
}

impl<K: Ord + Clone + Send + Sync + 'static> VerifiedList<K> {
    /// An empty list.
    pub fn new() -> VerifiedList<K> {
        VerifiedList::default()
    }

    /// Finds `key`'s position, unlinking marked nodes on the way and turning removed nodes
    /// that no operation can need any more into dead ones.
    fn find<'g>(&'g self, op: &OpGuard<'_>, key: &K, guard: &'g reclaim::Guard) -> Position<'g, K> {
        let clock = Clock::of(op);
        'retry: loop {
            let mut pred: &'g Word = &self.head;
            let mut curr_raw = pred.load(clock);
            loop {
                let curr_ptr = curr_raw.node::<Node<K>>();
                if curr_ptr.is_null() {
                    return Position {
                        pred,
                        curr_raw,
                        curr: None,
                    };
                }
                // SAFETY: `curr_ptr` is not null and was just read from `pred`, a link of
                // the list, while pinned by `guard`.
                let curr: &'g Node<K> = unsafe { node(curr_ptr, guard) };
                let next_raw = curr.next.load(clock);
                // Michael's check: `pred` still points at `curr`, unmarked.
                if pred.load(clock) != curr_raw {
                    continue 'retry;
                }
                if next_raw.is_marked() {
                    let next_unmarked = next_raw.with_mark(false);
                    // A plain swap: unlinking is not a linearization point; a descriptor in
                    // `pred` makes it fail and the search start again.
                    if !pred.swap_unverified(curr_raw, next_unmarked) {
                        continue 'retry;
                    }
                    if let Some(ptr) = NonNull::new(curr_ptr) {
                        // SAFETY: the node came from `Box::leak` in `insert`, and `ptr` is
                        // that pointer (provenance kept by `Raw`); the swap above removed the
                        // only link to it (a node is linked once, and a marked node is never
                        // linked again), so only threads pinned now can still hold it; only
                        // this swap's winner retires it.
                        unsafe { reclaim::retire_box(ptr, guard) };
                    }
                    curr_raw = next_unmarked;
                    continue;
                }
                Self::retire_if_stale(op, curr, clock);
                if curr.key >= *key {
                    return Position {
                        pred,
                        curr_raw,
                        curr: Some(curr),
                    };
                }
                pred = &curr.next;
                curr_raw = next_raw;
            }
        }
    }

    /// Turns a node removed two or more epochs before the clock dead and marks its link, so
    /// that the next traversal unlinks it.
    fn retire_if_stale(op: &OpGuard<'_>, curr: &Node<K>, clock: Clock<'_>) {
        let value = curr.value.load_in(clock);
        let stale = value & REMOVED != 0
            && value & DEAD == 0
            && Epoch::new(value & !REMOVED).plus(2) <= op.epoch();
        if stale && curr.value.compare_exchange(op, value, DEAD).is_err() {
            return;
        }
        if stale || value == DEAD {
            mark(&curr.next, clock);
        }
    }

    /// Asks the CPU for the list's head (on x86-64; nothing elsewhere), for a caller that
    /// will search the list soon: a hash map's bucket, looked up while the operation that
    /// searches it begins, so that the head's cache miss overlaps the operation's start
    /// instead of following it. Only a hint.
    #[inline]
    pub fn prefetch(&self) {
        crate::persist::prefetch_for_read(self);
    }

    /// The value of `key`, or `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if `key` was removed by an operation newer than `op`.
    pub fn get(&self, op: &OpGuard<'_>, key: &K) -> Result<Option<u64>> {
        let guard = reclaim::pin();
        let position = self.find(op, key, &guard);
        match position.curr.filter(|c| c.key == *key) {
            Some(curr) => live(op, curr.value.load_in(Clock::of(op))),
            None => Ok(None),
        }
    }

    /// The value of `key` as [`get`](Self::get) finds it, for a reader outside any
    /// operation, or [`Peek::Undecided`] when it cannot tell without an operation (it met a
    /// swap in progress, which only an operation's clock can decide, or a dead node, which
    /// only a traversal inside one unlinks). It changes nothing and waits for no one.
    ///
    /// Linearizable (INV-LIST-2): the traversal follows links whether marked or not, as the
    /// wait-free `contains` of Harris's list does (Herlihy and Shavit, 9.8). A live value
    /// is read from the one node of `key` that is not dead (there is at most one, and a
    /// node is dead before it is unlinked, for good), so the key held it at that load; a
    /// removed value likewise says the key was absent at that load. A traversal that passes
    /// the key's place without meeting it missed no node of the key that stayed linked
    /// throughout: the key was absent at some moment inside the call.
    pub fn peek(&self, key: &K) -> Peek<u64> {
        self.peek_with(key, |value, _| Some(value))
    }

    /// [`peek`](Self::peek), and what `read` makes of a live value: it gets the value and a
    /// check that loads the key's value word again (the same word, its node still pinned)
    /// and says whether it still holds the value, which then was the key's at that second
    /// load too. `None` from `read` is [`Peek::Undecided`].
    pub fn peek_with<T>(
        &self,
        key: &K,
        read: impl FnOnce(u64, &dyn Fn() -> bool) -> Option<T>,
    ) -> Peek<T> {
        let guard = reclaim::pin();
        let mut link = self.head.peek();
        while let Some(raw) = link {
            let ptr = raw.node::<Node<K>>();
            if ptr.is_null() {
                return Peek::Absent;
            }
            // SAFETY: `ptr` is not null and was just read from a link of the list while
            // pinned by `guard`.
            let curr: &Node<K> = unsafe { node(ptr, &guard) };
            if curr.key >= *key {
                if curr.key != *key {
                    return Peek::Absent;
                }
                return peek_word(&curr.value, read);
            }
            link = curr.next.peek();
        }
        Peek::Undecided
    }

    /// Sets `key` to `value` if it is absent; otherwise returns its value.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch, or `key` was removed by a
    /// newer operation.
    ///
    /// # Panics
    ///
    /// If `value > MAX_LIST_VALUE`.
    pub fn insert(&self, op: &OpGuard<'_>, key: &K, value: u64) -> Result<Result<(), u64>> {
        assert!(value <= MAX_LIST_VALUE, "list values are below 2^61");
        let guard = reclaim::pin();
        loop {
            let position = self.find(op, key, &guard);
            if let Some(curr) = position.curr.filter(|c| c.key == *key) {
                let found = curr.value.load_in(Clock::of(op));
                if let Some(v) = live(op, found)? {
                    return Ok(Err(v));
                }
                if found == DEAD {
                    // Being unlinked: a new node goes in once it is gone.
                    continue;
                }
                if swap_word(&curr.value, op, found, value)?.is_ok() {
                    return Ok(Ok(()));
                }
                continue;
            }
            let new = NonNull::from(Box::leak(Box::new(Node {
                key: key.clone(),
                value: VerifiedAtomic::new(value),
                next: Word::new(position.curr_raw),
            })));
            let new_raw = Raw::link(new.as_ptr(), false);
            // SAFETY: `new` was leaked from a `Box` just above and is not shared yet;
            // `new_raw` encodes it.
            let linked =
                unsafe { publish_node(position.pred, op, position.curr_raw, new_raw, new) };
            if linked? {
                return Ok(Ok(()));
            }
        }
    }

    /// Replaces `key`'s value `current` with `new`; otherwise returns the value found
    /// (`None` if the key is absent).
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
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
        assert!(new <= MAX_LIST_VALUE, "list values are below 2^61");
        self.swap_value(op, key, current, new)
    }

    /// Removes `key` if its value is `current`; otherwise returns the value found (`None` if
    /// the key is absent).
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert).
    pub fn remove(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        current: u64,
    ) -> Result<Result<(), Option<u64>>> {
        self.swap_value(op, key, current, REMOVED | op.epoch().get())
    }

    fn swap_value(
        &self,
        op: &OpGuard<'_>,
        key: &K,
        current: u64,
        new: u64,
    ) -> Result<Result<(), Option<u64>>> {
        let guard = reclaim::pin();
        let position = self.find(op, key, &guard);
        let Some(curr) = position.curr.filter(|c| c.key == *key) else {
            return Ok(Err(None));
        };
        swap_live(&curr.value, op, current, new)
    }

    /// Every live key and value, in key order.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if a key was removed by an operation newer than `op`.
    pub fn entries(&self, op: &OpGuard<'_>) -> Result<Vec<(K, u64)>> {
        let guard = reclaim::pin();
        let clock = Clock::of(op);
        let mut out = Vec::new();
        let mut ptr = self.head.load(clock).node::<Node<K>>();
        while !ptr.is_null() {
            // SAFETY: `ptr` is not null and was just read from a link of the list while
            // pinned by `guard`.
            let curr: &Node<K> = unsafe { node(ptr, &guard) };
            if let Some(v) = live(op, curr.value.load_in(clock))? {
                out.push((curr.key.clone(), v));
            }
            ptr = curr.next.load(clock).node::<Node<K>>();
        }
        Ok(out)
    }
}

/// Marks `link` (a node's `next`), so that no node is linked after it and traversals
/// unlink its node.
fn mark(link: &Word, clock: Clock<'_>) {
    loop {
        let raw = link.load(clock);
        if raw.is_marked() || link.swap_unverified(raw, raw.with_mark(true)) {
            return;
        }
    }
}

/// A verified swap of a value word: `Ok(Err(found))` if it did not hold `current`.
pub(super) fn swap_word(
    word: &VerifiedAtomic<u64>,
    op: &OpGuard<'_>,
    current: u64,
    new: u64,
) -> Result<Result<(), u64>> {
    match word.compare_exchange(op, current, new) {
        Ok(_) => Ok(Ok(())),
        Err(err) if err.kind == CasErrorKind::EpochAdvanced => Err(Error::Aborted),
        Err(err) => Ok(Err(err.current)),
    }
}

/// A verified swap of a key's value word from `current` to `new`: `Ok(Err(found))`, with
/// the live value found (`None` for a removed one), if it did not hold `current`.
pub(super) fn swap_live(
    word: &VerifiedAtomic<u64>,
    op: &OpGuard<'_>,
    current: u64,
    new: u64,
) -> Result<Result<(), Option<u64>>> {
    match swap_word(word, op, current, new)? {
        Ok(()) => Ok(Ok(())),
        Err(found) => Ok(Err(live(op, found)?)),
    }
}

/// A key's value word `word` as a read outside any operation sees it
/// ([`VerifiedList::peek_with`]): a live value goes to `read`, with a second load of the
/// word; a removed one is absent; a dead one undecided (the key may be in a newer node the
/// reader did not reach).
pub(super) fn peek_word<T>(
    word: &VerifiedAtomic<u64>,
    read: impl FnOnce(u64, &dyn Fn() -> bool) -> Option<T>,
) -> Peek<T> {
    match word.peek() {
        Some(value) if value & (REMOVED | DEAD) == 0 => {
            read(value, &|| word.peek() == Some(value)).map_or(Peek::Undecided, Peek::Found)
        }
        Some(value) if value & DEAD == 0 => Peek::Absent,
        _ => Peek::Undecided,
    }
}

/// A value word as seen by `op`: `Some` if live, `None` if removed (or dead).
pub(super) fn live(op: &OpGuard<'_>, value: u64) -> Result<Option<u64>> {
    if value & (REMOVED | DEAD) == 0 {
        return Ok(Some(value));
    }
    if value & DEAD == 0 {
        op.check_epoch(Epoch::new(value & !REMOVED))?;
    }
    Ok(None)
}

impl<K> Drop for VerifiedList<K> {
    fn drop(&mut self) {
        // With `&mut self` no other thread can see the list.
        let first = self.head.load_exclusive();
        // SAFETY: with `&mut self` no other thread uses the list; every node still linked
        // came from `Box::leak` in `insert`, is linked by that pointer, is linked once, and
        // is freed only here (unlinked nodes were handed to crossbeam-epoch instead).
        unsafe {
            free_chain(first, |n: &Node<K>| n.next.load_exclusive());
        }
    }
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use super::*;
    use crate::config::SimMode;
    use crate::{Heap, HeapConfig};

    fn length(list: &VerifiedList<u64>) -> usize {
        let guard = reclaim::pin();
        let mut n = 0;
        // A single-threaded test: no swap is in progress.
        let mut ptr = list.head.load_exclusive().node::<Node<u64>>();
        while !ptr.is_null() {
            n += 1;
            // SAFETY: `ptr` is not null and was read from a link of the list while pinned.
            ptr = unsafe { node(ptr, &guard) }
                .next
                .load_exclusive()
                .node::<Node<u64>>();
        }
        n
    }

    #[test]
    fn removed_keys_revive_abort_older_operations_and_are_purged_after_two_epochs() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let list = VerifiedList::<u64>::new();
        heap.run_op(|op| {
            for k in [5, 1, 3] {
                assert_eq!(list.insert(op, &k, k * 10)?, Ok(()));
            }
            assert_eq!(list.insert(op, &3, 99)?, Err(30));
            assert_eq!(list.entries(op)?, vec![(1, 10), (3, 30), (5, 50)]);
            assert_eq!(list.remove(op, &3, 31)?, Err(Some(30)));
            assert_eq!(list.remove(op, &3, 30)?, Ok(()));
            assert_eq!(list.get(op, &3)?, None);
            // Revived in the same epoch.
            assert_eq!(list.insert(op, &3, 33)?, Ok(()));
            assert_eq!(list.remove(op, &3, 33)?, Ok(()));
            Ok(())
        })
        .unwrap();
        // An operation older than the removal must not see the key as absent.
        let old = heap.begin_op().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                heap.advance_epoch().unwrap();
                heap.run_op(|op| list.insert(op, &3, 34).map(|_| ()))
                    .unwrap();
                heap.run_op(|op| list.remove(op, &3, 34).map(|_| ()))
                    .unwrap();
            });
        });
        assert!(matches!(list.get(&old, &3), Err(Error::Aborted)));
        drop(old);
        assert_eq!(
            length(&list),
            3,
            "a removed node stays while it may be needed"
        );
        heap.advance_epoch().unwrap();
        heap.advance_epoch().unwrap();
        heap.run_op(|op| list.get(op, &5).map(|_| ())).unwrap();
        assert_eq!(length(&list), 2, "purged two epochs after its removal");
        heap.run_op(|op| {
            assert_eq!(list.get(op, &3)?, None);
            assert_eq!(list.insert(op, &3, 35)?, Ok(()));
            assert_eq!(list.entries(op)?, vec![(1, 10), (3, 35), (5, 50)]);
            Ok(())
        })
        .unwrap();
    }
}
