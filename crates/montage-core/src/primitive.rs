//! The atomics, cells and locks the epoch protocol is built on: std's, or loom's under
//! `cfg(montage_loom)`, so that `cargo xtask loom` can explore every interleaving of the
//! announcement handshake and check every access to a thread slot's cells.

#[cfg(montage_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(montage_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering, fence};

#[cfg(montage_loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(montage_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(montage_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// std's `UnsafeCell` with loom's interface (crossbeam's shim): the cell is reached only
/// through [`with_mut`](Self::with_mut), which loom checks against every other access.
#[cfg(not(montage_loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(montage_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the value; what `f` may do with it is the caller's
    /// business (dereferencing it is `unsafe`).
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Locks `mutex`, taking the data of a poisoned one as it is: every user of these locks
/// keeps its data consistent at every point a panic can leave it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Lets another thread run (a loom scheduling point under loom).
pub(crate) fn yield_now() {
    #[cfg(montage_loom)]
    loom::thread::yield_now();
    #[cfg(not(montage_loom))]
    std::thread::yield_now();
}

/// Completes the store-load order of a handshake whose first half was a `SeqCst`
/// read-modify-write (or a `SeqCst` load of what another thread's one stored) and whose
/// second half is a `SeqCst` load, as in `announce` and `verify` of `epoch/tracker.rs` and
/// the clock read of a verified swap (`verified/atomic.rs`).
///
/// In the language's memory model (C++20's, which Rust adopts) every `SeqCst` operation
/// takes a place in one total order consistent with program order, so a `SeqCst` access and
/// a later `SeqCst` load of the same thread are already ordered and this is a no-op (on
/// x86-64 the RMW is a locked instruction, itself a full barrier, and an `mfence` after it
/// would only cost cycles). Loom treats `SeqCst` accesses as acquire/release, which lets
/// the load pass the access before it; there it is the `SeqCst` fence the model needs to
/// see the order.
#[inline]
pub(crate) fn after_seqcst_access() {
    #[cfg(montage_loom)]
    fence(Ordering::SeqCst);
}
