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

use crate::base::epoch::Epoch;
use crate::primitive::{AtomicPtr, AtomicU64, Ordering, fence};

/// The bits of a thread id in a tag: threads with larger ids have no descriptor (their
/// swaps use the clock's handshake).
pub(super) const THREAD_BITS: u32 = 16;
/// Sequence numbers wrap at 2^47, the bits a tag has for them beside a thread id and the
/// tag bit: a tag could be mistaken for an older one only by a helper stalled between
/// reading a tag and swapping it out while its owner made 2^47 more swaps.
pub(super) const SEQ_MASK: u64 = (1 << (u64::BITS - 1 - THREAD_BITS)) - 1;
/// The state in the low two bits of a status; the sequence number is above.
const UNDECIDED: u64 = 0;
const SUCCEEDED: u64 = 1;
const FAILED: u64 = 2;
/// Descriptors a chunk holds.
const CHUNK: usize = 64;
/// Chunks a table holds: one for every `CHUNK` ids a tag can name.
const CHUNKS: usize = (1 << THREAD_BITS) / CHUNK;

/// One thread's swap descriptor: the one swap it may have in progress. Its fields are
/// private: the owner describes a swap with [`begin`](Self::begin), a helper reads it with
/// [`read`](Self::read), and either decides it with [`decide`](Self::decide).
#[derive(Debug)]
pub(super) struct Descriptor {
    /// The swap's sequence number and its state (`seq << 2 | state`).
    status: AtomicU64,
    /// The heap whose operation makes the swap (`Epochs::instance`).
    heap: AtomicU64,
    /// The epoch the swap must linearize in.
    epoch: AtomicU64,
    /// The word's content the swap replaces.
    expected: AtomicPtr<()>,
    /// The content it puts in its place.
    new: AtomicPtr<()>,
}

/// A swap, as its descriptor describes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Swap {
    /// The heap whose operation makes the swap.
    pub(super) heap: u64,
    /// The epoch it must linearize in.
    pub(super) epoch: Epoch,
    /// The word's content it replaces (with its provenance).
    pub(super) expected: *mut (),
    /// The content it puts in its place.
    pub(super) new: *mut (),
}

/// A status: a swap's sequence number and its state.
fn status(seq: u64, state: u64) -> u64 {
    (seq << 2) | state
}

/// The sequence number of a status.
fn status_seq(status: u64) -> u64 {
    status >> 2
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

    /// Describes the owner's next swap, undecided, and returns its sequence number, which
    /// the tag the owner installs then names. Only the descriptor's owner calls it, one swap
    /// at a time.
    pub(super) fn begin(&self, swap: Swap) -> u64 {
        // Only the owner changes the sequence number: the status holds its last swap's.
        // ORDERING: Relaxed: this thread's own last store of the number.
        let seq = (status_seq(self.status.load(Ordering::Relaxed)) + 1) & SEQ_MASK;
        // The sequence lock's write side: the new number first, so that a helper that reads
        // any of the fields below finds the number changed when it checks it afterwards.
        // ORDERING: Relaxed store, then a Release fence before the field stores (pairs with
        // the Acquire fence in `read`).
        self.status.store(status(seq, UNDECIDED), Ordering::Relaxed);
        fence(Ordering::Release);
        // ORDERING: Relaxed: the tag's install (SeqCst, so Release) publishes them to whoever
        // reads the tag.
        self.heap.store(swap.heap, Ordering::Relaxed);
        self.epoch.store(swap.epoch.get(), Ordering::Relaxed);
        self.expected.store(swap.expected, Ordering::Relaxed);
        self.new.store(swap.new, Ordering::Relaxed);
        seq
    }

    /// The swap numbered `seq`, if the descriptor still describes it; `None` once its owner
    /// has begun a later one (so that swap is over, and its tag gone). For a caller that
    /// read a tag naming `seq` from a word (`SeqCst`, so after the tag's install).
    pub(super) fn read(&self, seq: u64) -> Option<Swap> {
        // The sequence lock's read side: the fields, then the number. The tag was read after
        // its install, so the fields are at least the swap's own; if the number still names
        // the swap afterwards, the owner has not begun to overwrite them.
        // ORDERING: Relaxed loads, then an Acquire fence before the check (pairs with the
        // Release fence in `begin`).
        let swap = Swap {
            heap: self.heap.load(Ordering::Relaxed),
            epoch: Epoch::new(self.epoch.load(Ordering::Relaxed)),
            expected: self.expected.load(Ordering::Relaxed),
            new: self.new.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        // ORDERING: Relaxed, after the fence (the sequence lock's check).
        (status_seq(self.status.load(Ordering::Relaxed)) == seq).then_some(swap)
    }

    /// Decides the swap numbered `seq` as `succeeded` unless it is decided already, and
    /// returns its decision; `None` if the owner has begun a later swap.
    pub(super) fn decide(&self, seq: u64, succeeded: bool) -> Option<bool> {
        let state = if succeeded { SUCCEEDED } else { FAILED };
        // ORDERING: SeqCst, as every access to verified words (INV-CAS-1); the first
        // transition decides, and it names the swap's number, so it cannot decide a later
        // swap.
        let _ = self.status.compare_exchange(
            status(seq, UNDECIDED),
            status(seq, state),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        // ORDERING: SeqCst, as above.
        let found = self.status.load(Ordering::SeqCst);
        (status_seq(found) == seq).then_some(found & 3 == SUCCEEDED)
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
