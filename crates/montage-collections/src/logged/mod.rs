//! [`Logged`]: persistence for a structure kept in DRAM as it is, by logging each call that
//! changes it (a semantic log, after Pronto) on the heap's epochs.
//!
//! The structure `T` stays an ordinary Rust value in DRAM. Each change is described by an
//! operation, a value of `T::Op` ([`Replay`]); [`Logged::apply`] writes the operation as a
//! *record* (its sequence number, then the operation's [`Codec`] bytes) and applies it to
//! `T`, in one heap operation. The records of one epoch's calls are appended to a *page*, a
//! payload of that epoch written in place, which is written back with the epoch's batch
//! like every payload: logging costs a copy of the operation's encoding into the page, not
//! an allocation and not a flush. [`open`](Logged::open) rebuilds `T` by applying the
//! recovered records, in sequence order, to `T`'s initial value.
//!
//! # The contract
//!
//! `apply` must be deterministic: the same operations applied to the same initial value
//! must give the same `T`, so that replay after a crash rebuilds what ran before it. Log the
//! decision, not the dice: a time, a random choice or anything read from outside `T` is
//! passed in as part of the operation. `apply` must not use the heap (it runs inside the
//! heap operation that writes its record). [`Logged::verify_replay`] checks it: it rebuilds
//! `T` from the heap and compares it with the live value (the project's tests call it).
//!
//! After a crash, `T` is as a prefix of the calls left it (every call of the epochs the
//! recovered clock covers), and every call that completed before a
//! [`Heap::sync`](montage_core::Heap::sync) that returned is in it.
//!
//! # Why the records form a prefix
//!
//! Each call holds the lock that protects `T` (a
//! [`StampedRwLock`](montage_core::StampedRwLock), for writing) while it takes the next
//! sequence number, writes its record and applies its operation. The lock orders the calls,
//! and the stamp orders their epochs the same way (a call of an older epoch that finds `T`
//! changed in a newer one aborts and retries in the current epoch, INV-COL-1). A page holds
//! records of its own epoch only. Recovery keeps every payload of the epochs up to a cut and
//! none after, so the records that survive are those of the first calls: sequence numbers
//! `0..n` with no gap. A gap is damage, and
//! `open` reports it as [`Error::Corrupted`].
//!
//! # Snapshots
//!
//! A structure whose [`Replay::save`] and [`Replay::load`] write and read its value (with the
//! `serde` feature, `save_serde` and `load_serde` do it for any serde type) can be
//! compacted: [`Logged::compact`] serializes `T` under its read lock (calls wait for that
//! one serialization, reads go on), writes the bytes as chunk payloads in short operations (a long one would
//! hold the clock back), then a commit payload naming the sequence number the snapshot
//! covers up to, and only then deletes the records and the snapshot it replaces. Opening
//! loads the newest committed snapshot and replays the records after it. The commit is in an
//! epoch no older than its chunks' and the records it covers, and the deletions in epochs
//! no older than the commit's, so whatever prefix of epochs a crash keeps holds a complete
//! snapshot (or none) and the records after it; what a crash left of a half-made snapshot,
//! or of a half-done deletion, is deleted at the next open. Without `save`, the log grows
//! with the calls and opening replays them all.
//!
//! Snapshots are taken three ways:
//! * by the [`SnapshotPolicy`], on a thread of the structure's own (started at the first
//!   snapshot it asks for): by default when the log holds 4 MiB and at least as many bytes
//!   as the last snapshot;
//! * by [`Logged::compact`];
//! * by closing ([`Logged::close`], or dropping the handle), when the log is not empty.
//!
//! # Versions of the code
//!
//! A record's type id carries the codec id of `T::Op` (for `#[montage::logged]`, a hash of
//! the methods' names and argument types); a snapshot's chunks and commit do not, and the
//! commit stores [`Replay::snapshot_format`]. So a new version of the code whose operations
//! changed opens a structure that was closed (its log empty) from the snapshot alone, while
//! a log of the old operations is [`Error::LayoutMismatch`] and the open changes nothing: open
//! it with the old code and close it first.
//!
//! # Shards
//!
//! [`LoggedShards`] holds `n` independent `T`s under one name, each with its own lock,
//! sequence numbers, log and snapshots; a call goes to the shard its key chooses, so calls
//! with different keys run in parallel, and a snapshot stalls the calls of one shard only.
//! The shards' payloads carry the shard count and their index in their type ids; opening
//! reads them in one scan and rebuilds the shards in parallel. Each shard's records form a
//! prefix of its calls, as above; calls on different shards are not ordered with each
//! other beyond their epochs (a crash keeps the calls of the same epochs in every shard).

mod core;
mod found;
mod staged;

use std::sync::Arc;

use montage_core::payload::Fingerprint;
use montage_core::{Codec, Error, Heap, Result};

use self::core::Core;
use self::found::{rebuild_all, rebuild_one};

/// A structure whose changes are operations that can be replayed: what [`Logged`] needs.
///
/// ```
/// use montage_collections::logged::Replay;
///
/// /// Balances by account; an operation moves an amount into one.
/// #[derive(Default)]
/// struct Ledger(std::collections::BTreeMap<u64, i64>);
///
/// impl Replay for Ledger {
///     /// (account, amount), stored as two little-endian integers.
///     type Op = (u64, i64);
///     type Output = i64;
///
///     fn apply(&mut self, (account, amount): (u64, i64)) -> i64 {
///         let balance = self.0.entry(account).or_insert(0);
///         *balance += amount;
///         *balance
///     }
/// }
/// ```
pub trait Replay {
    /// One change, as it is logged.
    type Op: Codec;
    /// What applying a change returns to the caller of [`Logged::apply`] (replay discards it).
    type Output;

    /// Applies `op`. Deterministic: see the module docs.
    fn apply(&mut self, op: Self::Op) -> Self::Output;

    /// Writes a snapshot of this value into `out` (appending), or returns `None`, as the
    /// default does, for a structure that takes none (its log then only grows). With the
    /// `serde` feature, `Some(save_serde(self, out))`.
    ///
    /// # Errors
    ///
    /// The value cannot be written ([`Error::Encode`]).
    fn save(&self, out: &mut Vec<u8>) -> Option<Result<()>> {
        let _ = out;
        None
    }

    /// The value a snapshot written by [`save`](Self::save) holds; `None` if `bytes` are no
    /// such snapshot (or, as the default, the structure takes none).
    fn load(bytes: &[u8]) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = bytes;
        None
    }

    /// An id of the format [`save`](Self::save) writes, stored with each snapshot: opening a
    /// snapshot of another format is [`Error::LayoutMismatch`] rather than a misread. The
    /// default, 0, is for structures that take no snapshots; with the `serde` feature,
    /// `serde_format::<Self>()` (the type's serde data model).
    ///
    /// # Errors
    ///
    /// The format's id cannot be computed (as `serde_format` says).
    fn snapshot_format() -> Result<u64> {
        Ok(0)
    }
}

/// Writes `value` with postcard into `out` (appending), for [`Replay::save`]. Needs the
/// `serde` feature.
///
/// ```
/// use montage_collections::logged::{load_serde, save_serde};
///
/// let mut out = Vec::new();
/// save_serde(&(7u8, "seven"), &mut out)?;
/// let mut appended = vec![0xAA];
/// save_serde(&(7u8, "seven"), &mut appended)?;
/// assert_eq!(appended[1..], out[..]);
/// assert_eq!(load_serde::<(u8, String)>(&out), Some((7, "seven".to_owned())));
/// # Ok::<(), montage_core::Error>(())
/// ```
///
/// A slice of bytes in the value (`Vec<u8>`, `Box<[u8]>`) is copied whole
/// ([`encode_serde`](montage_core::payload::encode_serde)); loading reads it a number at a
/// time unless the field says `#[serde(with = "serde_bytes")]`, which makes loading of
/// byte-heavy structures nearly twice as fast (`montage-logged` in the harness measures
/// both). A byte array (`[u8; N]`) is written and read a number at a time.
///
/// # Errors
///
/// [`Error::Encode`] if the value has no postcard encoding; `out` is then as it was.
#[cfg(feature = "serde")]
pub fn save_serde<T: serde::Serialize>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    montage_core::payload::encode_serde(value, out)
}

/// Reads what [`save_serde`] wrote, for [`Replay::load`]; `None` if the bytes are not
/// exactly one postcard encoding of a `T`. Needs the `serde` feature.
#[cfg(feature = "serde")]
pub fn load_serde<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Some(value),
        _ => None,
    }
}

/// Inside an `impl Replay for T` of a serde type: snapshots in serde's form
/// ([`Replay::save`] with `save_serde`, [`Replay::load`] with `load_serde`,
/// [`Replay::snapshot_format`] with `serde_format`). Needs the `serde` feature.
///
/// ```
/// use montage_collections::logged::Replay;
///
/// #[derive(Default, serde::Serialize, serde::Deserialize)]
/// struct Tally(u64);
///
/// impl Replay for Tally {
///     type Op = u64;
///     type Output = ();
///
///     fn apply(&mut self, by: u64) {
///         self.0 += by;
///     }
///
///     montage_collections::serde_snapshots!();
/// }
/// ```
#[cfg(feature = "serde")]
#[macro_export]
macro_rules! serde_snapshots {
    () => {
        fn save(
            &self,
            out: &mut ::std::vec::Vec<u8>,
        ) -> ::core::option::Option<$crate::logged::__private::Result<()>> {
            ::core::option::Option::Some($crate::logged::save_serde(self, out))
        }

        fn load(bytes: &[u8]) -> ::core::option::Option<Self> {
            $crate::logged::load_serde(bytes)
        }

        fn snapshot_format() -> $crate::logged::__private::Result<u64> {
            $crate::logged::serde_format::<Self>()
        }
    };
}

/// The id of `T`'s serde data model, for [`Replay::snapshot_format`]: the one
/// [`Serde<T>`](montage_core::payload::Serde) uses. Needs the `serde` feature.
///
/// # Errors
///
/// [`Error::Encode`] if the type cannot be traced or postcard cannot read it back.
#[cfg(feature = "serde")]
pub fn serde_format<T>() -> Result<u64>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    <montage_core::payload::Serde<T> as Codec>::codec_id()
}

/// What `#[montage::logged]` expands to. Not part of the API: no semver promise.
#[doc(hidden)]
pub mod __private {
    pub use montage_core::Result;
    use montage_core::{Codec, Error};

    /// Appends `value`'s encoding behind its length (`u32`, little-endian).
    ///
    /// # Errors
    ///
    /// What the codec returns; [`Error::Encode`] for an encoding of 4 GiB or more.
    pub fn encode_field<T: Codec>(value: &T, out: &mut Vec<u8>) -> Result<()> {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        value.encode(out)?;
        let len = u32::try_from(out.len() - at - 4).map_err(|_| Error::Encode {
            type_name: std::any::type_name::<T>(),
            why: "an argument of 4 GiB or more".to_owned(),
        })?;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }

    /// Takes one field [`encode_field`] wrote off the front of `rest`.
    pub fn decode_field<T: Codec>(rest: &mut &[u8]) -> Option<T> {
        let (len, tail) = rest.split_at_checked(4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        let (field, tail) = tail.split_at_checked(len)?;
        *rest = tail;
        T::decode(field)
    }
}

/// When a logged structure takes a snapshot by itself, on a thread of its own (calls wait
/// only while the shard's `T` is serialized, as for [`Logged::compact`]).
///
/// The default, [`log_bytes`](Self::log_bytes)`(4 MiB)`: a snapshot when a shard's log
/// holds at least 4 MiB of records and at least as many bytes as its last snapshot. Writing
/// snapshots then costs at most about as much as writing the log, and a replay after a
/// crash reads at most about as much log as snapshot.
///
/// ```
/// use montage_collections::logged::SnapshotPolicy;
///
/// // Every 64 KiB of log once the log is as large as a tenth of the snapshot.
/// let eager = SnapshotPolicy::log_bytes(64 << 10).relative_to_snapshot(10);
/// assert_ne!(eager, SnapshotPolicy::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// `None`: only [`Logged::compact`] and closing take snapshots.
    min_log_bytes: Option<u64>,
    snapshot_percent: u64,
}

impl SnapshotPolicy {
    /// No snapshot but those [`Logged::compact`] and closing take.
    #[must_use]
    pub const fn manual() -> SnapshotPolicy {
        SnapshotPolicy {
            min_log_bytes: None,
            snapshot_percent: 100,
        }
    }

    /// A snapshot when a shard's log holds at least `min_log_bytes` bytes of records and at
    /// least as many as its last snapshot.
    #[must_use]
    pub const fn log_bytes(min_log_bytes: u64) -> SnapshotPolicy {
        SnapshotPolicy {
            min_log_bytes: Some(min_log_bytes),
            snapshot_percent: 100,
        }
    }

    /// This policy with the second condition changed: the log must hold at least `percent`
    /// percent of the last snapshot's bytes (100 by default).
    #[must_use]
    pub const fn relative_to_snapshot(self, percent: u64) -> SnapshotPolicy {
        SnapshotPolicy {
            snapshot_percent: percent,
            ..self
        }
    }

    /// The log bytes at which a shard whose snapshot has `snapshot_bytes` takes its next
    /// (`u64::MAX`: never).
    fn threshold(self, snapshot_bytes: u64) -> u64 {
        match self.min_log_bytes {
            None => u64::MAX,
            Some(min) => {
                let relative = u128::from(snapshot_bytes) * u128::from(self.snapshot_percent) / 100;
                min.max(u64::try_from(relative).unwrap_or(u64::MAX))
            }
        }
    }
}

impl Default for SnapshotPolicy {
    fn default() -> SnapshotPolicy {
        SnapshotPolicy::log_bytes(4 << 20)
    }
}

/// A handle that logs the calls of a `T`: a [`Logged<T>`], and one [`Shard`] of a
/// [`LoggedShards<T>`]. The methods `#[montage::logged]` generates are implemented for
/// every `Logs<T>`.
pub trait Logs<T: Replay> {
    /// Logs `op` and applies it ([`Logged::apply`]).
    ///
    /// # Errors
    ///
    /// As [`Logged::apply`].
    fn log(&self, op: T::Op) -> Result<T::Output>;
}

/// A structure `T` in DRAM whose changes are logged to the heap and replayed when it is
/// opened again (module docs). `Send + Sync` when `T` is; it owns its heap handle.
///
/// Dropping it closes it as [`close`](Self::close) does, ignoring errors.
pub struct Logged<T: Replay> {
    core: Arc<Core<T>>,
    closed: bool,
}

impl<T: Replay> std::fmt::Debug for Logged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logged")
            .field("name", &self.core.name())
            .field("owner", &self.core.attached().owner())
            .finish_non_exhaustive()
    }
}

impl<T: Replay> Logged<T> {
    /// Opens the logged structure `name` in `heap`: creates it from `T::default()`, or
    /// rebuilds it from its newest snapshot (or `T::default()`) and the records after it.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(heap: &Heap, name: &str) -> Result<Logged<T>>
    where
        T: Default,
    {
        Self::open_with(heap, name, T::default)
    }

    /// Opens the logged structure `name` in `heap`, with `initial` the value its log starts
    /// from (it must be the same at every open, as the log replays onto it).
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if the structure's log holds operations of another type
    /// (another version of `T::Op` whose codec id differs: close the structure with the old
    /// code first, which empties its log), if its snapshot is of another
    /// [format](Replay::snapshot_format), or if it is a [`LoggedShards`]; then nothing is
    /// changed. [`Error::Corrupted`] if a record does not decode or the records have a gap
    /// or a repeated sequence number (a record was lost), or a committed snapshot lost a
    /// chunk or does not load; [`Error::Panicked`] if `apply` panicked during the replay;
    /// [`Error::StructureOpen`], [`Error::DirectoryFull`] or [`Error::BadName`].
    pub fn open_with(heap: &Heap, name: &str, initial: impl FnOnce() -> T) -> Result<Logged<T>> {
        let core = Core::open(heap, name, 1, |found| rebuild_one(found, initial, name))?;
        Ok(Logged {
            core,
            closed: false,
        })
    }

    /// Logs `op` and applies it to the structure, in one heap operation; returns what
    /// [`Replay::apply`] returned. The record is durable with its epoch, as every write is:
    /// call [`Heap::sync`](montage_core::Heap::sync) before telling anyone it happened.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfSpace`] when the heap is full, and what encoding `op` returns: then
    /// nothing was logged or applied. [`Error::Panicked`] if an earlier `apply` panicked.
    ///
    /// # Panics
    ///
    /// If [`Replay::apply`] panics: the panic goes on to the caller, the call is rolled back
    /// (its record is not kept), and this handle fails every later call with
    /// [`Error::Panicked`]; opening the structure again rebuilds it from its log.
    pub fn apply(&self, op: T::Op) -> Result<T::Output>
    where
        T: Send + Sync + 'static,
    {
        Core::apply(&self.core, 0, op)
    }

    /// Runs `f` on the structure, under its read lock, and returns what `f` returns. Reads
    /// are not logged.
    ///
    /// # Errors
    ///
    /// [`Error::Panicked`] if an earlier `apply` panicked.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.core.read(0, f)
    }

    /// Rebuilds the structure from what the heap holds (the snapshot and the records after
    /// it, as [`open`](Self::open) would) and compares it with the live one: whether replay
    /// gives what the calls gave, the determinism [`Replay::apply`] promises. For tests and
    /// debugging: calls wait while it reads the whole log.
    ///
    /// # Errors
    ///
    /// What [`open`](Self::open) returns for the payloads it reads.
    pub fn verify_replay(&self) -> Result<bool>
    where
        T: Default + PartialEq,
    {
        self.verify_replay_with(T::default)
    }

    /// [`verify_replay`](Self::verify_replay) for a structure opened with
    /// [`open_with`](Self::open_with) and this `initial` value.
    ///
    /// # Errors
    ///
    /// As [`verify_replay`](Self::verify_replay).
    pub fn verify_replay_with(&self, initial: impl FnOnce() -> T) -> Result<bool>
    where
        T: PartialEq,
    {
        let name = self.core.name();
        self.core
            .verify(|found| rebuild_one(found, initial, name), T::eq)
    }

    /// How many records the log holds: the calls since the last snapshot.
    pub fn log_len(&self) -> u64 {
        self.core.counts(0).0
    }

    /// How many calls the structure has had since it was created (the next record's
    /// sequence number).
    pub fn calls(&self) -> u64 {
        self.core.counts(0).1
    }

    /// Takes a snapshot of the structure and deletes the records (and the snapshot) it
    /// replaces (module docs, "Snapshots"); returns `false` if there was nothing to compact
    /// (no call since the last snapshot). Calls wait only while `T` is serialized; reads
    /// go on.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] if `T` takes no snapshots ([`Replay::save`] returns `None`);
    /// what `save` returns; [`Error::OutOfSpace`] if the heap cannot hold the snapshot, which
    /// is then abandoned (its chunks deleted) while the log stays as it was;
    /// [`Error::Panicked`] if an earlier `apply` panicked.
    pub fn compact(&self) -> Result<bool> {
        self.core.compact(0)
    }
}

/// What every handle of a logged structure has the same: its policy, closing, its heap, its
/// losses to damage, and the close on drop.
macro_rules! handle_common {
    ($handle:ident) => {
        impl<T: Replay> $handle<T> {
            /// Sets when the structure takes snapshots by itself ([`SnapshotPolicy`], for
            /// each shard; the default until this is called).
            pub fn set_snapshot_policy(&self, policy: SnapshotPolicy) {
                self.core.set_policy(policy);
            }

            /// What the last snapshot the policy took by itself failed with, if one failed
            /// since the last call of this (the log was kept; the shard tries again when
            /// its log has doubled).
            pub fn take_snapshot_error(&self) -> Option<Error> {
                self.core.take_snapshot_error()
            }

            /// Closes the structure: waits for a snapshot the policy is taking, then takes
            /// a last one of each shard whose log is not empty, if `T` takes snapshots, so
            /// that the next open (by this code or a newer version of it, whose operations
            /// may differ) starts from the snapshots alone. The records stay durable with
            /// their epochs as always; a `T` without snapshots keeps its log. Dropping the
            /// handle does the same, ignoring errors (and nothing while a panic unwinds).
            ///
            /// # Errors
            ///
            /// What [`Logged::compact`] returns (but [`Error::Unsupported`]), for the first
            /// shard that failed: its log then stays as it was.
            pub fn close(mut self) -> Result<()> {
                self.closed = true;
                self.core.close()
            }

            /// The heap the structure is in.
            pub fn heap(&self) -> &Heap {
                self.core.attached().heap()
            }

            /// The records this structure lost to damage when the heap was opened with
            /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged)
            /// (such a loss is a gap, and `open` fails with [`Error::Corrupted`]).
            pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
                self.core.attached().quarantined()
            }
        }

        impl<T: Replay> Drop for $handle<T> {
            fn drop(&mut self) {
                close_on_drop(&self.core, self.closed);
            }
        }
    };
}

handle_common!(Logged);
handle_common!(LoggedShards);

/// What dropping a handle does: [`Core::close`], errors ignored, unless the handle was
/// closed already or a panic is unwinding (a `T` may then be half changed).
fn close_on_drop<T: Replay>(core: &Core<T>, closed: bool) {
    if !closed && !std::thread::panicking() {
        // Best effort, as the heap's own drop: `close` reports errors; the log is kept.
        let _ = core.close();
    }
}

impl<T: Replay + Send + Sync + 'static> Logs<T> for Logged<T> {
    fn log(&self, op: T::Op) -> Result<T::Output> {
        self.apply(op)
    }
}

/// `shards` independent structures `T` under one name, a call going to the one its key
/// chooses: concurrent calls with different keys take different locks. Each shard has its
/// own sequence numbers, log and snapshots; opening rebuilds the shards in parallel.
///
/// The key of a call is any [`Codec`] value; the shard is a fixed hash of its encoding
/// (the same in every build), so a key goes to the same shard after every open. The shard
/// count is part of the structure: opening it with another count is
/// [`Error::LayoutMismatch`].
///
/// ```
/// use montage_collections::logged::{LoggedShards, Replay};
/// use montage_core::{Heap, HeapConfig};
///
/// /// Visits per page.
/// #[derive(Default)]
/// struct Visits(std::collections::HashMap<String, u64>);
///
/// impl Replay for Visits {
///     type Op = String;
///     type Output = u64;
///
///     fn apply(&mut self, page: String) -> u64 {
///         let count = self.0.entry(page).or_insert(0);
///         *count += 1;
///         *count
///     }
/// }
///
/// let heap = Heap::create(&HeapConfig::in_memory(8 << 20))?;
/// let visits = LoggedShards::<Visits>::open(&heap, "visits", 4)?;
/// let page = "/index.html".to_owned();
/// visits.apply(&page, page.clone())?;
/// assert_eq!(visits.apply(&page, page.clone())?, 2);
/// assert_eq!(visits.read(&page, |v| v.0.len())?, 1);
/// # Ok::<(), montage_core::Error>(())
/// ```
pub struct LoggedShards<T: Replay> {
    core: Arc<Core<T>>,
    closed: bool,
}

impl<T: Replay> std::fmt::Debug for LoggedShards<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggedShards")
            .field("name", &self.core.name())
            .field("owner", &self.core.attached().owner())
            .field("shards", &self.core.shards())
            .finish_non_exhaustive()
    }
}

impl<T: Replay> LoggedShards<T> {
    /// Opens the sharded structure `name` in `heap` with `shards` shards (1 to 64), each
    /// created from `T::default()` or rebuilt, in parallel, from its snapshot and log.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(heap: &Heap, name: &str, shards: usize) -> Result<LoggedShards<T>>
    where
        T: Default + Send,
    {
        Self::open_with(heap, name, shards, |_| T::default())
    }

    /// Opens the sharded structure `name` with `shards` shards, shard `i` starting from
    /// `initial(i)` (the same at every open).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a shard count outside 1 to 64;
    /// [`Error::LayoutMismatch`] if the structure has another shard count (or is a
    /// [`Logged`]); otherwise as [`Logged::open_with`].
    pub fn open_with(
        heap: &Heap,
        name: &str,
        shards: usize,
        initial: impl Fn(usize) -> T + Sync,
    ) -> Result<LoggedShards<T>>
    where
        T: Send,
    {
        let core = Core::open(heap, name, shards, |found| {
            rebuild_all(found, &initial, name)
        })?;
        Ok(LoggedShards {
            core,
            closed: false,
        })
    }

    /// How many shards the structure has.
    pub fn shards(&self) -> usize {
        self.core.shards()
    }

    /// The index of the shard that `key` goes to.
    ///
    /// # Errors
    ///
    /// What encoding `key` returns.
    pub fn shard_of<K: Codec>(&self, key: &K) -> Result<usize> {
        // The fingerprint of the key's encoding: straight from the key where it has its bytes
        // at hand (integers, strings, ...), else from a copy of them (the same value).
        let fingerprint = match key.fingerprint_encoding(Fingerprint::new()) {
            Some(fingerprint) => fingerprint,
            None => crate::structure::with_buffer(|bytes| {
                bytes.clear();
                key.encode(bytes)?;
                Ok::<_, Error>(Fingerprint::new().bytes(bytes))
            })?,
        };
        let hash = mix(fingerprint.finish());
        // The high half of hash * shards: uniform over the shards for a uniform hash.
        let shards = self.core.shards() as u128;
        Ok(((u128::from(hash) * shards) >> 64) as usize)
    }

    /// The shard that `key` goes to, for several calls on it (and the methods
    /// `#[montage::logged]` generates, which every [`Shard`] has).
    ///
    /// # Errors
    ///
    /// What encoding `key` returns.
    pub fn shard<K: Codec>(&self, key: &K) -> Result<Shard<'_, T>> {
        Ok(Shard {
            core: &self.core,
            index: self.shard_of(key)?,
        })
    }

    /// Shard `index`, if there is one.
    pub fn shard_at(&self, index: usize) -> Option<Shard<'_, T>> {
        (index < self.core.shards()).then_some(Shard {
            core: &self.core,
            index,
        })
    }

    /// Logs `op` on the shard `key` goes to and applies it there ([`Logged::apply`]).
    ///
    /// # Errors
    ///
    /// As [`Logged::apply`], and what encoding `key` returns.
    ///
    /// # Panics
    ///
    /// As [`Logged::apply`].
    pub fn apply<K: Codec>(&self, key: &K, op: T::Op) -> Result<T::Output>
    where
        T: Send + Sync + 'static,
    {
        Core::apply(&self.core, self.shard_of(key)?, op)
    }

    /// Runs `f` on the shard `key` goes to, under its read lock.
    ///
    /// # Errors
    ///
    /// As [`Logged::read`], and what encoding `key` returns.
    pub fn read<K: Codec, R>(&self, key: &K, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.core.read(self.shard_of(key)?, f)
    }

    /// Compacts every shard ([`Logged::compact`]), one after another; returns how many had
    /// something to compact.
    ///
    /// # Errors
    ///
    /// As [`Logged::compact`], for the first shard that failed (the shards before it are
    /// compacted).
    pub fn compact(&self) -> Result<usize> {
        let mut compacted = 0;
        for index in 0..self.core.shards() {
            compacted += usize::from(self.core.compact(index)?);
        }
        Ok(compacted)
    }

    /// The records in all shards' logs.
    pub fn log_len(&self) -> u64 {
        (0..self.core.shards()).map(|i| self.core.counts(i).0).sum()
    }

    /// The calls all shards have had since the structure was created.
    pub fn calls(&self) -> u64 {
        (0..self.core.shards()).map(|i| self.core.counts(i).1).sum()
    }

    /// [`Logged::verify_replay`] of every shard.
    ///
    /// # Errors
    ///
    /// As [`Logged::verify_replay`].
    pub fn verify_replay(&self) -> Result<bool>
    where
        T: Default + PartialEq + Send,
    {
        self.verify_replay_with(|_| T::default())
    }

    /// [`verify_replay`](Self::verify_replay) for a structure opened with
    /// [`open_with`](Self::open_with) and this `initial`.
    ///
    /// # Errors
    ///
    /// As [`Logged::verify_replay`].
    pub fn verify_replay_with(&self, initial: impl Fn(usize) -> T + Sync) -> Result<bool>
    where
        T: PartialEq + Send,
    {
        let name = self.core.name();
        self.core
            .verify(|found| rebuild_all(found, &initial, name), T::eq)
    }
}

/// The finalizer of `SplitMix64`: spreads FNV's hash over all 64 bits, so that the shard (its
/// high bits) depends on every byte of the key.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One shard of a [`LoggedShards`]: its calls, reads and compaction.
pub struct Shard<'a, T: Replay> {
    core: &'a Arc<Core<T>>,
    index: usize,
}

impl<T: Replay> std::fmt::Debug for Shard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("structure", &self.core.name())
            .field("index", &self.index)
            .finish()
    }
}

impl<T: Replay> Shard<'_, T> {
    /// Its index among the structure's shards.
    pub fn index(&self) -> usize {
        self.index
    }

    /// [`Logged::apply`] on this shard.
    ///
    /// # Errors
    ///
    /// As [`Logged::apply`].
    ///
    /// # Panics
    ///
    /// As [`Logged::apply`].
    pub fn apply(&self, op: T::Op) -> Result<T::Output>
    where
        T: Send + Sync + 'static,
    {
        Core::apply(self.core, self.index, op)
    }

    /// [`Logged::read`] on this shard.
    ///
    /// # Errors
    ///
    /// As [`Logged::read`].
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.core.read(self.index, f)
    }

    /// [`Logged::compact`] of this shard.
    ///
    /// # Errors
    ///
    /// As [`Logged::compact`].
    pub fn compact(&self) -> Result<bool> {
        self.core.compact(self.index)
    }

    /// The records in this shard's log.
    pub fn log_len(&self) -> u64 {
        self.core.counts(self.index).0
    }

    /// The calls this shard has had since the structure was created.
    pub fn calls(&self) -> u64 {
        self.core.counts(self.index).1
    }
}

impl<T: Replay + Send + Sync + 'static> Logs<T> for Shard<'_, T> {
    fn log(&self, op: T::Op) -> Result<T::Output> {
        self.apply(op)
    }
}
