//! The descriptors of the verified words' double-compare single-swaps (`atomic.rs`): one
//! per thread of the process, reused by every swap the thread makes.
//!
//! A thread makes one swap at a time (a swap calls no code of the caller's and starts no
//! other swap), whatever heaps its operations belong to, so one descriptor a thread is
//! enough, and a swap allocates nothing and frees nothing. A tag in a word names the
//! descriptor by the owner's thread id (`thread_id.rs`: small, unique among live threads,
//! held by the operation while it runs) and the swap by its sequence number. The descriptor
//! records the heap whose operation makes the swap, so that a thread of another heap that
//! meets the tag (a word shared by the operations of two heaps, a misuse) is stopped
//! instead of completing the swap against the wrong clock.
//!
//! Descriptors are kept in chunks of 64, each allocated when a thread of its range first
//! swaps and never freed: the table is the process's, and an id's descriptor goes to the
//! next thread that gets the id, sequence numbers and all.

use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

use crate::primitive::{AtomicPtr, AtomicU64};

/// The bits of a thread id in a tag: threads with larger ids have no descriptor (their
/// swaps use the clock's handshake).
pub(super) const THREAD_BITS: u32 = 16;
/// Descriptors a chunk holds.
const CHUNK: usize = 64;
/// Chunks a table holds: one for every `CHUNK` ids a tag can name.
const CHUNKS: usize = (1 << THREAD_BITS) / CHUNK;

/// One thread's swap descriptor: the one swap it may have in progress (`atomic.rs` reads
/// and writes the fields).
#[derive(Debug)]
pub(super) struct Descriptor {
    /// The swap's sequence number and its state (`atomic.rs` packs them).
    pub(super) status: AtomicU64,
    /// The heap whose operation makes the swap (`Epochs::instance`).
    pub(super) heap: AtomicU64,
    /// The epoch the swap must linearize in.
    pub(super) epoch: AtomicU64,
    /// The word's value the swap replaces.
    pub(super) expected: AtomicPtr<()>,
    /// The value the swap puts in its place.
    pub(super) new: AtomicPtr<()>,
}

impl Descriptor {
    fn new() -> Descriptor {
        Descriptor {
            status: AtomicU64::new(0),
            heap: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            expected: AtomicPtr::new(std::ptr::null_mut()),
            new: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// `CHUNK` descriptors, each on cache lines of its own.
type Chunk = Box<[CachePadded<Descriptor>]>;

/// The descriptors of the threads of a process, by thread id (module docs).
pub(crate) struct Descriptors {
    chunks: Box<[OnceLock<Chunk>]>,
}

impl std::fmt::Debug for Descriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Descriptors").finish_non_exhaustive()
    }
}

impl Descriptors {
    /// A table with no descriptor allocated yet.
    pub(super) fn new() -> Descriptors {
        Descriptors {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The descriptor of the thread whose id is `id`, allocating its chunk if it is the
    /// first of its range to ask; `None` for an id beyond what a tag can name. Only the
    /// thread holding `id` may use it to swap.
    pub(super) fn own(&self, id: usize) -> Option<&Descriptor> {
        let chunk = self.chunks.get(id / CHUNK)?.get_or_init(|| {
            (0..CHUNK)
                .map(|_| CachePadded::new(Descriptor::new()))
                .collect()
        });
        Some(&chunk[id % CHUNK])
    }

    /// The descriptor a tag names by the id `id`, if its chunk exists: it does for every
    /// tag a swap of this table installed.
    pub(super) fn find(&self, id: usize) -> Option<&Descriptor> {
        let chunk = self.chunks.get(id / CHUNK)?.get()?;
        Some(&chunk[id % CHUNK])
    }
}

/// The process's descriptors.
#[cfg(not(montage_loom))]
pub(crate) fn process() -> &'static Descriptors {
    static DESCRIPTORS: std::sync::LazyLock<Descriptors> =
        std::sync::LazyLock::new(Descriptors::new);
    &DESCRIPTORS
}

/// The process's descriptors: under loom, one table for each execution of a model (the
/// models make their own, and pass them).
#[cfg(montage_loom)]
pub(crate) fn process() -> &'static Descriptors {
    loom::lazy_static! {
        static ref DESCRIPTORS: Descriptors = Descriptors::new();
    }
    &DESCRIPTORS
}
