//! [`NbQueue`]: a nonblocking buffered durably linearizable FIFO queue.
//!
//! Elements are payloads laid out as [`Queue`](crate::Queue)'s (a sequence number, then
//! the element), with the same type id, so either queue can open what the other wrote.
//! The DRAM index is montage-core's [`VerifiedQueue`], a Michael-Scott queue whose linking
//! and head swaps are epoch-verified; the sequence number of an element is its
//! predecessor's plus one, fixed before it is linked, so recovery rebuilds the order by
//! sorting the recovered payloads.
//!
//! # Linearization points
//!
//! `push_back` writes its payload (with its sequence number, the tail's plus one), then
//! linearizes at the verified swap that links its node; `pop_front` claims the front
//! element's payload (its anti-block) and linearizes at the verified swap of the head; a
//! failed swap aborts the operation (undoing the payload work) and runs it again. A swap
//! fails only because another operation's succeeded or the clock moved on, and no thread
//! waits for another inside one, so the queue is lock-free, as
//! [`NbHashMap`](crate::NbHashMap)'s progress section says. `pop_front` on an
//! empty queue linearizes at its read of the head, and aborts if an operation newer than
//! it emptied the queue.
//!
//! # Blocks handed out again at once
//!
//! A pop of an element pushed in the same epoch gives its block back to the popping thread
//! when its operation ends ([`OpGuard::delete_viewed_unshared`]), as the locked queue does,
//! although another pop that read the head before the winner's swap may still read that
//! block, finding it free, rewritten for a new element, or another structure's. Such a pop
//! always fails its swap and rolls back, so what it read never leaves it; until then it
//! must not act on another payload or report an error for one. So it claims the block
//! only if the view shows an element of this queue and only through its view (which
//! `delete_viewed_unshared` refuses once the header changed), and an error from its read is
//! turned into a retry when the head has moved on ([`VerifiedQueue::pop`]). A claim it
//! made on a new element of this queue is given back by its rollback, which clears the
//! retired bit only if the meta word is still the one it set, so a block killed meanwhile
//! stays dead. [`to_vec`](NbQueue::to_vec) drops an element that was popped while it read
//! it.

use std::marker::PhantomData;

#[cfg(doc)]
use montage_core::OpGuard;
use montage_core::payload::EncodeAs;
use montage_core::verified::VerifiedQueue;
use montage_core::{Attached, Codec, Error, Heap, PBlock, Result};

use crate::count::Count;
use crate::queue;
use crate::structure::contended;

/// A nonblocking concurrent FIFO queue whose elements survive crashes (module docs).
pub struct NbQueue<T> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    index: VerifiedQueue,
    len: Count,
    _element: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for NbQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbQueue")
            .field("owner", &self.attached.owner())
            .finish_non_exhaustive()
    }
}

impl<T: Codec> NbQueue<T> {
    /// Opens the queue named `name` in `heap`, creating it if the heap has no structure of
    /// that name, and rebuilding it from its payloads (in sequence order) if it has.
    ///
    /// # Errors
    ///
    /// As [`Queue::open`](crate::Queue::open).
    pub fn open(heap: &Heap, name: &str) -> Result<NbQueue<T>> {
        let type_id = queue::type_id::<T>()?;
        let (attached, elements) =
            queue::open_elements::<T>(heap, name, "montage_collections::NbQueue element")?;
        let mut index = VerifiedQueue::new(elements.first().map_or(0, |&(seq, _)| seq));
        for &(seq, block) in &elements {
            index.push_recovered(block.offset(), seq);
        }
        Ok(NbQueue {
            attached,
            type_id,
            index,
            len: Count::new(elements.len()),
            _element: PhantomData,
        })
    }

    /// Appends `value` at the back.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full (nothing changed); a heap error.
    #[allow(clippy::needless_pass_by_value)] // as `VecDeque::push_back`: the queue keeps it
    pub fn push_back(&self, value: T) -> Result<()> {
        self.push_back_ref(&value)
    }

    /// Appends a value given in any form that encodes as a `T`, as
    /// [`Queue::push_back_ref`](crate::Queue::push_back_ref) does.
    ///
    /// # Errors
    ///
    /// As [`push_back`](Self::push_back).
    pub fn push_back_ref<Q: EncodeAs<T> + ?Sized>(&self, value: &Q) -> Result<()> {
        queue::encode_element::<T, Q, _>(value, |bytes| {
            self.attached.heap().run_op(|op| {
                // The payload is written once the sequence number is known, so that it
                // goes in with the bytes; only a retried link (another push linked first)
                // writes a new number into it.
                let mut written: Option<PBlock> = None;
                self.index.push_with(op, |seq| {
                    let seq = seq.to_le_bytes();
                    let block = if let Some(block) = written {
                        op.write(block, 0, &seq)?;
                        block
                    } else {
                        bytes[..8].copy_from_slice(&seq);
                        *written.insert(op.alloc(self.attached.owner(), self.type_id, bytes)?)
                    };
                    Ok(block.offset())
                })?;
                self.len.increment();
                Ok(())
            })
        })
    }

    /// Removes and returns the front element.
    ///
    /// # Errors
    ///
    /// A heap error ([`Error::Corrupted`] for an element that does not decode, ...).
    pub fn pop_front(&self) -> Result<Option<T>> {
        self.attached.heap().run_op(|op| {
            let mut value = None;
            let popped = self.index.pop(op, |offset, _| {
                let block = PBlock::from_offset(offset);
                let view = op.view(block).map_err(contended)?;
                // A pop that lost the race for the head may be reading a block handed out
                // again since, even to another structure (module docs): it claims nothing
                // but an element of this queue, and its swap fails whatever it read.
                let spec = view.info().spec;
                if spec.owner != self.attached.owner() || spec.type_id != self.type_id {
                    return Err(Error::Aborted);
                }
                value = Some(queue::read_value::<T>(&view)?);
                op.delete_viewed_unshared(&view).map_err(contended)
            })?;
            if popped.is_none() {
                return Ok(None);
            }
            self.len.decrement();
            Ok(value)
        })
    }

    /// The elements this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged):
    /// their blocks, left out of it and never returned as data. Empty for an undamaged heap.
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    /// The number of elements (exact when no other thread is changing the queue).
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Whether the queue is empty (as [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element, front to back, read in one operation (a traversal, not a snapshot
    /// while others change the queue).
    ///
    /// # Errors
    ///
    /// As [`pop_front`](Self::pop_front).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.attached.heap().run_op(|op| {
            let read: Vec<(u64, Result<T>)> = self
                .index
                .to_vec(op)?
                .into_iter()
                .map(|(offset, seq)| {
                    let value = op
                        .view(PBlock::from_offset(offset))
                        .map_err(contended)
                        .and_then(|view| queue::read_value::<T>(&view));
                    (seq, value)
                })
                .collect();
            // An element popped while it was read may have had its block handed out again
            // (module docs): what was read of it is nothing, not an error. One still queued
            // after every read (`dequeued` reads the head after them) was read whole.
            let dequeued = self.index.dequeued(op)?;
            read.into_iter()
                .filter(|&(seq, _)| !dequeued.includes(seq))
                .map(|(_, value)| value)
                .collect()
        })
    }

    /// The heap the queue lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}
