//! [`Queue`]: a buffered durably linearizable FIFO queue.
//!
//! Every element is one payload holding a sequence number and the element's encoding
//! (`u64` little-endian, then the [`Codec`] bytes); the DRAM index is a deque of
//! (sequence number, block) under one lock. Sequence numbers increase in enqueue order, so
//! recovery rebuilds the order by sorting the recovered payloads by them.
//!
//! # Linearization points
//!
//! Every change runs in one operation, and the reads (`front`, `to_vec`) in none, as
//! `HashMap`'s (`docs/design.md`, "Reads outside operations"); each holds the queue lock
//! while it changes or reads the queue. `push_back` linearizes when it appends its element, `pop_front` at its deletion of
//! the front element, `front` and `len` at their read. `push_back` writes its payload before
//! it takes the lock, with the sequence number it expects to get (the one after the last
//! append it saw), so that the lock is held only to append; when another push took that
//! number first, it writes the right one into its payload in place, under the lock. The
//! queue remembers the epoch of the last operation that changed it; an operation of an
//! older epoch that takes the lock after it aborts and is retried (the lock is a
//! `StampedLock`), so the lock order agrees with epoch order and recovery to any epoch
//! boundary gives the queue after a prefix of it.
//!
//! Every read of an element's payload holds the queue lock, and a pop removes the element
//! from the deque under it, so once the pop's operation ends no one can reach the block: a
//! pop of an element pushed in the same epoch hands its block out again at once
//! ([`OpGuard::delete_viewed_unshared`]), while it is still in the processor's cache,
//! instead of three epochs later. A queue that holds less than an epoch's pushes (the
//! usual case for a work queue) then reuses its own blocks, as a queue in DRAM reuses
//! memory its allocator just freed.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use montage_core::payload::{EncodeAs, Encoded};
use montage_core::stamped::StampedGuard;
use montage_core::{Attached, BlockView, Codec, Error, Heap, OpGuard, PBlock, Result, StampedLock};

use crate::structure::{self, lock};
#[cfg(doc)]
use crate::together;
use crate::together::{Staged, StagedId, Together};

/// The DRAM side of the queue.
#[derive(Debug)]
struct State {
    elements: VecDeque<(u64, PBlock)>,
}

/// A concurrent FIFO queue whose elements survive crashes (module docs).
pub struct Queue<T> {
    /// The heap, the structure's owner id, and its name held for this handle (a second
    /// open fails while it lives).
    attached: Attached,
    type_id: u64,
    state: StampedLock<State>,
    /// The next sequence number to give out. Changed only with `state` locked; a push also
    /// reads it without the lock, as a guess of the number it will get (module docs).
    next_seq: AtomicU64,
    _element: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("owner", &self.attached.owner())
            .finish_non_exhaustive()
    }
}

impl<T> Queue<T> {
    /// The next sequence number, read by a caller holding the queue's lock.
    fn locked_next_seq(&self) -> u64 {
        // ORDERING: Relaxed: every change is made under the lock, whose acquisition orders
        // it before this read.
        self.next_seq.load(Ordering::Relaxed)
    }
}

fn corrupted(offset: u64) -> Error {
    Error::Corrupted {
        offset,
        what: "a queue element does not decode as the element type",
    }
}

/// The sequence number and element of an element payload.
pub(crate) fn decode<T: Codec>(bytes: &[u8], offset: u64) -> Result<(u64, T)> {
    let seq = structure::seq_prefix(bytes).ok_or_else(|| corrupted(offset))?;
    let value = bytes
        .get(8..)
        .and_then(T::decode)
        .ok_or_else(|| corrupted(offset))?;
    Ok((seq, value))
}

/// Runs `f` with an element's bytes, a zero sequence number followed by `value` encoded as
/// a `T`, in this thread's encoding buffer.
pub(crate) fn encode_element<T: Codec, Q: EncodeAs<T> + ?Sized, R>(
    value: &Q,
    f: impl FnOnce(&mut [u8]) -> Result<R>,
) -> Result<R> {
    structure::with_encode_buffer(|bytes| {
        bytes.clear();
        bytes.extend_from_slice(&[0; 8]);
        value.encode_as(bytes)?;
        f(bytes)
    })
}

/// The value of the element `view` shows, copied out of the heap once (the sequence number
/// is not read; see [`Codec::decode_from`]).
pub(crate) fn read_value<T: Codec>(view: &BlockView<'_>) -> Result<T> {
    let offset = view.info().block.offset();
    let len = u64::from(view.info().len)
        .checked_sub(8)
        .ok_or_else(|| corrupted(offset))?;
    T::decode_from(Encoded::in_payload(view, 8, len as usize)?)?.ok_or_else(|| corrupted(offset))
}

/// The type id of a queue's element payloads.
pub(crate) fn type_id<T: Codec>() -> Result<u64> {
    Ok(structure::type_id_of("queue", &[T::codec_id()?]))
}

/// Finds or creates the queue `name` (of either kind; `type_name` names it in errors) and
/// returns its attachment and its recovered elements as (sequence number, block), in order.
pub(crate) fn open_elements<T: Codec>(
    heap: &Heap,
    name: &str,
    type_name: &'static str,
) -> Result<(Attached, Vec<(u64, PBlock)>)> {
    let attached = heap.attach(name)?;
    let (owner, existed) = (attached.owner(), attached.existed());
    if !existed {
        return Ok((attached, Vec::new()));
    }
    let found = Mutex::new(Vec::new());
    structure::scan_payloads(
        heap,
        owner,
        &[type_id::<T>()?],
        type_name,
        |_, block, bytes| {
            let (seq, _) = decode::<T>(bytes, block.offset())?;
            lock(&found).push((seq, block));
            Ok(())
        },
    )?;
    let mut elements = found.into_inner().unwrap_or_else(PoisonError::into_inner);
    sort_checked(&mut elements)?;
    Ok((attached, elements))
}

/// Sorts recovered (sequence number, block) pairs, rejecting a repeated number.
fn sort_checked(elements: &mut [(u64, PBlock)]) -> Result<()> {
    elements.sort_unstable_by_key(|&(seq, _)| seq);
    match elements.windows(2).find(|w| w[0].0 == w[1].0) {
        Some(pair) => Err(Error::Corrupted {
            offset: pair[1].1.offset(),
            what: "two queue elements have the same sequence number",
        }),
        None => Ok(()),
    }
}

impl<T: Codec> Queue<T> {
    /// Opens the queue named `name` in `heap`, creating it if the heap has no structure of
    /// that name, and rebuilding it from its payloads (in sequence order) if it has.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the queue was written with another element type;
    /// [`Error::Corrupted`] if an element does not decode or two share a sequence number;
    /// [`Error::DirectoryFull`] or [`Error::BadName`] when creating it.
    pub fn open(heap: &Heap, name: &str) -> Result<Queue<T>> {
        let type_id = type_id::<T>()?;
        let (attached, elements) =
            open_elements::<T>(heap, name, "montage_collections::Queue element")?;
        // `decode` bounds every number, so this cannot overflow.
        let next_seq = elements.last().map_or(0, |&(seq, _)| seq + 1);
        Ok(Queue {
            attached,
            type_id,
            state: StampedLock::new(State {
                elements: elements.into(),
            }),
            next_seq: AtomicU64::new(next_seq),
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

    /// Appends a value given in any form that encodes as a `T` (see [`EncodeAs`]: a `&[u8]`
    /// for `Vec<u8>` elements, a `&str` for `String` ones, or a `&T`), as
    /// [`push_back`](Self::push_back) does. The queue only copies an element into the heap,
    /// so a caller holding bytes need not build an owned `T` first.
    ///
    /// ```
    /// # use montage_core::{Heap, HeapConfig};
    /// # use montage_collections::Queue;
    /// # let heap = Heap::create(&HeapConfig::in_memory(8 << 20))?;
    /// let queue: Queue<Vec<u8>> = Queue::open(&heap, "jobs")?;
    /// let received: &[u8] = b"straight from a socket buffer";
    /// queue.push_back_ref(received)?;
    /// assert_eq!(queue.pop_front()?.as_deref(), Some(received));
    /// # Ok::<(), montage_core::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`push_back`](Self::push_back).
    pub fn push_back_ref<Q: EncodeAs<T> + ?Sized>(&self, value: &Q) -> Result<()> {
        encode_element::<T, Q, _>(value, |bytes| {
            self.attached.heap().run_op(|op| self.push_in(op, bytes))
        })
    }

    fn push_in(&self, op: &OpGuard<'_>, bytes: &mut [u8]) -> Result<()> {
        // ORDERING: Relaxed: only a guess, checked under the lock.
        self.push_expecting(op, bytes, self.next_seq.load(Ordering::Relaxed))
    }

    /// [`push_in`](Self::push_in) with the number it expects to get, `expected`: the payload
    /// is written with it before the lock is taken; an abort at the lock (a newer epoch
    /// changed the queue) kills the block again.
    fn push_expecting(&self, op: &OpGuard<'_>, bytes: &mut [u8], expected: u64) -> Result<()> {
        let mut block = self.write_element(op, bytes, expected)?;
        let mut state = self.state.lock(op)?;
        let seq = self.locked_next_seq();
        if seq != expected {
            // Another push took it: the right number, in place (the block is this
            // operation's own).
            block = op.write(block, 0, &seq.to_le_bytes())?;
        }
        self.append(&mut state, seq, block);
        Ok(())
    }

    /// A push with the queue locked (`state`), for a [`together()`] that holds the lock
    /// throughout: the number is known before the payload is written.
    fn push_locked(
        &self,
        op: &OpGuard<'_>,
        state: &mut StampedGuard<'_, State>,
        bytes: &mut [u8],
    ) -> Result<()> {
        let seq = self.locked_next_seq();
        let block = self.write_element(op, bytes, seq)?;
        self.append(state, seq, block);
        Ok(())
    }

    /// Writes the element `bytes` (its sequence number still to fill in) numbered `seq` into
    /// a new payload.
    fn write_element(&self, op: &OpGuard<'_>, bytes: &mut [u8], seq: u64) -> Result<PBlock> {
        bytes[..8].copy_from_slice(&seq.to_le_bytes());
        op.alloc(self.attached.owner(), self.type_id, bytes)
    }

    /// Appends the element numbered `seq` (the queue's next number) in `block`; the caller
    /// holds the lock (`state`).
    fn append(&self, state: &mut StampedGuard<'_, State>, seq: u64, block: PBlock) {
        state.elements.push_back((seq, block));
        // ORDERING: Relaxed, as in `locked_next_seq`; a push reading it without the lock
        // only guesses.
        self.next_seq.store(seq + 1, Ordering::Relaxed);
    }

    /// Removes and returns the front element.
    ///
    /// # Errors
    ///
    /// A heap error ([`Error::Corrupted`] for an element that does not decode, ...).
    pub fn pop_front(&self) -> Result<Option<T>> {
        self.attached.heap().run_op(|op| self.pop_in(op))
    }

    fn pop_in(&self, op: &OpGuard<'_>) -> Result<Option<T>> {
        Ok(Self::pop_locked(op, &mut self.state.lock(op)?)?.map(|(value, _)| value))
    }

    /// [`pop_in`](Self::pop_in)'s step with the queue locked (`state`); also returns the
    /// element's sequence number and block.
    fn pop_locked(
        op: &OpGuard<'_>,
        state: &mut StampedGuard<'_, State>,
    ) -> Result<Option<(T, (u64, PBlock))>> {
        let Some(&(_, block)) = state.elements.front() else {
            return Ok(None);
        };
        let view = op.view(block)?;
        let value = read_value(&view)?;
        // The header the view read is the one to retire: no second read. Every reader of an
        // element holds the queue lock, which this pop holds (module docs).
        op.delete_viewed_unshared(&view)?;
        Ok(state.elements.pop_front().map(|element| (value, element)))
    }

    /// The front element, without removing it.
    ///
    /// # Errors
    ///
    /// As [`pop_front`](Self::pop_front).
    pub fn front(&self) -> Result<Option<T>> {
        // No operation: the queue lock keeps the element live and its bytes still while it
        // is read (module docs).
        let heap = self.attached.heap();
        Self::front_locked(&self.state.lock_outside_op(), |block| heap.view(block))
    }

    /// [`front`](Self::front) with the queue locked (`state`), the element's block viewed
    /// by `view` (in an operation, or outside any while the caller holds the lock).
    fn front_locked<'h>(
        state: &State,
        view: impl FnOnce(PBlock) -> Result<BlockView<'h>>,
    ) -> Result<Option<T>> {
        match state.elements.front() {
            Some(&(_, block)) => Ok(Some(read_value(&view(block)?)?)),
            None => Ok(None),
        }
    }

    /// The elements this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged):
    /// their blocks, left out of it and never returned as data. Empty for an undamaged heap.
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.state.lock_outside_op().elements.len()
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element, front to back, read under the queue lock (outside any operation, as
    /// [`front`](Self::front)).
    ///
    /// # Errors
    ///
    /// As [`pop_front`](Self::pop_front).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let heap = self.attached.heap();
        let state = self.state.lock_outside_op();
        state
            .elements
            .iter()
            .map(|&(_, block)| Ok(decode(&heap.read_payload(block)?, block.offset())?.1))
            .collect()
    }

    /// The heap the queue lives in.
    pub fn heap(&self) -> &Heap {
        self.attached.heap()
    }
}

impl<'h, 'o> Together<'h, '_, 'o> {
    /// Changes `queue` in this [`together()`]: `f` gets a view of it whose methods read and
    /// write as the queue's own do, and see the changes made before them; they are kept
    /// (and a crash keeps them) with the together's other changes, or taken back with
    /// them. The queue stays locked until the together ends. [`Together::hash_map`] has an
    /// example.
    ///
    /// # Errors
    ///
    /// What `f` returns; [`Error::Unsupported`] for a queue of another heap or one taken
    /// already in this together; [`Error::Aborted`] when the together must run again (it
    /// does, if the closure returns it).
    pub fn queue<T, R>(
        &mut self,
        queue: &'h Queue<T>,
        f: impl FnOnce(&mut TogetherQueue<'_, 'o, 'h, T>) -> Result<R>,
    ) -> Result<R>
    where
        T: Codec + 'h,
    {
        let part = |op| {
            Ok(QueuePart {
                queue,
                state: queue.state.lock(op)?,
                undo: Vec::new(),
            })
        };
        self.with_part(queue.heap(), queue, part, |part, op| {
            f(&mut TogetherQueue { part, op })
        })
    }
}

/// A queue one [`together()`] locked, and how to take back its changes.
struct QueuePart<'h, T> {
    queue: &'h Queue<T>,
    state: StampedGuard<'h, State>,
    /// The changes, in order.
    undo: Vec<Undo>,
}

/// A change of a queue, as a [`together()`] takes it back.
#[derive(Debug)]
enum Undo {
    /// An element pushed at the back: take it off (and its sequence number back).
    Pushed,
    /// This element popped from the front: put it back.
    Popped((u64, PBlock)),
}

impl<'h, T> Staged<'h> for QueuePart<'h, T> {
    fn id(&self) -> StagedId {
        (std::ptr::from_ref(self.queue).cast(), 0)
    }

    fn commit(&mut self) {
        self.undo.clear();
    }
}

/// Takes the changes back, last first, unless they were kept: the operation was rolled
/// back, and the queue is still locked.
impl<T> Drop for QueuePart<'_, T> {
    fn drop(&mut self) {
        while let Some(undo) = self.undo.pop() {
            let state = &mut *self.state;
            match undo {
                Undo::Pushed => {
                    state.elements.pop_back();
                    let queue = self.queue;
                    // ORDERING: as in `append`, with the lock held.
                    queue
                        .next_seq
                        .store(queue.locked_next_seq() - 1, Ordering::Relaxed);
                }
                Undo::Popped(element) => state.elements.push_front(element),
            }
        }
    }
}

/// A [`Queue`] changed in a [`together()`] ([`Together::queue`]).
pub struct TogetherQueue<'a, 'o, 'h, T> {
    part: &'a mut QueuePart<'h, T>,
    op: &'a OpGuard<'o>,
}

impl<T> std::fmt::Debug for TogetherQueue<'_, '_, '_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TogetherQueue")
            .field("owner", &self.part.queue.attached.owner())
            .field("len", &self.part.state.elements.len())
            .field("changes", &self.part.undo.len())
            .finish()
    }
}

impl<T: Codec> TogetherQueue<'_, '_, '_, T> {
    /// As [`Queue::push_back`].
    ///
    /// # Errors
    ///
    /// As [`Queue::push_back`].
    #[allow(clippy::needless_pass_by_value)] // as `Queue::push_back`
    pub fn push_back(&mut self, value: T) -> Result<()> {
        self.push_back_ref(&value)
    }

    /// As [`Queue::push_back_ref`].
    ///
    /// # Errors
    ///
    /// As [`Queue::push_back`].
    pub fn push_back_ref<Q: EncodeAs<T> + ?Sized>(&mut self, value: &Q) -> Result<()> {
        let part = &mut *self.part;
        encode_element::<T, Q, _>(value, |bytes| {
            part.queue.push_locked(self.op, &mut part.state, bytes)
        })?;
        part.undo.push(Undo::Pushed);
        Ok(())
    }

    /// As [`Queue::pop_front`].
    ///
    /// # Errors
    ///
    /// As [`Queue::pop_front`].
    pub fn pop_front(&mut self) -> Result<Option<T>> {
        let popped = Queue::pop_locked(self.op, &mut self.part.state)?;
        Ok(popped.map(|(value, element)| {
            self.part.undo.push(Undo::Popped(element));
            value
        }))
    }

    /// As [`Queue::front`].
    ///
    /// # Errors
    ///
    /// As [`Queue::pop_front`].
    pub fn front(&self) -> Result<Option<T>> {
        Queue::front_locked(&self.part.state, |block| self.op.view(block))
    }

    /// The number of elements, with this together's changes.
    pub fn len(&self) -> usize {
        self.part.state.elements.len()
    }

    /// Whether the queue is empty, with this together's changes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::structure::SEQ_LIMIT;
    use montage_core::HeapConfig;
    use montage_core::sim::SimMode;

    /// Found by the `entry_decode` fuzz target: an element whose sequence number is
    /// `u64::MAX` made `open` overflow computing the next one.
    #[test]
    fn a_sequence_number_past_the_limit_is_corruption() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        5u64.encode(&mut bytes).unwrap();
        assert!(matches!(
            decode::<u64>(&bytes, 0x40),
            Err(Error::Corrupted { offset: 0x40, .. })
        ));
        bytes[..8].copy_from_slice(&SEQ_LIMIT.to_le_bytes());
        assert_eq!(decode::<u64>(&bytes, 0x40).unwrap(), (SEQ_LIMIT, 5));
    }

    /// A push whose expected number another push took first writes the right one into its
    /// payload, where recovery finds it.
    #[test]
    fn a_push_that_expected_a_taken_number_writes_the_right_one() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "q").unwrap();
        queue.push_back(1).unwrap();
        queue.push_back(2).unwrap();
        // As if this push had read the number before the two appends.
        encode_element::<u64, u64, _>(&3u64, |bytes| {
            heap.run_op(|op| queue.push_expecting(op, bytes, 0))
        })
        .unwrap();
        let (seq, block) = *queue.state.lock_outside_op().elements.back().unwrap();
        assert_eq!(seq, 2);
        let bytes = heap.read_payload(block).unwrap();
        assert_eq!(decode::<u64>(&bytes, block.offset()).unwrap(), (2, 3));
        heap.sync().unwrap();
        drop(queue);
        // Rebuilt from the payloads alone.
        let reopened: Queue<u64> = Queue::open(&heap, "q").unwrap();
        assert_eq!(reopened.to_vec().unwrap(), vec![1, 2, 3]);
    }

    /// An operation of epoch `e` must not act on a queue a newer operation changed.
    #[test]
    fn an_older_operation_that_meets_a_newer_change_aborts() {
        let heap = Heap::create(&HeapConfig::simulated(1 << 20, SimMode::Prefix)).unwrap();
        let queue: Queue<u64> = Queue::open(&heap, "q").unwrap();
        queue.push_back(1).unwrap();
        structure::with_older_operation(
            &heap,
            || assert_eq!(queue.pop_front().unwrap(), Some(1)),
            |old| {
                assert!(matches!(queue.pop_in(old), Err(Error::Aborted)));
                let mut bytes = vec![0u8; 16];
                assert!(matches!(
                    queue.push_in(old, &mut bytes),
                    Err(Error::Aborted)
                ));
            },
        );
        assert_eq!(queue.pop_front().unwrap(), None);
    }
}
