//! [`Cache`]: an open heap and the item store in it, in one value the server can share.
//!
//! The store borrows the heap it lives in; the server's tasks need one owned value they can
//! share, so the two are tied together by `self_cell` (the crate keeps the unsafe part).

// The macro's expansion, audited by its crate, forgets a drop guard and transmutes a
// lifetime: two things this workspace's lints forbid in its own code.
#![allow(clippy::mem_forget, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use montage_core::{Error, Heap, HeapConfig, RecoveryReport};

use crate::store::{Store, SystemClock};

/// The name of the item map in the heap.
pub const STORE_NAME: &str = "montage-kv";

self_cell::self_cell!(
    /// An open heap and the item store in it: what a server serves.
    pub struct Cache {
        owner: Heap,
        #[covariant]
        dependent: Store,
    }

    impl {Debug}
);

impl Cache {
    /// Opens the heap `config` names, creating it if its file does not exist, and recovers
    /// the items in it.
    ///
    /// # Errors
    ///
    /// Any error of [`Heap::open`] or [`Heap::create`] (a heap locked by another process is
    /// [`Error::Locked`]) or of [`Store::open`] (a heap whose map holds other types is
    /// [`Error::LayoutMismatch`]).
    pub fn open(config: &HeapConfig) -> Result<Opened, Error> {
        let started = Instant::now();
        let exists = config.path().is_some_and(std::path::Path::exists);
        let heap = if exists {
            Heap::open(config)?
        } else {
            Heap::create(config)?
        };
        let report = *heap.recovery_report();
        let cache = Cache::try_new(heap, |heap| Store::open(heap, STORE_NAME, SystemClock))?;
        Ok(Opened {
            cache,
            created: !exists,
            recovery: started.elapsed(),
            report,
        })
    }

    /// The heap.
    pub fn heap(&self) -> &Heap {
        self.borrow_owner()
    }

    /// The items.
    pub fn store(&self) -> &Store<'_> {
        self.borrow_dependent()
    }

    /// Closes the store and then the heap cleanly (a final sync; see [`Heap::close`]).
    ///
    /// # Errors
    ///
    /// As [`Heap::close`].
    pub fn close(self) -> Result<(), Error> {
        self.into_owner().close()
    }
}

/// A cache just opened, and how its opening went.
#[derive(Debug)]
pub struct Opened {
    /// The cache.
    pub cache: Cache,
    /// Whether the heap file was created (else it was opened and recovered).
    pub created: bool,
    /// The time from the call to a cache ready to serve: heap recovery and index rebuild.
    pub recovery: Duration,
    /// The heap's own recovery report.
    pub report: RecoveryReport,
}
