//! Points where a test stops a thread whose reads may go stale, to change what it read
//! under it (the `sim` feature): each kind of point has its thread-local hook, set by a
//! `pause_*_at` function of [`sim`](crate::sim) and called where the code reaches a point.

use std::cell::RefCell;
use std::thread::LocalKey;

/// What a test runs at a point of kind `P`.
pub(crate) type Hook<P> = Box<dyn FnMut(P)>;

/// A thread's hook for points of kind `P`.
pub(crate) type Slot<P> = RefCell<Option<Hook<P>>>;

/// Sets this thread's hook in `slot` (`None`: no more calls).
pub(crate) fn set<P>(slot: &'static LocalKey<Slot<P>>, hook: Option<Hook<P>>) {
    slot.with(|slot| *slot.borrow_mut() = hook);
}

/// Calls this thread's hook in `slot` at `point`, unless the hook itself is running (what
/// it does reaches no point).
pub(crate) fn reached<P>(slot: &'static LocalKey<Slot<P>>, point: P) {
    slot.with(|slot| {
        if let Ok(mut hook) = slot.try_borrow_mut()
            && let Some(hook) = hook.as_mut()
        {
            hook(point);
        }
    });
}
