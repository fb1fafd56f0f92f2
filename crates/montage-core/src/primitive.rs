//! The atomics the epoch protocol is built on: std's, or loom's under `cfg(montage_loom)`,
//! so that `cargo xtask loom` can explore every interleaving of the announcement handshake.

#[cfg(montage_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(montage_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering, fence};

/// Lets another thread run (a loom scheduling point under loom).
pub(crate) fn yield_now() {
    #[cfg(montage_loom)]
    loom::thread::yield_now();
    #[cfg(not(montage_loom))]
    std::thread::yield_now();
}
