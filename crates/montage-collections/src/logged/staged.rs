//! Calls on logged structures made in a [`together`](crate::together()): [`Together::log`]
//! and its kin.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use montage_core::{Error, Result};

use super::core::{Core, Record, encode_record};
use super::{Logged, Replay, Shard};
use crate::structure;
use crate::together::{Panic, Request, Staged, StagedId, Ticket, Together};

impl<'h> Together<'h, '_, '_> {
    /// Logs `op` on `handle`'s structure, to be applied when the operation commits.
    ///
    /// # Errors
    ///
    /// As [`together`](crate::together()).
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
    /// As [`together`](crate::together()).
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
    /// As [`together`](crate::together()).
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
    /// As [`together`](crate::together()).
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
        self.check_new(
            core.attached().heap(),
            (Arc::as_ptr(core).cast::<()>(), index),
        )?;
        let op = self.op();
        let state = core.lock_shard(index, op)?;
        let (call, extra) = decide(&state.value);
        let record = structure::with_encode_buffer(|bytes| {
            encode_record(&call, bytes)?;
            core.write_record(state, index, op, bytes, false)
        })?;
        let output = Rc::new(RefCell::new(None));
        self.stage(Box::new(Call {
            core,
            index,
            record,
            op: Some(call),
            output: Rc::clone(&output),
        }));
        Ok((Ticket(output), extra))
    }
}

/// A logged call waiting for its operation's end.
struct Call<'h, T: Replay> {
    core: &'h Arc<Core<T>>,
    index: usize,
    record: Record<'h, T>,
    op: Option<T::Op>,
    output: Rc<RefCell<Option<T::Output>>>,
}

impl<'h, T: Replay + Send + Sync + 'static> Staged<'h> for Call<'h, T> {
    fn id(&self) -> StagedId {
        (Arc::as_ptr(self.core).cast::<()>(), self.index)
    }

    fn apply(&mut self) -> std::result::Result<Option<Request<'h>>, (Error, Panic)> {
        let Some(op) = self.op.take() else {
            return Ok(None);
        };
        let (output, ask) = self
            .core
            .apply_record(&mut self.record, op)
            .map_err(|payload| {
                let structure = self.core.name().to_owned();
                (Error::Panicked { structure }, payload)
            })?;
        *self.output.borrow_mut() = Some(output);
        let (core, index) = (self.core, self.index);
        Ok(ask.then(|| Box::new(move || Core::ask_for_snapshot(core, index)) as Request<'h>))
    }

    fn poison(&self) {
        self.core.poison();
    }
}
