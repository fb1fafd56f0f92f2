//! DRAM nodes of the lock-free queue (`verified/queue.rs`), reused through the thread slots
//! on the epoch clock rather than freed through a reclamation scheme of their own.
//!
//! INV-NODE-1: a node unlinked by a swap verified in epoch `r` is handed out again only to an
//! operation of an epoch `>= r + 2`. Only an operation that read a link to the node before
//! that swap can hold it; such an operation began before the swap, with the clock at `r` or
//! earlier, so its epoch is at most `r`; and every operation of an epoch `<= r` has ended
//! before the clock is published as `r + 2` (INV-EP-1), which an operation of epoch `r + 2`
//! has seen. So no operation holds the node when it is reused, and no pin, fence or deferred
//! call is needed beside the operation's own announcement.
//!
//! Each thread slot keeps the nodes its operations unlinked, in batches by epoch, and the
//! nodes that are free again; a slot whose operations unlink more than they link (a consumer
//! thread) gives the excess back to the global allocator. Every node has the layout
//! [`NODE_LAYOUT`], whoever allocated it, so any of them may be freed with it.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ptr::NonNull;

use crate::base::epoch::Epoch;

/// The layout of every node: room for four words.
pub(crate) const NODE_LAYOUT: Layout = match Layout::from_size_align(32, 8) {
    Ok(layout) => layout,
    Err(_) => panic!("32 bytes aligned to 8 is a valid layout"),
};

/// How many free nodes a slot keeps; more go back to the global allocator.
const READY_LIMIT: usize = 1024;

/// A new node from the global allocator, uninitialised, with [`NODE_LAYOUT`].
pub(crate) fn alloc() -> NonNull<u8> {
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc(NODE_LAYOUT) };
    NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(NODE_LAYOUT))
}

/// Frees a node.
///
/// # Safety
///
/// `node` came from [`alloc`] and nobody uses it any more.
pub(crate) unsafe fn free(node: NonNull<u8>) {
    // SAFETY: `alloc` allocated it from the global allocator with this layout; this
    // function's contract makes this its last use.
    unsafe { std::alloc::dealloc(node.as_ptr(), NODE_LAYOUT) };
}

/// A thread slot's nodes: the free ones and those waiting out INV-NODE-1.
#[derive(Debug, Default)]
pub(crate) struct NodeCache {
    /// Nodes no operation holds, ready to hand out.
    ready: Vec<NonNull<u8>>,
    /// Unlinked nodes, in batches by the newest epoch of the operations that unlinked them,
    /// oldest first.
    retired: VecDeque<(Epoch, Vec<NonNull<u8>>)>,
    /// An empty batch kept for its capacity.
    spare: Vec<NonNull<u8>>,
}

// SAFETY: the pointers name allocations that no thread uses while they are in the cache
// (INV-NODE-1 for retired nodes); the cache owns them, and any thread may free them.
unsafe impl Send for NodeCache {}

impl NodeCache {
    /// A node for an operation of `epoch`: a free one, or a new one.
    #[inline]
    pub(crate) fn take(&mut self, epoch: Epoch) -> NonNull<u8> {
        if self.ready.is_empty() {
            self.promote(epoch);
        }
        let Some(node) = self.ready.pop() else {
            return alloc();
        };
        // A ready node was last written two epochs ago or more, and is out of this core's
        // cache by now: ask for the next one's line, so that the next operation's stores
        // into it do not wait for memory.
        if let Some(next) = self.ready.last() {
            crate::persist::prefetch_ptr_for_write(next.as_ptr());
        }
        node
    }

    /// Keeps `node`, unlinked by an operation of `epoch`, until INV-NODE-1 lets it go.
    ///
    /// # Safety
    ///
    /// `node` came from [`alloc`]; a swap verified in `epoch` removed the last link to it,
    /// and it is retired once.
    #[inline]
    pub(crate) unsafe fn retire(&mut self, node: NonNull<u8>, epoch: Epoch) {
        // A batch newer than `epoch` (another thread's operation, in a shared slot) only
        // makes the node wait longer.
        if let Some((newest, batch)) = self.retired.back_mut()
            && *newest >= epoch
        {
            batch.push(node);
            return;
        }
        self.promote(epoch);
        let mut batch = std::mem::take(&mut self.spare);
        batch.push(node);
        self.retired.push_back((epoch, batch));
    }

    /// Moves the batches that INV-NODE-1 releases for an operation of `epoch` to the ready
    /// nodes. Ready nodes beyond [`READY_LIMIT`] that are still there when the next batch
    /// comes were more than the slot's operations linked meanwhile: they are freed.
    fn promote(&mut self, epoch: Epoch) {
        let mut trimmed = false;
        while let Some(&(retired, _)) = self.retired.front() {
            if retired.plus(2) > epoch {
                return;
            }
            let Some((_, mut batch)) = self.retired.pop_front() else {
                return;
            };
            if !trimmed {
                trimmed = true;
                for node in self.ready.drain(READY_LIMIT.min(self.ready.len())..) {
                    // SAFETY: ready nodes came from `alloc` (`retire`'s contract) and no
                    // operation holds them (INV-NODE-1).
                    unsafe { free(node) };
                }
            }
            self.ready.append(&mut batch);
            if self.spare.capacity() < batch.capacity() {
                self.spare = batch;
            }
        }
    }
}

impl Drop for NodeCache {
    fn drop(&mut self) {
        // The slots are dropped with the heap: no operation of it runs, so none holds a node.
        let retired = self.retired.drain(..).flat_map(|(_, batch)| batch);
        for node in self.ready.drain(..).chain(retired) {
            // SAFETY: every node in the cache came from `alloc` and is used by nobody (above).
            unsafe { free(node) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes come back two epochs after the epoch that retired them, not before, and a
    /// consumer's cache keeps at most `READY_LIMIT` of them beyond its latest batch.
    #[test]
    fn retired_nodes_are_reused_from_two_epochs_later() {
        let mut cache = NodeCache::default();
        let first = cache.take(Epoch::new(5));
        // SAFETY: `first` came from `alloc` (through `take`) and is retired once.
        unsafe { cache.retire(first, Epoch::new(5)) };
        let again = cache.take(Epoch::new(6));
        assert_ne!(
            again, first,
            "a node came back one epoch after it was retired"
        );
        let later = cache.take(Epoch::new(7));
        assert_eq!(later, first, "a node retired two epochs ago was not reused");
        // A consumer: it retires many nodes and takes few.
        let many = (0..2 * READY_LIMIT).map(|_| alloc()).chain([again, later]);
        for node in many {
            // SAFETY: from `alloc` or `take`, retired once each.
            unsafe { cache.retire(node, Epoch::new(8)) };
        }
        let taken = cache.take(Epoch::new(10));
        assert_eq!(cache.ready.len(), 2 * READY_LIMIT + 1);
        // SAFETY: from `take`, retired once.
        unsafe { cache.retire(taken, Epoch::new(10)) };
        let extra = alloc();
        // SAFETY: from `alloc`, retired once. The new batch releases the one of epoch 10, and
        // the ready nodes left unused since epoch 10 are cut to the limit first.
        unsafe { cache.retire(extra, Epoch::new(12)) };
        assert_eq!(cache.ready.len(), READY_LIMIT + 1);
        assert_eq!(cache.retired.len(), 1);
    }
}
