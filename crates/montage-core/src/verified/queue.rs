//! [`VerifiedQueue`]: a Michael-Scott lock-free FIFO queue of value words whose enqueue
//! and dequeue linearize at epoch-verified swaps. It is the index of montage-collections'
//! nonblocking queue; the values are payload handles.
//!
//! Each node carries a sequence number, its predecessor's plus one, fixed before the
//! swap that links it (so sequence order is queue order, and recovery can rebuild the
//! order from payloads that record it). A dequeue swaps the head to the next node, which
//! becomes the dummy. Before swapping, every dequeuer raises the candidate's `taken` epoch
//! to its own (`fetch_max`), so the dummy carries an epoch no older than the dequeue that
//! made it the dummy; a dequeue that finds the queue empty checks it, and aborts if an
//! operation newer than it emptied the queue (INV-COL-1). Swaps that change the queue are
//! verified, so no operation of epoch `e` changes it after one of `e + 1` did (INV-CAS-1).
//!
//! Dequeued dummies go to crossbeam-epoch (leaked under loom).

use std::ptr::NonNull;

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
use crate::primitive::{AtomicU64, Ordering};
use crate::verified::atomic::{Clock, Raw, Word, dcss, free_chain, publish_node, reclaim};

struct Node {
    value: u64,
    seq: u64,
    /// The newest epoch of an operation that tried to dequeue this node's value.
    taken: AtomicU64,
    /// The link to the next node (a DCSS word; links are never marked in the queue).
    next: Word,
}

fn new_node(value: u64, seq: u64) -> NonNull<Node> {
    NonNull::from(Box::leak(Box::new(Node {
        value,
        seq,
        taken: AtomicU64::new(0),
        next: Word::new(Raw::NULL),
    })))
}

/// The node `link` points at.
///
/// # Safety
///
/// `link` is not null and was read from `head`, `tail` or a node's `next` while this
/// thread was pinned by `_guard`.
unsafe fn node(link: Raw, _guard: &reclaim::Guard) -> &Node {
    // SAFETY:
    // - links are made only from the pointer of a live `Box<Node>` leaked by `new_node`
    //   (provenance kept through `Raw`);
    // - it was read from a word of the queue while pinned by `_guard`; a node is retired only
    //   after the head moved past it, then freed only once every thread pinned before that
    //   has unpinned (crossbeam-epoch); under loom nodes are never freed;
    // - only shared references to nodes are formed; their mutable state is atomic.
    unsafe { &*link.node::<Node>() }
}

/// A lock-free FIFO queue of value words with sequence numbers (module docs). A queue
/// serves the operations of one heap.
pub struct VerifiedQueue {
    head: Word,
    tail: Word,
}

impl std::fmt::Debug for VerifiedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedQueue").finish_non_exhaustive()
    }
}

impl VerifiedQueue {
    /// An empty queue whose first element will get sequence number `first_seq`.
    pub fn new(first_seq: u64) -> VerifiedQueue {
        let dummy = Raw::link(new_node(0, first_seq.wrapping_sub(1)).as_ptr(), false);
        VerifiedQueue {
            head: Word::new(dummy),
            tail: Word::new(dummy),
        }
    }

    /// Moves the tail from `from` to `to` if it is still `from`; a failure means another
    /// thread moved it already.
    fn swing_tail(&self, from: Raw, to: Raw) {
        let _ = self.tail.swap_unverified(from, to);
    }

    /// Appends `value` with sequence number `seq` (recovery's bulk load: no verification,
    /// no concurrent access, sequence numbers increasing).
    pub fn push_recovered(&mut self, value: u64, seq: u64) {
        let guard = reclaim::pin();
        let new = Raw::link(new_node(value, seq).as_ptr(), false);
        // With `&mut self` no other thread can reach the queue.
        let tail = self.tail.load_exclusive();
        // SAFETY: `tail` (never null: there is always a dummy) was read from the queue's tail
        // while pinned.
        let last = unsafe { node(tail, &guard) };
        last.next.store_exclusive(new);
        self.tail.store_exclusive(new);
    }

    /// Appends `value`; `seq` is called with the sequence number the element will have
    /// (before the swap that links it; it may be called again if the swap must be retried)
    /// and must record it wherever the caller keeps it. Returns that number.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch; whatever `seq` returns.
    pub fn push(
        &self,
        op: &OpGuard<'_>,
        value: u64,
        mut seq: impl FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        self.push_with(op, |number| seq(number).map(|()| value))
    }

    /// Appends the value `make` returns for the sequence number the element will have:
    /// `make` is called before the swap that links it, and again, with the new number, if
    /// the swap must be retried (another element was linked first), so that a caller can
    /// write the number into what the value names before it is linked, once in the common
    /// case. Returns the number.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch; whatever `make` returns.
    pub fn push_with(
        &self,
        op: &OpGuard<'_>,
        mut make: impl FnMut(u64) -> Result<u64>,
    ) -> Result<u64> {
        let guard = reclaim::pin();
        let clock = Clock::of(op);
        loop {
            let tail_raw = self.tail.load(clock);
            // SAFETY: read from `tail` while pinned.
            let tail = unsafe { node(tail_raw, &guard) };
            let next_raw = tail.next.load(clock);
            if self.tail.load(clock) != tail_raw {
                continue;
            }
            if next_raw != Raw::NULL {
                // The tail lags: help it along (not a linearization point, so not verified).
                self.swing_tail(tail_raw, next_raw);
                continue;
            }
            let number = tail.seq.wrapping_add(1);
            let value = make(number)?;
            let new = new_node(value, number);
            let new_raw = Raw::link(new.as_ptr(), false);
            // SAFETY: `new` was leaked from a `Box` just above and is not shared yet;
            // `new_raw` encodes it.
            let linked = unsafe { publish_node(&tail.next, op, next_raw, new_raw, new) };
            if linked? {
                self.swing_tail(tail_raw, new_raw);
                return Ok(number);
            }
        }
    }

    /// Removes the front element: `take` is called (at most once) with its value and
    /// sequence number before the swap that removes it, and the swap happens only if `take`
    /// returns `Ok`. If the swap then fails, this returns [`Error::Aborted`]: the caller's
    /// operation must abort (undoing what `take` did) and run again. Returns the value, or
    /// `None` if the queue is empty.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch, or an operation newer than
    /// `op` emptied the queue; whatever `take` returns.
    pub fn pop(
        &self,
        op: &OpGuard<'_>,
        mut take: impl FnMut(u64, u64) -> Result<()>,
    ) -> Result<Option<u64>> {
        let guard = reclaim::pin();
        let clock = Clock::of(op);
        loop {
            let head_raw = self.head.load(clock);
            let tail_raw = self.tail.load(clock);
            // SAFETY: read from `head` while pinned.
            let head = unsafe { node(head_raw, &guard) };
            let next_raw = head.next.load(clock);
            if self.head.load(clock) != head_raw {
                continue;
            }
            if next_raw == Raw::NULL {
                // Empty: unless an operation newer than this one emptied it.
                // ORDERING: SeqCst pairs with the `fetch_max` before the head swap.
                op.check_epoch(Epoch::new(head.taken.load(Ordering::SeqCst)))?;
                return Ok(None);
            }
            if head_raw == tail_raw {
                self.swing_tail(tail_raw, next_raw);
                continue;
            }
            // SAFETY: read from `head.next` while pinned.
            let next = unsafe { node(next_raw, &guard) };
            // ORDERING: SeqCst: whoever sees `next` as the head sees an epoch no older than
            // the dequeue that made it so.
            next.taken.fetch_max(op.epoch().get(), Ordering::SeqCst);
            take(next.value, next.seq)?;
            match dcss(&self.head, op, head_raw, next_raw) {
                Ok(()) => {
                    if let Some(ptr) = NonNull::new(head_raw.node::<Node>()) {
                        // SAFETY: the old dummy came from `Box::leak` in `new_node`, and `ptr`
                        // is that pointer (provenance kept by `Raw`); the swap
                        // above moved the head past it, and nothing links to a node before
                        // the head, so only threads pinned now can still hold it; only this
                        // swap's winner retires it.
                        unsafe { reclaim::retire_box(ptr, &guard) };
                    }
                    return Ok(Some(next.value));
                }
                // The epoch moved, or another dequeue won: the caller's abort undoes
                // `take`'s work, and the operation runs again.
                Err(_) => return Err(Error::Aborted),
            }
        }
    }

    /// Every element's value and sequence number, front to back (a traversal, not a
    /// snapshot while others change the queue).
    pub fn to_vec(&self, op: &OpGuard<'_>) -> Vec<(u64, u64)> {
        let guard = reclaim::pin();
        let clock = Clock::of(op);
        let mut out = Vec::new();
        // SAFETY: read from `head` while pinned.
        let mut curr = unsafe { node(self.head.load(clock), &guard) };
        loop {
            let next = curr.next.load(clock);
            if next == Raw::NULL {
                return out;
            }
            // SAFETY: read from a node's `next` while pinned.
            curr = unsafe { node(next, &guard) };
            out.push((curr.value, curr.seq));
        }
    }
}

impl Drop for VerifiedQueue {
    fn drop(&mut self) {
        // With `&mut self` no other thread can reach the queue.
        let first = self.head.load_exclusive();
        // SAFETY: with `&mut self` no other thread uses the queue; the dummy and every node
        // after it came from `Box::leak` in `new_node`, are linked by that pointer and once,
        // and are freed only here (nodes before the dummy went to crossbeam-epoch instead).
        unsafe {
            free_chain(first, |n: &Node| n.next.load_exclusive());
        }
    }
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use super::*;
    use crate::config::SimMode;
    use crate::{Heap, HeapConfig};

    #[test]
    fn fifo_order_sequence_numbers_and_an_older_empty_read_aborts() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let queue = VerifiedQueue::new(10);
        let mut seqs = Vec::new();
        heap.run_op(|op| {
            for v in [3, 1, 2] {
                seqs.push(queue.push(op, v, |_| Ok(()))?);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(seqs, [10, 11, 12]);
        let taken = heap
            .run_op(|op| {
                queue.pop(op, |v, seq| {
                    if (v, seq) == (3, 10) {
                        Ok(())
                    } else {
                        Err(Error::Aborted)
                    }
                })
            })
            .unwrap();
        assert_eq!(taken, Some(3));
        heap.run_op(|op| {
            assert_eq!(queue.to_vec(op), vec![(1, 11), (2, 12)]);
            Ok(())
        })
        .unwrap();
        // An operation older than the dequeue that emptied the queue must not report empty.
        let old = heap.begin_op().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                heap.advance_epoch().unwrap();
                for _ in 0..2 {
                    heap.run_op(|op| queue.pop(op, |_, _| Ok(()))).unwrap();
                }
            });
        });
        assert!(matches!(
            queue.pop(&old, |_, _| Ok(())),
            Err(Error::Aborted)
        ));
        drop(old);
        assert_eq!(
            heap.run_op(|op| queue.pop(op, |_, _| Ok(()))).unwrap(),
            None
        );
    }
}
