//! Small per-thread ids, handed out lazily and recycled when a thread exits, so per-thread
//! tables stay dense; and holds ([`Held`]), which keep a thread's id from going to another
//! thread while something of the thread's still uses it.
//!
//! The epoch tracker gives the thread with id `i` the `i`-th owned slot of every heap, whose
//! cells only that thread reaches while it has an operation announced (INV-SLOT-1), so two
//! live threads must never share an id. A thread returns its id when its thread-local state
//! is destroyed at exit, unless a hold is still alive then (an operation guard kept in
//! another thread-local that outlives this one): such an id is never reused.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);
static RECYCLED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// What a thread keeps: its id, once it has asked for one, and how many holds are alive.
struct ThreadState {
    id: Cell<Option<usize>>,
    holds: Cell<usize>,
}

impl ThreadState {
    #[inline]
    fn id(&self) -> usize {
        match self.id.get() {
            Some(id) => id,
            None => self.take_id(),
        }
    }

    /// The thread's first [`id`](Self::id): a recycled one, or the next new one.
    #[cold]
    fn take_id(&self) -> usize {
        let recycled = RECYCLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        // ORDERING: the counter only has to hand out distinct values; no data hangs off it.
        let id = recycled.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
        self.id.set(Some(id));
        id
    }
}

impl ThreadState {
    /// The id to give back when the state is destroyed: none while a hold is alive (the
    /// hold outlives the state, and its id stays taken for good).
    fn returned_id(&self) -> Option<usize> {
        self.id.get().filter(|_| self.holds.get() == 0)
    }
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        if let Some(id) = self.returned_id() {
            RECYCLED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(id);
        }
    }
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            id: Cell::new(None),
            holds: Cell::new(0),
        }
    };
}

/// The calling thread's id: unique among live threads, small, reused after a thread exits;
/// `None` during thread teardown, once the thread's state is gone. Without a [`Held`], only
/// good for spreading contention (the id may go to another thread once this one exits).
pub(crate) fn current() -> Option<usize> {
    STATE.try_with(ThreadState::id).ok()
}

/// A hold on the calling thread's id: while it lives, no other thread has or gets the id.
/// Not `Send`: it belongs to the thread whose id it holds.
#[derive(Debug)]
pub(crate) struct Held {
    id: Option<usize>,
    /// Whether the hold is counted in the thread's state (every hold but loom's).
    counted: bool,
    _not_send: PhantomData<*const ()>,
}

impl Held {
    /// The id held; `None` during thread teardown (the thread then has no id to hold).
    pub(crate) fn id(&self) -> Option<usize> {
        self.id
    }

    /// A hold on `id` for a loom model, whose threads share the thread-local state of the
    /// one thread that runs them: the model gives each of its threads an id of its own.
    #[cfg(all(test, montage_loom))]
    pub(crate) fn for_loom(id: usize) -> Held {
        Held {
            id: Some(id),
            counted: false,
            _not_send: PhantomData,
        }
    }
}

/// Holds the calling thread's id (see [`Held`]).
#[inline]
pub(crate) fn hold() -> Held {
    let id = STATE
        .try_with(|state| {
            state.holds.set(state.holds.get() + 1);
            state.id()
        })
        .ok();
    Held {
        id,
        counted: id.is_some(),
        _not_send: PhantomData,
    }
}

impl Drop for Held {
    #[inline]
    fn drop(&mut self) {
        if self.counted {
            // Gone already during teardown: the id was kept for good then.
            let _ = STATE.try_with(|state| state.holds.set(state.holds.get() - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_threads_have_distinct_ids_and_ids_are_reused() {
        let mine = current().unwrap();
        let other = std::thread::spawn(current).join().unwrap().unwrap();
        assert_ne!(mine, other);
        // The exited thread's id goes back to the pool, so a new thread can take it.
        let next = std::thread::spawn(current).join().unwrap().unwrap();
        assert_ne!(next, mine);
        assert!(next <= NEXT.load(Ordering::Relaxed));
    }

    #[test]
    fn a_hold_names_the_threads_id_and_nests() {
        let first = hold();
        let second = hold();
        assert_eq!(first.id(), current());
        assert_eq!(second.id(), current());
        drop(first);
        drop(second);
        STATE.with(|state| assert_eq!(state.holds.get(), 0));
    }

    /// A hold alive when its thread's state is destroyed (an operation guard kept in a
    /// thread-local destroyed later) keeps the id from going back to the pool.
    #[test]
    fn an_id_held_at_thread_exit_is_not_given_back() {
        // Never dropped: the test must not give a made-up id to the shared pool.
        let state = std::mem::ManuallyDrop::new(ThreadState {
            id: Cell::new(Some(7)),
            holds: Cell::new(1),
        });
        assert_eq!(state.returned_id(), None);
        state.holds.set(0);
        assert_eq!(state.returned_id(), Some(7));
        let fresh = std::mem::ManuallyDrop::new(ThreadState {
            id: Cell::new(None),
            holds: Cell::new(0),
        });
        assert_eq!(
            fresh.returned_id(),
            None,
            "a thread that never took an id gives none"
        );
    }
}
