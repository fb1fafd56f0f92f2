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
//! Nodes come from the operation's thread slot and go back to it once dequeued, to be
//! reused two epochs later (INV-NODE-1, `epoch/nodes.rs`): an operation holds the nodes it
//! reads for no longer than it runs, so the epoch clock that bounds operations bounds them
//! too, and the queue needs no pin or deferred free of its own. That needs every operation
//! on a queue to belong to one heap: the first binds the queue to its heap, and one of
//! another heap is refused.

use std::ptr::NonNull;

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
use crate::primitive::{AtomicU64, Ordering};
use crate::verified::atomic::{CasErrorKind, Clock, Raw, Word, dcss};

struct Node {
    value: u64,
    seq: u64,
    /// The newest epoch of an operation that tried to dequeue this node's value.
    taken: AtomicU64,
    /// The link to the next node (a DCSS word; links are never marked in the queue).
    next: Word,
}

/// Where nodes come from and go: the thread slots' node caches.
#[cfg(not(montage_loom))]
mod store {
    use std::ptr::NonNull;

    use super::Node;
    use crate::epoch::nodes::{self, NODE_LAYOUT, NodeCache};
    use crate::epoch::op::OpGuard;

    const _: () = assert!(
        size_of::<Node>() <= NODE_LAYOUT.size() && align_of::<Node>() <= NODE_LAYOUT.align()
    );

    /// Room for a node: from `op`'s slot, or (outside any operation) a new one.
    pub(super) fn take(op: Option<&OpGuard<'_>>) -> NonNull<Node> {
        op.map_or_else(nodes::alloc, |op| op.nodes(NodeCache::take))
            .cast()
    }

    /// Hands a dequeued node to `op`'s slot, to reuse once no operation can hold it.
    ///
    /// # Safety
    ///
    /// A swap verified in `op`'s epoch removed the last link to `node`, which came from
    /// `take`; every operation that may hold it belongs to `op`'s heap; it is retired once.
    pub(super) unsafe fn retire(op: &OpGuard<'_>, node: NonNull<Node>) {
        op.nodes(|cache, epoch| {
            // SAFETY: `NodeCache::retire`'s contract is this function's (a node from `take`
            // came from a cache or `nodes::alloc`, so from `nodes::alloc`), and `epoch` and
            // the cache are of `op`, so of the heap whose clock INV-NODE-1 reads.
            unsafe { cache.retire(node.cast(), epoch) }
        });
    }

    /// Frees a node.
    ///
    /// # Safety
    ///
    /// `node` came from `take` and nobody uses it any more.
    pub(super) unsafe fn free(node: NonNull<Node>) {
        // SAFETY: `take` allocated it with `NODE_LAYOUT`, or took it from a cache that did;
        // `Node` needs no drop.
        unsafe { nodes::free(node.cast()) };
    }
}

/// Where nodes come from and go under loom, whose atomics do not fit the caches' layout:
/// the global allocator, and dequeued nodes are leaked (loom explores bounded executions).
#[cfg(montage_loom)]
mod store {
    use std::mem::MaybeUninit;
    use std::ptr::NonNull;

    use super::Node;
    use crate::epoch::op::OpGuard;

    pub(super) fn take(_op: Option<&OpGuard<'_>>) -> NonNull<Node> {
        NonNull::from(Box::leak(Box::new(MaybeUninit::<Node>::uninit()))).cast()
    }

    pub(super) unsafe fn retire(_op: &OpGuard<'_>, _node: NonNull<Node>) {}

    pub(super) unsafe fn free(node: NonNull<Node>) {
        // SAFETY: `take` leaked it from a `Box` of the same layout; nobody uses it any more.
        drop(unsafe { Box::from_raw(node.as_ptr().cast::<MaybeUninit<Node>>()) });
    }
}

/// A node holding `value` and `seq`, linked to nothing, in `op`'s memory if there is one.
fn new_node(op: Option<&OpGuard<'_>>, value: u64, seq: u64) -> NonNull<Node> {
    let node = store::take(op);
    // SAFETY: `take` returned room for a `Node` that nobody else uses (INV-NODE-1 for a
    // reused one).
    unsafe { fill(node, value, seq) };
    node
}

/// Makes `node` hold `value` and `seq`, linked to nothing.
///
/// # Safety
///
/// `node` is room for a `Node` (initialised or not) that no other thread can reach.
unsafe fn fill(node: NonNull<Node>, value: u64, seq: u64) {
    // SAFETY: by the contract; a `Node` needs no drop, so what it held is just overwritten.
    unsafe {
        node.as_ptr().write(Node {
            value,
            seq,
            taken: AtomicU64::new(0),
            next: Word::new(Raw::NULL),
        });
    }
}

/// The node `link` points at, for as long as `_op` runs.
///
/// # Safety
///
/// `link` is not null and was read from `head`, `tail` or a node's `next` of a queue bound to
/// `_op`'s heap, during `_op`.
unsafe fn node<'o>(link: Raw, _op: &'o OpGuard<'_>) -> &'o Node {
    // SAFETY:
    // - links are made only from the pointer of a node initialised by `new_node` (provenance
    //   kept through `Raw`);
    // - it was read from a word of the queue during `_op`; a node is retired only after the
    //   head moved past it, and then reused only once every operation that could have read a
    //   link to it has ended (INV-NODE-1), so not before `_op` ends; all of them belong to
    //   the queue's heap, whose clock that rule reads (the binding);
    // - only shared references to nodes are formed; their mutable state is atomic.
    unsafe { &*link.node::<Node>() }
}

/// Where a test may stop a dequeue or a traversal to let other threads run (the `sim`
/// feature's [`sim::pause_queue_reads_at`](crate::sim::pause_queue_reads_at)).
#[cfg(feature = "sim")]
pub(crate) mod race {
    /// A point in a queue operation where what it read may go stale.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum QueuePoint {
        /// A dequeue read the head and the next node, and has not yet read its value.
        DequeueRead,
        /// A dequeue read its value (and its caller acted on it), and has not yet swapped
        /// the head.
        DequeueTook,
        /// A traversal collected the elements' values, and has not yet returned them.
        TraversalCollected,
    }

    /// What a test runs at a [`QueuePoint`].
    pub type Hook = crate::race::Hook<QueuePoint>;

    thread_local! {
        static HOOK: crate::race::Slot<QueuePoint> = const { std::cell::RefCell::new(None) };
    }

    /// Calls `hook` on this thread at every [`QueuePoint`] its queue operations reach, until
    /// it is replaced (`None`: no more calls).
    pub fn pause_queue_reads_at(hook: Option<Hook>) {
        crate::race::set(&HOOK, hook);
    }

    pub(super) fn reached(point: QueuePoint) {
        crate::race::reached(&HOOK, point);
    }
}

/// The elements a [`VerifiedQueue`] had dequeued when [`VerifiedQueue::dequeued`] read its
/// head.
#[derive(Debug, Clone, Copy)]
pub struct Dequeued {
    /// The number of the last element dequeued.
    last: u64,
}

impl Dequeued {
    /// Whether the element numbered `seq` (one that was linked) had been dequeued. Numbers
    /// wrap, so that is within half the number space at or behind the last one dequeued.
    pub fn includes(self, seq: u64) -> bool {
        self.last.wrapping_sub(seq) <= u64::MAX / 2
    }
}

/// A lock-free FIFO queue of value words with sequence numbers (module docs). A queue
/// serves the operations of one heap: the first operation binds it.
pub struct VerifiedQueue {
    head: Word,
    tail: Word,
    /// The instance id of the heap whose operations use the queue (0 until the first).
    heap: AtomicU64,
}

impl std::fmt::Debug for VerifiedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedQueue").finish_non_exhaustive()
    }
}

impl VerifiedQueue {
    /// An empty queue whose first element will get sequence number `first_seq`.
    pub fn new(first_seq: u64) -> VerifiedQueue {
        let dummy = Raw::link(new_node(None, 0, first_seq.wrapping_sub(1)).as_ptr(), false);
        VerifiedQueue {
            head: Word::new(dummy),
            tail: Word::new(dummy),
            heap: AtomicU64::new(0),
        }
    }

    /// Checks that `op` belongs to the heap the queue serves, binding the queue to it at the
    /// first operation.
    #[inline]
    fn bind(&self, op: &OpGuard<'_>) -> Result<()> {
        let heap = op.heap_instance();
        // ORDERING: Relaxed: the binding is one value, decided by the first swap from 0; the
        // nodes it protects are reached through the queue's SeqCst words.
        let bound = self.heap.load(Ordering::Relaxed);
        if bound == heap {
            return Ok(());
        }
        if bound == 0 {
            // ORDERING: as above.
            match self
                .heap
                .compare_exchange(0, heap, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(found) if found == heap => return Ok(()),
                Err(_) => {}
            }
        }
        Err(Error::Unsupported {
            what: "a verified queue used by operations of two different heaps",
        })
    }

    /// Moves the tail from `from` to `to` if it is still `from`; a failure means another
    /// thread moved it already.
    fn swing_tail(&self, from: Raw, to: Raw) {
        let _ = self.tail.swap_unverified(from, to);
    }

    /// Appends `value` with sequence number `seq` (recovery's bulk load: no verification,
    /// no concurrent access, sequence numbers increasing).
    pub fn push_recovered(&mut self, value: u64, seq: u64) {
        let new = Raw::link(new_node(None, value, seq).as_ptr(), false);
        // With `&mut self` no other thread can reach the queue.
        let tail = self.tail.load_exclusive();
        // SAFETY: `tail` (never null: there is always a dummy) names a node of this queue,
        // which `&mut self` keeps from being dequeued, let alone reused.
        let last = unsafe { &*tail.node::<Node>() };
        last.next.store_exclusive(new);
        self.tail.store_exclusive(new);
    }

    /// Appends `value`; `seq` is called with the sequence number the element will have
    /// (before the swap that links it; it may be called again if the swap must be retried)
    /// and must record it wherever the caller keeps it. Returns that number.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch; whatever `seq` returns;
    /// [`Error::Unsupported`] for an operation of another heap than the queue's.
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
    /// [`Error::Aborted`] if the clock moved past `op`'s epoch; whatever `make` returns;
    /// [`Error::Unsupported`] for an operation of another heap than the queue's.
    pub fn push_with(
        &self,
        op: &OpGuard<'_>,
        mut make: impl FnMut(u64) -> Result<u64>,
    ) -> Result<u64> {
        self.bind(op)?;
        let clock = Clock::of(op);
        // The node to link, once made: a failed swap leaves it unpublished, to fill again.
        let mut spare: Option<NonNull<Node>> = None;
        let result = loop {
            let tail_raw = self.tail.load(clock);
            // SAFETY: read from `tail` during `op`, which the queue is bound to.
            let tail = unsafe { node(tail_raw, op) };
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
            let value = match make(number) {
                Ok(value) => value,
                Err(err) => break Err(err),
            };
            let new = match spare.take() {
                Some(node) => {
                    // SAFETY: `node` was made below by an earlier attempt whose swap failed,
                    // so no other thread has seen it.
                    unsafe { fill(node, value, number) };
                    node
                }
                None => new_node(Some(op), value, number),
            };
            let new_raw = Raw::link(new.as_ptr(), false);
            match dcss(&tail.next, op, next_raw, new_raw) {
                Ok(()) => {
                    self.swing_tail(tail_raw, new_raw);
                    break Ok(number);
                }
                Err((_, kind)) => {
                    spare = Some(new);
                    if kind == CasErrorKind::EpochAdvanced {
                        break Err(Error::Aborted);
                    }
                }
            }
        };
        if let Some(unlinked) = spare {
            // SAFETY: made by `new_node` and never published: no other thread has seen it.
            unsafe { store::free(unlinked) };
        }
        result
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
    /// `op` emptied the queue; whatever `take` returns; [`Error::Unsupported`] for an
    /// operation of another heap than the queue's.
    pub fn pop(
        &self,
        op: &OpGuard<'_>,
        mut take: impl FnMut(u64, u64) -> Result<()>,
    ) -> Result<Option<u64>> {
        self.bind(op)?;
        let clock = Clock::of(op);
        loop {
            let head_raw = self.head.load(clock);
            let tail_raw = self.tail.load(clock);
            // SAFETY: read from `head` during `op`, which the queue is bound to.
            let head = unsafe { node(head_raw, op) };
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
            // SAFETY: read from `head.next` during `op`, which the queue is bound to.
            let next = unsafe { node(next_raw, op) };
            // ORDERING: SeqCst: whoever sees `next` as the head sees an epoch no older than
            // the dequeue that made it so.
            next.taken.fetch_max(op.epoch().get(), Ordering::SeqCst);
            #[cfg(feature = "sim")]
            race::reached(race::QueuePoint::DequeueRead);
            if let Err(err) = take(next.value, next.seq) {
                // `take` may have read a value another dequeue took since this one read the
                // head (the caller's payload handed out again, for one): if the head moved
                // on, what it read is stale, and the operation runs again.
                if !matches!(err, Error::Aborted) && self.dequeued(op)?.includes(next.seq) {
                    return Err(Error::Aborted);
                }
                return Err(err);
            }
            #[cfg(feature = "sim")]
            race::reached(race::QueuePoint::DequeueTook);
            return match dcss(&self.head, op, head_raw, next_raw) {
                Ok(()) => {
                    if let Some(ptr) = NonNull::new(head_raw.node::<Node>()) {
                        // SAFETY: the old dummy came from `new_node`, and `ptr` is that
                        // pointer (provenance kept by `Raw`); the swap above, verified in
                        // `op`'s epoch, moved the head past it, and nothing links to a node
                        // before the head; every operation that may hold it belongs to the
                        // queue's heap, `op`'s (the binding); only this swap's winner retires
                        // it.
                        unsafe { store::retire(op, ptr) };
                    }
                    Ok(Some(next.value))
                }
                // The epoch moved, or another dequeue won: the caller's abort undoes
                // `take`'s work, and the operation runs again.
                Err(_) => Err(Error::Aborted),
            };
        }
    }

    /// What has been dequeued by now: every element up to the dummy's number, that of the
    /// last element dequeued ([`Dequeued::includes`]). What the caller read before this call
    /// (an element's payload) is ordered before its read of the head, so an element it does
    /// not include was still queued after the caller's reads.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an operation of another heap than the queue's.
    pub fn dequeued(&self, op: &OpGuard<'_>) -> Result<Dequeued> {
        self.bind(op)?;
        // ORDERING: the caller's earlier reads come before the head's load.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: read from `head` during `op`, which the queue is bound to.
        let last = unsafe { node(self.head.load(Clock::of(op)), op) }.seq;
        Ok(Dequeued { last })
    }

    /// Every element's value and sequence number, front to back (a traversal, not a
    /// snapshot while others change the queue).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an operation of another heap than the queue's.
    pub fn to_vec(&self, op: &OpGuard<'_>) -> Result<Vec<(u64, u64)>> {
        self.bind(op)?;
        let clock = Clock::of(op);
        let mut out = Vec::new();
        // SAFETY: read from `head` during `op`, which the queue is bound to.
        let mut curr = unsafe { node(self.head.load(clock), op) };
        loop {
            let next = curr.next.load(clock);
            if next == Raw::NULL {
                #[cfg(feature = "sim")]
                race::reached(race::QueuePoint::TraversalCollected);
                return Ok(out);
            }
            // SAFETY: read from a node's `next` during `op`, which the queue is bound to.
            curr = unsafe { node(next, op) };
            out.push((curr.value, curr.seq));
        }
    }
}

impl Drop for VerifiedQueue {
    fn drop(&mut self) {
        // With `&mut self` no other thread can reach the queue.
        let mut link = self.head.load_exclusive();
        while let Some(ptr) = NonNull::new(link.node::<Node>()) {
            // SAFETY: with `&mut self` no other thread uses the queue; the dummy and every
            // node after it came from `new_node`, are linked by that pointer and once, and
            // are freed only here (nodes before the dummy went to the slots' caches instead).
            link = unsafe { (*ptr.as_ptr()).next.load_exclusive() };
            // SAFETY: as above; its link was read.
            unsafe { store::free(ptr) };
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
            assert_eq!(queue.to_vec(op)?, vec![(1, 11), (2, 12)]);
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

    /// Whether `result` is the refusal of an operation of another heap than the queue's.
    fn refused<T>(result: &Result<T>) -> bool {
        matches!(result, Err(Error::Unsupported { what }) if what.contains("two different heaps"))
    }

    /// A queue serves the heap of its first operation: another heap's operation could hold
    /// a node that the first heap's clock lets its slots reuse (INV-NODE-1), so it is refused,
    /// and the queue is left as it was.
    #[test]
    fn an_operation_of_another_heap_is_refused() {
        let first = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let second = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let queue = VerifiedQueue::new(0);
        first.run_op(|op| queue.push(op, 7, |_| Ok(()))).unwrap();
        assert!(refused(&second.run_op(|op| queue.push(op, 8, |_| Ok(())))));
        assert!(refused(&second.run_op(|op| queue.pop(op, |_, _| Ok(())))));
        assert!(refused(&second.run_op(|op| queue.to_vec(op))));
        let left = first.run_op(|op| queue.to_vec(op)).unwrap();
        assert_eq!(left, vec![(7, 0)]);
    }
}
