//! [`Cache`]: an open heap and the item store in it, in one value the server can share.

use std::time::{Duration, Instant};

use montage_core::{Error, Heap, HeapConfig, RecoveryReport};

use crate::store::{Store, SystemClock};

/// The name of the item map in the heap.
pub const STORE_NAME: &str = "montage-kv";

/// An open heap and the item store in it: what a server serves.
#[derive(Debug)]
pub struct Cache {
    heap: Heap,
    store: Store,
}

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
        let report = heap.recovery_report().clone();
        let store = Store::open(&heap, STORE_NAME, SystemClock)?;
        let cache = Cache { heap, store };
        Ok(Opened {
            cache,
            created: !exists,
            recovery: started.elapsed(),
            report,
        })
    }

    /// The cache without evictions: a full heap refuses writes (see
    /// [`Store::without_evictions`]).
    #[must_use]
    pub fn without_evictions(self) -> Cache {
        Cache {
            store: self.store.without_evictions(),
            ..self
        }
    }

    /// The heap.
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// The items.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Closes the store and then the heap cleanly (a final sync; see [`Heap::close`]).
    ///
    /// # Errors
    ///
    /// As [`Heap::close`].
    pub fn close(self) -> Result<(), Error> {
        let Cache { heap, store } = self;
        drop(store);
        heap.close()
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
