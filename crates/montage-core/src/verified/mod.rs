//! Epoch-verified DRAM structures for nonblocking indexes: [`VerifiedAtomic`], a word whose
//! compare-and-swap succeeds only while the clock still reads the calling operation's epoch
//! (a double-compare single-swap against the clock, Montage's, with descriptors that are
//! reused instead of allocated), and the lock-free structures whose words swap the same
//! way: [`VerifiedList`] (a sorted list of keys with value words), [`VerifiedBucket`] (a
//! hash bucket: one entry inline, a list for the rest) and [`VerifiedQueue`] (a
//! Michael-Scott queue).
//!
//! They live in DRAM: they are indexes, rebuilt from payloads after a restart. What makes
//! them safe to use for a buffered durably linearizable structure is that every change a
//! structure's state depends on linearizes inside the operation's epoch (INV-CAS-1).

#[allow(unsafe_code)]
pub(crate) mod atomic;
pub(crate) mod bucket;
pub(crate) mod descriptor;
#[allow(unsafe_code)]
pub(crate) mod list;
#[allow(unsafe_code)]
pub(crate) mod queue;

pub use atomic::{CasError, CasErrorKind, CasWord, VerifiedAtomic};
pub use bucket::{BucketKey, VerifiedBucket};
pub use list::{MAX_LIST_VALUE, VerifiedList};
pub use queue::{Dequeued, VerifiedQueue};

/// What a read outside any operation found ([`VerifiedBucket::peek`], [`VerifiedList::peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek<T> {
    /// The key held this value.
    Found(T),
    /// The key was absent.
    Absent,
    /// The read cannot tell without an operation: it met a swap in progress, which only an
    /// operation's clock can decide, or a node that only a traversal inside an operation
    /// unlinks.
    Undecided,
}

impl<T> Peek<T> {
    /// `Found` for `Some`, `Absent` for `None`.
    pub fn from_option(found: Option<T>) -> Peek<T> {
        found.map_or(Peek::Absent, Peek::Found)
    }
}
