//! Small per-thread ids, handed out lazily and recycled when a thread exits, so per-thread
//! tables (allocator caches, and later operation announcements) stay dense.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);
static RECYCLED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

struct Slot(usize);

impl Slot {
    fn acquire() -> Slot {
        let recycled = RECYCLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        // ORDERING: the counter only has to hand out distinct values; no data hangs off it.
        Slot(recycled.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        RECYCLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(self.0);
    }
}

thread_local! {
    static SLOT: Slot = Slot::acquire();
}

/// The calling thread's id: unique among live threads, small, reused after a thread exits.
/// During thread teardown (after the id is released) returns 0, which is still correct for
/// every user: ids only spread contention, they never decide ownership.
pub(crate) fn current() -> usize {
    SLOT.try_with(|slot| slot.0).unwrap_or(0)
}

/// The index of `id` in a per-thread table of `count` entries: `id` itself while it fits
/// (the common case, decided without a division), else `id % count`.
#[inline]
pub(crate) fn index_in(id: usize, count: usize) -> usize {
    if id < count { id } else { id % count }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_threads_have_distinct_ids_and_ids_are_reused() {
        let mine = current();
        let other = std::thread::spawn(current).join().unwrap();
        assert_ne!(mine, other);
        // The exited thread's id goes back to the pool, so a new thread can take it.
        let next = std::thread::spawn(current).join().unwrap();
        assert_ne!(next, mine);
        assert!(next <= NEXT.load(Ordering::Relaxed));
    }
}
