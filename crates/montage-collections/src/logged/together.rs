//! [`together`]: calls on several logged structures (or shards) in one heap operation, so
//! that a crash keeps all of them or none.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use montage_core::{Error, Heap, OpGuard, Result};

use super::core::{Core, Record, encode_record};
use super::{Logged, Replay, Shard};
use crate::structure::{self, lock};

/// Held by each [`together`] from before its operation begins to after it ends: one
/// operation at a time holds the locks of several shards, so no two wait for each other's
/// (a single call holds one lock and waits for nothing while it does).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `calls` in one heap operation and returns what it returns: every call it makes
/// through [`Together::log`] (or [`Together::log_shard`]) is logged and applied as
/// [`Logged::apply`] does, and a crash keeps all of them or none. Their records are in the
/// same epoch, so each structure's log stays a prefix of its calls.
///
/// Each call's structure (or shard) is locked for writing from its `log` to the end of the
/// operation, and the calls are applied, in the order they were logged, only once `calls`
/// has returned `Ok`: an error from it (or from a `log`, such as a full heap) leaves every
/// structure as it was. So a call's output is not known inside `calls`; `log` returns a
/// [`Ticket`] that gives it once `together` has returned. To decide what to log on a
/// structure from its own state, use [`Together::log_with`], which locks it first. `calls`
/// may run more than once (as the body of [`Heap::run_op`] does, when the clock moved under
/// it).
///
/// One structure or shard can be called once per `together` (two changes of one structure
/// are one operation of its own). Operations of `together` run one at a time in the process;
/// single calls run beside them.
///
/// ```
/// use montage_collections::logged::{Replay, together};
/// use montage_collections::Logged;
/// use montage_core::{Heap, HeapConfig};
///
/// /// A balance; an operation adds to it.
/// #[derive(Default)]
/// struct Account(i64);
///
/// impl Replay for Account {
///     type Op = i64;
///     type Output = i64;
///
///     fn apply(&mut self, change: i64) -> i64 {
///         self.0 += change;
///         self.0
///     }
/// }
///
/// let heap = Heap::create(&HeapConfig::in_memory(4 << 20))?;
/// let ann = Logged::<Account>::open(&heap, "ann")?;
/// let bob = Logged::<Account>::open(&heap, "bob")?;
/// ann.apply(100)?;
/// // A transfer: both changes, or (after a crash) neither.
/// let (from, to) = together(&heap, |tx| {
///     // At most 30, decided under ann's lock: no call changes her balance meanwhile.
///     let (from, amount) = tx.log_with(&ann, |a| {
///         let amount = a.0.min(30);
///         (-amount, amount)
///     })?;
///     Ok((from, tx.log(&bob, amount)?))
/// })?;
/// assert_eq!((from.take(), to.take()), (Some(70), Some(30)));
/// # Ok::<(), montage_core::Error>(())
/// ```
///
/// # Errors
///
/// What `calls` returns; [`Error::Unsupported`] from a `log` for a structure of another
/// heap or one called already in this `together`; otherwise as [`Logged::apply`] (then no
/// call was logged or applied).
///
/// # Panics
///
/// If a call's [`Replay::apply`] panics: the operation is rolled back (no record of it is
/// kept), the structures already changed by it and the one that panicked are poisoned as
/// [`Logged::apply`] says, and the panic goes on to the caller.
pub fn together<'h, R>(
    heap: &Heap,
    mut calls: impl FnMut(&mut Together<'h, '_, '_>) -> Result<R>,
) -> Result<R> {
    let _one = lock(&ONE_AT_A_TIME);
    let mut panic = None;
    let result = heap.run_op(|op| {
        let mut tx = Together {
            heap,
            op,
            calls: Vec::new(),
        };
        let value = calls(&mut tx)?;
        let mut requests = Vec::new();
        for at in 0..tx.calls.len() {
            match tx.calls[at].apply() {
                Ok(request) => requests.extend(request),
                Err(payload) => {
                    // The calls before it changed their structures, and the abort takes
                    // their records back: they are poisoned too.
                    for call in &tx.calls[..at] {
                        call.poison();
                    }
                    panic = Some(payload);
                    return Err(Error::Panicked {
                        structure: tx.calls[at].name().to_owned(),
                    });
                }
            }
        }
        Ok((value, requests))
    });
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
    let (value, requests) = result?;
    for request in requests {
        request();
    }
    Ok(value)
}

/// The calls of one [`together`], made in its operation.
pub struct Together<'h, 'g, 'o> {
    heap: &'g Heap,
    op: &'g OpGuard<'o>,
    calls: Vec<Box<dyn Pending<'h> + 'h>>,
}

impl std::fmt::Debug for Together<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Together")
            .field("epoch", &self.op.epoch())
            .field("calls", &self.calls.len())
            .finish()
    }
}

impl<'h> Together<'h, '_, '_> {
    /// Logs `op` on `handle`'s structure, to be applied when the operation commits.
    ///
    /// # Errors
    ///
    /// As [`together`].
    pub fn log<T>(&mut self, handle: &'h Logged<T>, op: T::Op) -> Result<Ticket<T::Output>>
    where
        T: Replay + Send + Sync + 'static,
    {
        Ok(self.call(&handle.core, 0, |_| (op, ()))?.0)
    }

    /// Logs `op` on `shard`, to be applied when the operation commits.
    ///
    /// # Errors
    ///
    /// As [`together`].
    pub fn log_shard<T>(&mut self, shard: &Shard<'h, T>, op: T::Op) -> Result<Ticket<T::Output>>
    where
        T: Replay + Send + Sync + 'static,
    {
        Ok(self.call(shard.core, shard.index, |_| (op, ()))?.0)
    }

    /// Logs on `handle`'s structure the operation `decide` chooses from its value (the
    /// first part of what `decide` returns; the second is returned with the ticket). The
    /// structure is locked before `decide` runs, so no other call changes it between the
    /// decision and the commit: a read, a decision and a change, atomic together.
    ///
    /// # Errors
    ///
    /// As [`together`].
    pub fn log_with<T, X>(
        &mut self,
        handle: &'h Logged<T>,
        decide: impl FnOnce(&T) -> (T::Op, X),
    ) -> Result<(Ticket<T::Output>, X)>
    where
        T: Replay + Send + Sync + 'static,
    {
        self.call(&handle.core, 0, decide)
    }

    /// [`log_with`](Self::log_with) on a shard.
    ///
    /// # Errors
    ///
    /// As [`together`].
    pub fn log_shard_with<T, X>(
        &mut self,
        shard: &Shard<'h, T>,
        decide: impl FnOnce(&T) -> (T::Op, X),
    ) -> Result<(Ticket<T::Output>, X)>
    where
        T: Replay + Send + Sync + 'static,
    {
        self.call(shard.core, shard.index, decide)
    }

    fn call<T, X>(
        &mut self,
        core: &'h Arc<Core<T>>,
        index: usize,
        decide: impl FnOnce(&T) -> (T::Op, X),
    ) -> Result<(Ticket<T::Output>, X)>
    where
        T: Replay + Send + Sync + 'static,
    {
        core.check_poisoned()?;
        if !core.attached().heap().same_heap(self.heap) {
            return Err(Error::Unsupported {
                what: "a logged structure of another heap in `together`",
            });
        }
        let id = (Arc::as_ptr(core).cast::<()>(), index);
        if self.calls.iter().any(|call| call.id() == id) {
            return Err(Error::Unsupported {
                what: "a logged structure (or shard) called twice in one `together`",
            });
        }
        let state = core.lock_shard(index, self.op)?;
        let (op, extra) = decide(&state.value);
        let record = structure::with_encode_buffer(|bytes| {
            encode_record(&op, bytes)?;
            core.write_record(state, index, self.op, bytes)
        })?;
        let output = Rc::new(RefCell::new(None));
        self.calls.push(Box::new(Call {
            core,
            index,
            record,
            op: Some(op),
            output: Rc::clone(&output),
        }));
        Ok((Ticket(output), extra))
    }
}

/// What a call of [`Together::log`] returns: its output, once [`together`] has returned.
pub struct Ticket<O>(Rc<RefCell<Option<O>>>);

impl<O> std::fmt::Debug for Ticket<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("ready", &self.0.borrow().is_some())
            .finish()
    }
}

impl<O> Ticket<O> {
    /// The call's output: `Some` once the [`together`] that logged it returned `Ok` (`None`
    /// for a ticket of an attempt that did not commit).
    pub fn take(self) -> Option<O> {
        self.0.borrow_mut().take()
    }
}

/// A logged call waiting for its operation's end, type-erased.
trait Pending<'h> {
    /// Which structure and shard it is on.
    fn id(&self) -> (*const (), usize);
    /// The structure's name.
    fn name(&self) -> &str;
    /// Applies it; returns the snapshot request the policy made, or the panic of `apply`
    /// (the structure is then poisoned).
    fn apply(&mut self) -> std::thread::Result<Option<Box<dyn FnOnce() + 'h>>>;
    fn poison(&self);
}

struct Call<'h, T: Replay> {
    core: &'h Arc<Core<T>>,
    index: usize,
    record: Record<'h, T>,
    op: Option<T::Op>,
    output: Rc<RefCell<Option<T::Output>>>,
}

impl<'h, T: Replay + Send + Sync + 'static> Pending<'h> for Call<'h, T> {
    fn id(&self) -> (*const (), usize) {
        (Arc::as_ptr(self.core).cast::<()>(), self.index)
    }

    fn name(&self) -> &str {
        self.core.name()
    }

    fn apply(&mut self) -> std::thread::Result<Option<Box<dyn FnOnce() + 'h>>> {
        let Some(op) = self.op.take() else {
            return Ok(None);
        };
        let (output, ask) = self.core.apply_record(&mut self.record, op)?;
        *self.output.borrow_mut() = Some(output);
        let (core, index) = (self.core, self.index);
        Ok(ask.then(|| Box::new(move || Core::ask_for_snapshot(core, index)) as Box<dyn FnOnce()>))
    }

    fn poison(&self) {
        self.core.poison();
    }
}
