//! Stamped locks: the protocol every lock-based structure follows for the DRAM state it
//! keeps beside its payloads, as a type.
//!
//! A structure's index holds state that no payload carries: that a key is absent after a
//! delete, the order of a queue, which stripe an entry is in. An operation must never act on
//! an effect of an operation of a newer epoch (recovery could keep the older operation and
//! lose the newer one), and payload accesses check that themselves; the DRAM state needs the
//! same check. So the state carries the epoch of the last operation that changed it (its
//! stamp), an operation that locks it checks the stamp against its own epoch and aborts
//! ([`Error::Aborted`]) if the stamp is newer, and one that changes it stamps it with its
//! own epoch. Then the order in which operations take the lock agrees with epoch order
//! (INV-COL-1), and each epoch boundary stays a consistent cut.
//!
//! [`StampedLock`] (a mutex) and [`StampedRwLock`] (a reader-writer lock) do all three: the
//! check when the lock is taken, and the stamp on the first mutable access through the
//! guard, so a read-only critical section leaves the stamp alone. A poisoned lock is used as
//! it is, as the structures keep their DRAM state consistent at every step.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};

/// A value and the epoch of the last operation that changed it: in this order, so that a
/// value's first bytes share the lock's cache line.
#[derive(Debug, Default)]
#[repr(C)]
struct Stamped<T> {
    stamp: Epoch,
    value: T,
}

impl<T> Stamped<T> {
    /// Fails with [`Error::Aborted`] if an operation newer than `op` changed the value.
    fn checked(&self, op: &OpGuard<'_>) -> Result<()> {
        if self.stamp > op.epoch() {
            Err(Error::Aborted)
        } else {
            Ok(())
        }
    }

    /// The value, for a change by an operation of `epoch`, which `checked` let through: the
    /// stamp moves to `epoch`, never back.
    fn stamped(&mut self, epoch: Epoch) -> &mut T {
        self.stamp = epoch;
        &mut self.value
    }
}

/// A mutex whose guard checks the epoch stamp of the value it protects and stamps it when
/// the value changes (module docs).
///
/// ```
/// use montage_core::{Heap, HeapConfig, StampedLock};
///
/// // The DRAM side of a tiny structure: the blocks of its entries, in order.
/// let heap = Heap::create(&HeapConfig::in_memory(1 << 20))?;
/// let owner = heap.register("log")?;
/// let entries: StampedLock<Vec<montage_core::PBlock>> = StampedLock::new(Vec::new());
/// heap.run_op(|op| {
///     let mut entries = entries.lock(op)?; // aborts (and run_op retries) if a newer
///                                          // operation changed the list
///     let block = op.alloc(owner, 0, b"first")?;
///     entries.push(block); // stamps the list with this operation's epoch
///     Ok(())
/// })?;
/// assert_eq!(entries.lock_outside_op().len(), 1);
/// # Ok::<(), montage_core::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct StampedLock<T> {
    inner: Mutex<Stamped<T>>,
}

impl<T> StampedLock<T> {
    /// Locks the value for `op`.
    ///
    /// # Errors
    ///
    /// [`Error::Aborted`] if an operation of a newer epoch than `op`'s changed the value:
    /// `op` must be retried ([`Heap::run_op`](crate::Heap::run_op) does).
    pub fn lock(&self, op: &OpGuard<'_>) -> Result<StampedGuard<'_, T>> {
        let guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        guard.checked(op)?;
        Ok(StampedGuard {
            guard,
            epoch: op.epoch(),
        })
    }

    /// Locks the value outside any operation: no check, and a change through the guard
    /// keeps the old stamp. For what no operation's effect depends on: rebuilding the index
    /// before the structure is shared, statistics, and reads that need no epoch check
    /// because every change happens under this lock.
    pub fn lock_outside_op(&self) -> Unstamped<'_, T> {
        Unstamped(self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The guard of a [`StampedLock`] taken by an operation: reads through it leave the stamp
/// alone, the first mutable access stamps the value with the operation's epoch.
#[derive(Debug)]
pub struct StampedGuard<'a, T> {
    guard: MutexGuard<'a, Stamped<T>>,
    epoch: Epoch,
}

/// The guard of [`StampedLock::lock_outside_op`]: no check, no stamp.
#[derive(Debug)]
pub struct Unstamped<'a, T>(MutexGuard<'a, Stamped<T>>);

/// A reader-writer lock whose guards check the epoch stamp of the value it protects, and
/// whose write guard stamps it when the value changes (module docs).
#[derive(Debug, Default)]
pub struct StampedRwLock<T> {
    inner: RwLock<Stamped<T>>,
}

impl<T> StampedRwLock<T> {
    /// Locks the value for reading by `op`.
    ///
    /// # Errors
    ///
    /// As [`StampedLock::lock`].
    pub fn read(&self, op: &OpGuard<'_>) -> Result<StampedReadGuard<'_, T>> {
        let guard = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        guard.checked(op)?;
        Ok(StampedReadGuard(guard))
    }

    /// Locks the value for writing by `op`.
    ///
    /// # Errors
    ///
    /// As [`StampedLock::lock`].
    pub fn write(&self, op: &OpGuard<'_>) -> Result<StampedWriteGuard<'_, T>> {
        let guard = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        guard.checked(op)?;
        Ok(StampedWriteGuard {
            guard,
            epoch: op.epoch(),
        })
    }

    /// Reads the value outside any operation (as [`StampedLock::lock_outside_op`], but
    /// read-only).
    pub fn read_outside_op(&self) -> StampedReadGuard<'_, T> {
        StampedReadGuard(self.inner.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Writes the value outside any operation (as [`StampedLock::lock_outside_op`]: no
    /// check, and a change keeps the old stamp).
    pub fn write_outside_op(&self) -> UnstampedWriteGuard<'_, T> {
        UnstampedWriteGuard(self.inner.write().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A read guard of a [`StampedRwLock`].
#[derive(Debug)]
pub struct StampedReadGuard<'a, T>(RwLockReadGuard<'a, Stamped<T>>);

/// The write guard of a [`StampedRwLock`]: the first mutable access stamps the value.
#[derive(Debug)]
pub struct StampedWriteGuard<'a, T> {
    guard: RwLockWriteGuard<'a, Stamped<T>>,
    epoch: Epoch,
}

/// The write guard of [`StampedRwLock::write_outside_op`]: no check, no stamp.
#[derive(Debug)]
pub struct UnstampedWriteGuard<'a, T>(RwLockWriteGuard<'a, Stamped<T>>);

/// `new`, `get_mut` and `into_inner` of a stamped lock whose `inner` is a `$std` lock (std's
/// `Mutex` and `RwLock` have the same three).
macro_rules! lock_common {
    ($lock:ident, $std:ident) => {
        impl<T> $lock<T> {
            /// A lock around `value`, stamped [`Epoch::ZERO`] (older than every operation).
            pub const fn new(value: T) -> $lock<T> {
                $lock {
                    inner: $std::new(Stamped {
                        stamp: Epoch::ZERO,
                        value,
                    }),
                }
            }

            /// The value, through exclusive access (no locking, no check, no stamp).
            pub fn get_mut(&mut self) -> &mut T {
                &mut self
                    .inner
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner)
                    .value
            }

            /// The value, with the lock gone.
            pub fn into_inner(self) -> T {
                self.inner
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .value
            }
        }
    };
}

lock_common!(StampedLock, Mutex);
lock_common!(StampedRwLock, RwLock);

/// `Deref` to the value, and `stamp`, for a guard whose inner guard is `$inner`.
macro_rules! read_access {
    ($guard:ident, |$g:ident| $inner:expr) => {
        impl<T> $guard<'_, T> {
            /// The epoch of the last operation that changed the value.
            pub fn stamp(&self) -> Epoch {
                let $g = self;
                $inner.stamp
            }
        }

        impl<T> Deref for $guard<'_, T> {
            type Target = T;

            fn deref(&self) -> &T {
                let $g = self;
                &$inner.value
            }
        }
    };
}

read_access!(StampedGuard, |g| g.guard);
read_access!(Unstamped, |g| g.0);
read_access!(StampedReadGuard, |g| g.0);
read_access!(StampedWriteGuard, |g| g.guard);
read_access!(UnstampedWriteGuard, |g| g.0);

impl<T> DerefMut for StampedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.stamped(self.epoch)
    }
}

impl<T> DerefMut for Unstamped<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.value
    }
}

impl<T> DerefMut for UnstampedWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.value
    }
}

impl<T> DerefMut for StampedWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.stamped(self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EpochLength, HeapConfig};
    use crate::heap::Heap;

    fn heap() -> Heap {
        Heap::create(&HeapConfig::in_memory(1 << 20).epoch_length(EpochLength::Manual)).unwrap()
    }

    #[test]
    fn a_change_stamps_and_an_older_operation_aborts() {
        let heap = heap();
        let lock = StampedLock::new(0u64);
        let older = heap.begin_op().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                heap.advance_epoch().unwrap();
                let op = heap.begin_op().unwrap();
                *lock.lock(&op).unwrap() += 1;
                done_tx.send(op.epoch()).unwrap();
            });
            // The advance waits for no operation of the current epoch, only the one before.
            let newer = done_rx.recv().unwrap();
            assert!(newer > older.epoch());
            assert_eq!(lock.lock_outside_op().stamp(), newer);
            assert!(matches!(lock.lock(&older), Err(Error::Aborted)));
        });
        drop(older);
        let op = heap.begin_op().unwrap();
        assert_eq!(*lock.lock(&op).unwrap(), 1);
    }

    #[test]
    fn a_change_outside_operations_keeps_the_stamp() {
        let heap = heap();
        let lock = StampedLock::new(1u8);
        let op = heap.begin_op().unwrap();
        *lock.lock(&op).unwrap() = 2;
        drop(op);
        let stamp = lock.lock_outside_op().stamp();
        *lock.lock_outside_op() = 3;
        assert_eq!(lock.lock_outside_op().stamp(), stamp);
        assert_eq!(lock.into_inner(), 3);

        let lock = StampedRwLock::new(1u8);
        let op = heap.begin_op().unwrap();
        *lock.write(&op).unwrap() = 2;
        drop(op);
        let stamp = lock.read_outside_op().stamp();
        assert_ne!(stamp, Epoch::ZERO);
        *lock.write_outside_op() = 3;
        assert_eq!(lock.read_outside_op().stamp(), stamp);
        assert_eq!(lock.into_inner(), 3);
    }

    #[test]
    fn a_read_leaves_the_stamp_alone() {
        let heap = heap();
        let lock = StampedRwLock::new(vec![1u8]);
        let op = heap.begin_op().unwrap();
        assert_eq!(lock.read(&op).unwrap().len(), 1);
        assert_eq!(lock.write(&op).unwrap().len(), 1);
        assert_eq!(lock.read_outside_op().stamp(), Epoch::ZERO);
        lock.write(&op).unwrap().push(2);
        assert_eq!(lock.read_outside_op().stamp(), op.epoch());
        drop(op);
        assert_eq!(lock.into_inner(), [1, 2]);
    }
}
