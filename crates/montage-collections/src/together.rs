//! [`together()`]: changes of several structures in one heap operation, so that a crash keeps
//! all of them or none: calls on logged structures (and shards), and updates of
//! [`HashMap`]s, [`Queue`]s and [`Graph`]s.
//!
//! # How a change waits for the others
//!
//! A `together` runs in one heap operation, and each structure it touches stays locked from
//! its first change to the end of that operation. Each change is written to the heap at
//! once (a logged call's record, a map entry's new version, a queue element); what the
//! structures keep in DRAM is either changed after the closure returned (a logged call is
//! applied to its `T` then, in order) or changed at once with a note of how to take it
//! back (a map's index, a queue's order), so that the closure can read its own changes.
//! If the closure (or a change) fails, the operation is rolled back first, which makes the
//! blocks it wrote unreachable and the ones it replaced live again, and only then are the
//! DRAM changes taken back and the locks released: no other thread ever sees an index that
//! names a block the rollback took away.
//!
//! Changes of map entries never write a payload in place (a block written earlier in the
//! same epoch is replaced by a copy), since a rollback cannot restore bytes overwritten in
//! place.
//!
//! # Deadlock
//!
//! One `together` at a time holds several locks (a process-wide mutex orders them); every
//! other method of these structures holds one lock at a time and waits for nothing while
//! it does. So no two threads wait for each other. Inside a `together`, touch its
//! structures only through it: a direct call on a structure the `together` has locked
//! waits for itself.

use std::sync::Mutex;

use montage_core::{Error, Heap, OpGuard, Result};

use crate::structure::lock;
// Named by the docs.
#[cfg(doc)]
use crate::{Graph, HashMap, Queue};

/// Held by each [`together()`] from before its operation begins to after it ends: one
/// operation at a time holds the locks of several structures, so no two wait for each
/// other's (every other call holds one lock and waits for nothing while it does).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `calls` in one heap operation and returns what it returns: every change it makes
/// through the [`Together`] it is given is made in that operation, and a crash keeps all of
/// them or none. Their payloads are in the same epoch, so each structure stays a prefix of
/// its changes.
///
/// * [`Together::log`] (and `log_shard`, `log_with`, `log_shard_with`) logs a call on a
///   [`Logged`](crate::Logged) structure or a shard; the calls are applied, in the order
///   they were logged, once `calls` has returned `Ok`, so a call's output is not known
///   inside `calls`: `log` returns a [`Ticket`] that gives it once `together` has
///   returned. To decide what to log from the structure's own state, use
///   [`Together::log_with`], which locks it first.
/// * [`Together::hash_map`], [`Together::queue`] and [`Together::graph`] change a
///   [`HashMap`], a [`Queue`] or a [`Graph`]
///   through a view whose methods return at once, and see the changes made before them.
///
/// Each structure (or shard) is locked from its first change to the end of the operation.
/// An error from `calls` (or from a change, such as a full heap) leaves every structure as
/// it was. `calls` may run more than once (as the body of [`Heap::run_op`] does, when the
/// clock moved under it).
///
/// One structure or shard can be taken once per `together` (gather its changes in one
/// call). Operations of `together` run one at a time in the process; single calls run
/// beside them. Inside `calls`, touch a structure only through the `Together`: a direct
/// call on one it has locked waits for itself.
///
/// ```
/// use montage_collections::logged::Replay;
/// use montage_collections::{Logged, together};
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
/// What `calls` returns; [`Error::Unsupported`] from a change on a structure of another
/// heap or one taken already in this `together`; otherwise as the change's own method
/// (then nothing was changed).
///
/// # Panics
///
/// If `calls` panics, or a call's [`Replay::apply`](crate::Replay::apply) does: the
/// operation is rolled back (none of its changes is kept) and the panic goes on to the
/// caller. A panicking `apply` poisons its structure and those whose calls were applied
/// before it, as [`Logged::apply`](crate::Logged::apply) says.
pub fn together<'h, R>(
    heap: &Heap,
    mut calls: impl FnMut(&mut Together<'h, '_, '_>) -> Result<R>,
) -> Result<R> {
    let _one = lock(&ONE_AT_A_TIME);
    let mut panic = None;
    // Each attempt holds its changes (and locks) until its operation has ended: a failed
    // one's are taken back only after the rollback (module docs).
    let result = heap.run_op_holding(|op| {
        let mut tx = Together {
            heap,
            op,
            staged: Vec::new(),
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| calls(&mut tx)));
        let result = tx.finish(outcome).map_err(|(err, payload)| {
            panic = payload;
            err
        });
        (result, tx.staged)
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

/// The changes of one [`together()`], made in its operation.
pub struct Together<'h, 'g, 'o> {
    heap: &'g Heap,
    op: &'g OpGuard<'o>,
    staged: Vec<Box<dyn Staged<'h> + 'h>>,
}

impl std::fmt::Debug for Together<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Together")
            .field("epoch", &self.op.epoch())
            .field("structures", &self.staged.len())
            .finish()
    }
}

impl<'h, 'g, 'o> Together<'h, 'g, 'o> {
    /// Ends an attempt whose closure gave `outcome`: applies the logged calls and keeps
    /// every change, or returns the error (and the panic to resume) that rolls it back.
    fn finish<R>(
        &mut self,
        outcome: std::thread::Result<Result<R>>,
    ) -> std::result::Result<(R, Vec<Request<'h>>), (Error, Option<Panic>)> {
        let value = match outcome {
            Ok(Ok(value)) => value,
            Ok(Err(err)) => return Err((err, None)),
            Err(payload) => {
                let err = Error::Panicked {
                    structure: "a `together`'s closure".to_owned(),
                };
                return Err((err, Some(payload)));
            }
        };
        let mut requests = Vec::new();
        for at in 0..self.staged.len() {
            match self.staged[at].apply() {
                Ok(request) => requests.extend(request),
                Err((err, payload)) => {
                    // The calls before it changed their structures, and the rollback takes
                    // their records back: they are poisoned too.
                    for staged in &self.staged[..at] {
                        staged.poison();
                    }
                    return Err((err, Some(payload)));
                }
            }
        }
        // Nothing fails from here: the changes stand.
        for staged in &mut self.staged {
            staged.commit();
        }
        Ok((value, requests))
    }

    /// The operation the changes are made in.
    pub(crate) fn op(&self) -> &'g OpGuard<'o> {
        self.op
    }

    /// Checks that the structure (or shard) `id`, of heap `heap`, may be taken: it is of
    /// this `together`'s heap and not taken already.
    pub(crate) fn check_new(&self, heap: &Heap, id: StagedId) -> Result<()> {
        if !heap.same_heap(self.heap) {
            return Err(Error::Unsupported {
                what: "a structure of another heap in `together`",
            });
        }
        if self.staged.iter().any(|staged| staged.id() == id) {
            return Err(Error::Unsupported {
                what: "a structure (or shard) taken twice in one `together`",
            });
        }
        Ok(())
    }

    /// Adds the changes of a structure, to be applied (or taken back) with the others.
    pub(crate) fn stage(&mut self, staged: Box<dyn Staged<'h> + 'h>) {
        self.staged.push(staged);
    }

    /// Takes the collection at `structure` (of heap `heap`) into this together: checks it as
    /// [`check_new`](Self::check_new) does, makes its record of changes with `part` (which
    /// may lock it), runs `f` on that record, then adds it, even if `f` panics: the changes
    /// are taken back only after the operation's rollback (module docs).
    pub(crate) fn with_part<S, P: Staged<'h> + 'h, R>(
        &mut self,
        heap: &Heap,
        structure: &S,
        part: impl FnOnce(&'g OpGuard<'o>) -> Result<P>,
        f: impl FnOnce(&mut P, &'g OpGuard<'o>) -> Result<R>,
    ) -> Result<R> {
        self.check_new(heap, (std::ptr::from_ref(structure).cast(), 0))?;
        let op = self.op;
        let mut part = part(op)?;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut part, op)));
        self.stage(Box::new(part));
        result.unwrap_or_else(|payload| std::panic::resume_unwind(payload))
    }
}

/// What a logged call's snapshot policy asks for, run once the [`together()`] has returned.
pub(crate) type Request<'h> = Box<dyn FnOnce() + 'h>;

/// A panic's payload, to resume once the operation is rolled back.
pub(crate) type Panic = Box<dyn std::any::Any + Send>;

/// Which structure (and shard) a change is on: its address and the shard's index.
pub(crate) type StagedId = (*const (), usize);

/// The changes one [`together()`] made on one structure (or shard), type-erased. Dropped
/// without [`commit`](Staged::commit), they are taken back, once the operation has been
/// rolled back (module docs).
pub(crate) trait Staged<'h> {
    /// Which structure and shard they are on.
    fn id(&self) -> StagedId;
    /// Applies what waits for the end of the closure; returns the snapshot request a
    /// logged structure's policy made, or the panic of its `apply` (the structure is then
    /// poisoned) with the [`Error::Panicked`] that names it.
    fn apply(&mut self) -> std::result::Result<Option<Request<'h>>, (Error, Panic)> {
        Ok(None)
    }
    /// Keeps the changes: the operation commits.
    fn commit(&mut self) {}
    /// Poisons the structure: an `apply` after its own panicked.
    fn poison(&self) {}
}

/// What a call of [`Together::log`] returns: its output, once [`together()`] has returned.
pub struct Ticket<O>(pub(crate) std::rc::Rc<std::cell::RefCell<Option<O>>>);

impl<O> std::fmt::Debug for Ticket<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("ready", &self.0.borrow().is_some())
            .finish()
    }
}

impl<O> Ticket<O> {
    /// The call's output: `Some` once the [`together()`] that logged it returned `Ok` (`None`
    /// for a ticket of an attempt that did not commit).
    pub fn take(self) -> Option<O> {
        self.0.borrow_mut().take()
    }
}
