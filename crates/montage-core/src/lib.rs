//! The runtime of Montage for Rust: a persistent heap of payload blocks, the persistence
//! backends that write it back, and the recovery scan that rebuilds it after a crash.
//!
//! # What lives where
//!
//! Montage keeps only *payloads* (the abstract state of a data structure: a key and its value,
//! a queue element) in persistent memory; every index stays in DRAM and is rebuilt after a
//! restart. This crate is that persistent half, and its API comes in layers:
//!
//! * **Operations** (the crate root): a [`Heap`] (a cheap clonable handle of one open heap
//!   file, mapped shared and addressed by offsets, [`PBlock`]), configured by [`HeapConfig`]
//!   and its [`BackendKind`]; [`OpGuard`], one operation in one epoch, which allocates,
//!   reads, updates (in place or copy-on-write) and deletes payloads by the epoch rules;
//!   [`Heap::sync`], which makes everything completed so far durable; the directory of named
//!   structures and the [`scan`](Heap::scan) with which a structure rebuilds its index.
//! * **Typed payloads** (the root, and [`payload`]): [`Payload`] structs (derived by
//!   `#[derive(Payload)]`), their handles [`PRef`] and [`POff`], and [`Codec`] for values
//!   stored as bytes.
//! * **Verified DRAM structures** ([`verified`]): the epoch-verified compare-and-swap and the
//!   lock-free list and queue built on it, for nonblocking indexes.
//! * **Raw blocks** ([`raw`]): allocation, writes and write-back without operations or
//!   epochs, and recovery by a caller's rule; outside the buffered-durable contract.
//! * **The power-failure simulator** (`sim`, with the `sim` feature) that every crash test
//!   runs on; `montage-testkit` holds what crash tests share beside it.
//! * [`limits`]: the format's sizes and capacities.
//!
//! # Example
//!
//! ```
//! use montage_core::sim::SimMode;
//! use montage_core::{Heap, HeapConfig, ScanFilter};
//!
//! // A heap on the power-failure simulator (the `sim` feature; its clock moves only when
//! // asked).
//! let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
//! let heap = Heap::create(&config)?;
//! let owner = heap.register("greetings")?;
//! heap.run_op(|op| op.alloc(owner, 0, b"acknowledged"))?;
//! heap.sync()?; // everything completed so far is durable now
//! heap.run_op(|op| op.alloc(owner, 0, b"not yet synced"))?;
//!
//! // Pull the plug: seed 7 decides which unflushed cache lines reached the media.
//! let image = heap.simulator().unwrap().crash(7);
//! let heap = Heap::open_image(image, &config)?;
//! let found = heap.collect(ScanFilter::all().owner(owner))?;
//! assert_eq!(found.len(), 1); // a consistent prefix: the synced operation, not the other
//! assert_eq!(heap.read_payload(found[0].block)?, b"acknowledged");
//! # Ok::<(), montage_core::Error>(())
//! ```

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(test, allow(clippy::unwrap_used))]
#![doc(test(attr(deny(warnings))))]
// `Error` has drop glue (it can hold an `io::Error` and a path), so an error built eagerly for
// `ok_or` is dropped on every success; on the allocation path that was 14% of the time.
// Errors are therefore built lazily, which this lint would undo.
#![allow(clippy::unnecessary_lazy_evaluations)]

// The layers, lowest first; a module uses only those above it in this list (`cargo xtask
// tidy` checks it). See docs/ARCHITECTURE.md.
mod alloc;
mod base;
mod config;
mod epoch;
mod error;
mod fingerprint;
mod heap;
mod meta;
pub mod payload;
mod persist;
mod primitive;
#[cfg(feature = "sim")]
mod race;
mod random;
mod recovery;
mod spare;
mod thread_id;
pub mod verified;

pub use alloc::AllocStats;
pub use alloc::block::{BlockInfo, BlockKind, BlockView, OwnerId, PBlock};
pub use base::epoch::Epoch;
pub use config::{BackendKind, EpochLength, HeapConfig, RecoveryProgress, WriteBack};

pub use epoch::op::{InPlace, OpGuard};
pub use epoch::stamped::{StampedLock, StampedRwLock};
pub use error::{Error, Result};
pub use heap::raw;
pub use heap::{Attached, ClassUsage, Heap, LargeUsage, ScanFilter, StructureUsage, Usage};
#[cfg(feature = "serde")]
pub use payload::Serde;
pub use payload::{Codec, POff, PRef, Payload};
pub use recovery::{QuarantineReason, Quarantined, RecoveryReport, Repair};

/// The guards of [`StampedLock`] and [`StampedRwLock`].
pub mod stamped {
    pub use crate::epoch::stamped::{
        StampedGuard, StampedReadGuard, StampedWriteGuard, Unstamped, UnstampedWriteGuard,
    };
}

/// The fixed sizes and limits of the heap format and the runtime.
pub mod limits {
    pub use crate::alloc::size_class::block_size;
    pub use crate::base::layout::{
        CACHE_LINE, DIRECTORY_CAPACITY, HEADER_LEN, MAX_HEAP_SIZE, MIN_HEAP_SIZE, NAME_MAX,
        PAGE_SIZE, REGISTRY_CAPACITY, SPAN_SIZE, TRAILER_LEN,
    };
    pub use crate::config::DEFAULT_HEAP_SIZE;
}

/// The power-failure simulator every crash test runs on (the `sim` feature): a backend that
/// logs every store, write-back and fence, and builds any post-crash image the persistence
/// model allows from a seed. Choose it with [`HeapConfig::simulated`]; take an image with
/// [`Simulator::crash`](sim::Simulator::crash) and recover it with [`Heap::open_image`].
/// `montage-testkit` has the seed loops and sync checks that crash tests share.
#[cfg(feature = "sim")]
pub mod sim {
    pub use crate::config::SimMode;
    pub use crate::heap::blocks::race::{
        Hook as NamedReadHook, NamedReadPoint, pause_named_reads_at,
    };
    pub use crate::persist::sim::{CrashImage, Simulator, SplitMix64, crashes_on_this_thread};
    pub use crate::verified::queue::race::{Hook as QueueHook, QueuePoint, pause_queue_reads_at};
}

/// What `#[derive(Payload)]` expands to. Not part of the API: no semver promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::payload::access::{cas_field, get_field, read_plain, set_field, write_plain};
    pub use crate::payload::codec::{encode_payload, fingerprint_payload};
    pub use zerocopy;

    /// Writes `value` into `out` at byte `offset` (a payload's field, during
    /// [`PayloadField::write_field`](crate::payload::PayloadField::write_field)).
    ///
    /// # Panics
    ///
    /// If the field does not lie inside `out`.
    pub fn write_at<F: crate::payload::PayloadField>(out: &mut [u8], offset: usize, value: &F) {
        value.write_field(&mut out[offset..offset + size_of::<F>()]);
    }

    /// Reads the `F` at byte `offset` of `bytes`; `None` if it lies outside or is invalid.
    pub fn read_at<F: crate::payload::PayloadField>(bytes: &[u8], offset: usize) -> Option<F> {
        F::read_field(bytes.get(offset..offset.checked_add(size_of::<F>())?)?)
    }
}
