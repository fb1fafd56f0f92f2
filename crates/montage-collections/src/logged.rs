//! [`Logged`]: persistence for a structure kept in DRAM as it is, by logging each call that
//! changes it (a semantic log, after Pronto) on the heap's epochs.
//!
//! The structure `T` stays an ordinary Rust value in DRAM. Each change is described by an
//! operation, a value of `T::Op` ([`Replay`]); [`Logged::apply`] writes the operation as
//! one payload (a *record*: its sequence number, then the operation's [`Codec`] bytes) and
//! applies it to `T`, in one heap operation. A record is written back with its epoch's
//! batch like every payload, so logging costs one allocation and a copy of the operation's
//! encoding, not a flush. [`open`](Logged::open) rebuilds `T` by applying the recovered
//! records, in sequence order, to `T`'s initial value.
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
//! Each call holds the lock that protects `T` (a [`StampedLock`]) while it takes the next
//! sequence number, writes its record and applies its operation. The lock orders the calls,
//! and the stamp orders their epochs the same way (a call of an older epoch that finds `T`
//! changed in a newer one aborts and retries in the current epoch, INV-COL-1). Recovery keeps
//! every payload of the epochs up to a cut and none after, so the records that survive are
//! those of the first calls: sequence numbers `0..n` with no gap. A gap is damage, and
//! `open` reports it as [`Error::Corrupted`].
//!
//! # Snapshots
//!
//! A structure whose [`Replay::save`] and [`Replay::load`] write and read its value (with the
//! `serde` feature, `save_serde` and `load_serde` do it for any serde type) can be
//! compacted: [`Logged::compact`] serializes `T` under its lock (writers wait for that one
//! serialization), writes the bytes as chunk payloads in short operations (a long one would
//! hold the clock back), then a commit payload naming the sequence number the snapshot
//! covers up to, and only then deletes the records and the snapshot it replaces. Opening
//! loads the newest committed snapshot and replays the records after it. The commit is in an
//! epoch no older than its chunks' and the records it covers, and the deletions in epochs
//! no older than the commit's, so whatever prefix of epochs a crash keeps holds a complete
//! snapshot (or none) and the records after it; what a crash left of a half-made snapshot,
//! or of a half-done deletion, is deleted at the next open. Without `save`, the log grows
//! with the calls and opening replays them all.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use montage_core::{Attached, Codec, Error, Heap, PBlock, Result, StampedLock};

use crate::structure::{self, lock};

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

/// Writes `value` with postcard into `out`, for [`Replay::save`]. Needs the `serde` feature.
///
/// # Errors
///
/// [`Error::Encode`] if the value has no postcard encoding.
#[cfg(feature = "serde")]
pub fn save_serde<T: serde::Serialize>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    let bytes = postcard::to_allocvec(value).map_err(|err| Error::Encode {
        type_name: std::any::type_name::<T>(),
        why: err.to_string(),
    })?;
    out.extend_from_slice(&bytes);
    Ok(())
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

/// The DRAM side.
struct State<T> {
    value: T,
    /// The sequence number the next record gets.
    next_seq: u64,
    /// The records after the snapshot, by sequence number.
    records: VecDeque<(u64, PBlock)>,
    /// The sequence number the current snapshot covers up to (0: none).
    snapshot_upto: u64,
    /// The current snapshot's chunks and commit.
    snapshot: Vec<PBlock>,
}

/// The type ids of a `T`'s payloads.
#[derive(Clone, Copy)]
struct Kinds {
    record: u64,
    chunk: u64,
    commit: u64,
}

impl Kinds {
    fn of<T: Replay>() -> Result<Kinds> {
        let op = T::Op::codec_id()?;
        Ok(Kinds {
            record: structure::type_id_of("logged-record", &[op]),
            chunk: structure::type_id_of("logged-chunk", &[op]),
            commit: structure::type_id_of("logged-commit", &[op]),
        })
    }
}

/// Bytes of a snapshot per chunk payload, each written in an operation of its own.
const CHUNK: usize = 64 << 10;

/// A structure `T` in DRAM whose changes are logged to the heap and replayed when it is
/// opened again (module docs).
pub struct Logged<T: Replay> {
    attached: Attached,
    name: String,
    kinds: Kinds,
    state: StampedLock<State<T>>,
    /// Held by a compaction from its serialization to its deletions: one at a time.
    compacting: Mutex<()>,
    /// Set when `apply` panicked: `T` may be half changed, and only reopening rebuilds it.
    poisoned: AtomicBool,
}

impl<T: Replay> std::fmt::Debug for Logged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logged")
            .field("name", &self.name)
            .field("owner", &self.attached.owner())
            .finish_non_exhaustive()
    }
}

fn corrupted(offset: u64, what: &'static str) -> Error {
    Error::Corrupted { offset, what }
}

impl<T: Replay> Logged<T> {
    /// Opens the logged structure `name` in `heap`: creates it from `T::default()`, or
    /// rebuilds it by replaying its records onto `T::default()`.
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
    /// [`Error::LayoutMismatch`] if the structure was written with operations of another
    /// type; [`Error::Corrupted`] if a record does not decode or the records have a gap or a
    /// repeated sequence number (a record was lost); [`Error::Panicked`] if `apply` panicked
    /// during the replay; [`Error::StructureOpen`], [`Error::DirectoryFull`] or
    /// [`Error::BadName`].
    pub fn open_with(heap: &Heap, name: &str, initial: impl FnOnce() -> T) -> Result<Logged<T>> {
        let kinds = Kinds::of::<T>()?;
        let attached = heap.attach(name)?;
        let found = if attached.existed() {
            Found::scan(heap, &attached, kinds)?
        } else {
            Found::default()
        };
        let (state, leftovers) = found.rebuild(initial, name)?;
        let logged = Logged {
            attached,
            name: name.to_owned(),
            kinds,
            state: StampedLock::new(state),
            compacting: Mutex::new(()),
            poisoned: AtomicBool::new(false),
        };
        // What a crash left of a snapshot half made or of a deletion half done; on a heap
        // opened read-only it stays (and is ignored at every open).
        match logged.delete(&leftovers) {
            Ok(()) | Err(Error::ReadOnly) => Ok(logged),
            Err(err) => Err(err),
        }
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
    pub fn apply(&self, op: T::Op) -> Result<T::Output> {
        self.check_poisoned()?;
        let mut panic = None;
        let mut op = Some(op);
        let result = structure::with_encode_buffer(|bytes| {
            bytes.clear();
            bytes.extend_from_slice(&[0; 8]);
            if let Some(op) = &op {
                op.encode(bytes)?;
            }
            self.attached.heap().run_op(|guard| {
                let mut state = self.state.lock(guard)?;
                let seq = state.next_seq;
                bytes[..8].copy_from_slice(&seq.to_le_bytes());
                // The last step that can fail: after it, the call happens.
                let block = guard.alloc(self.attached.owner(), self.kinds.record, bytes)?;
                // Taken once: from here the closure returns what ends `run_op` (a success or
                // the panic's error), never an error that runs it again.
                let Some(op) = op.take() else {
                    unreachable!("run_op ran a logged call again after it applied it")
                };
                let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    state.value.apply(op)
                }));
                match applied {
                    Ok(output) => {
                        state.next_seq = seq + 1;
                        state.records.push_back((seq, block));
                        Ok(output)
                    }
                    Err(payload) => {
                        // `T` may be half changed: this handle is done. The error rolls the
                        // operation back, record and all, so the log never holds a call
                        // whose replay panics; the panic goes on to the caller below.
                        // ORDERING: pairs with the Acquire load of `check_poisoned`.
                        self.poisoned.store(true, Ordering::Release);
                        panic = Some(payload);
                        Err(Error::Panicked {
                            structure: self.name.clone(),
                        })
                    }
                }
            })
        });
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        result
    }

    /// Runs `f` on the structure, under its lock, and returns what `f` returns. Reads are
    /// not logged.
    ///
    /// # Errors
    ///
    /// [`Error::Panicked`] if an earlier `apply` panicked.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.check_poisoned()?;
        Ok(f(&self.state.lock_outside_op().value))
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
        self.check_poisoned()?;
        let _no_compaction = lock(&self.compacting);
        let live = self.state.lock_outside_op();
        let found = Found::scan(self.attached.heap(), &self.attached, self.kinds)?;
        let (rebuilt, _) = found.rebuild(initial, &self.name)?;
        Ok(rebuilt.next_seq == live.next_seq && rebuilt.value == live.value)
    }

    /// How many records the log holds: the calls since the last snapshot.
    pub fn log_len(&self) -> u64 {
        self.state.lock_outside_op().records.len() as u64
    }

    /// How many calls the structure has had since it was created (the next record's
    /// sequence number).
    pub fn calls(&self) -> u64 {
        self.state.lock_outside_op().next_seq
    }

    /// Takes a snapshot of the structure and deletes the records (and the snapshot) it
    /// replaces (module docs, "Snapshots"); returns `false` if there was nothing to compact
    /// (no call since the last snapshot). Writers wait only while `T` is serialized.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] if `T` takes no snapshots ([`Replay::save`] returns `None`);
    /// what `save` returns; [`Error::OutOfSpace`] if the heap cannot hold the snapshot, which
    /// is then abandoned (its chunks deleted) while the log stays as it was;
    /// [`Error::Panicked`] if an earlier `apply` panicked.
    pub fn compact(&self) -> Result<bool> {
        self.check_poisoned()?;
        let _one = lock(&self.compacting);
        let (bytes, upto) = {
            let state = self.state.lock_outside_op();
            if state.next_seq == state.snapshot_upto {
                return Ok(false);
            }
            let mut bytes = Vec::new();
            match state.value.save(&mut bytes) {
                None => {
                    return Err(Error::Unsupported {
                        what: "snapshots of a structure whose Replay::save returns None",
                    });
                }
                Some(saved) => saved?,
            }
            (bytes, state.next_seq)
        };
        let snapshot = match self.write_snapshot(&bytes, upto) {
            Ok(snapshot) => snapshot,
            Err((written, err)) => {
                // Abandoned: its chunks go, the log stays.
                self.delete(&written)?;
                return Err(err);
            }
        };
        let replaced = {
            let mut state = self.state.lock_outside_op();
            let mut replaced = std::mem::replace(&mut state.snapshot, snapshot);
            while let Some(&(seq, block)) = state.records.front() {
                if seq >= upto {
                    break;
                }
                replaced.push(block);
                state.records.pop_front();
            }
            state.snapshot_upto = upto;
            replaced
        };
        // In operations after the commit's, so in epochs no older than its.
        self.delete(&replaced)?;
        Ok(true)
    }

    /// Writes the snapshot `bytes`, which covers the records before `upto`: its chunks, each
    /// in an operation of its own, then its commit. Returns its blocks, or what it wrote
    /// before the error.
    fn write_snapshot(&self, bytes: &[u8], upto: u64) -> Result<Vec<PBlock>, (Vec<PBlock>, Error)> {
        let heap = self.attached.heap();
        let owner = self.attached.owner();
        let mut written = Vec::new();
        let mut payload = Vec::with_capacity(CHUNK + 16);
        let chunks: Vec<&[u8]> = bytes.chunks(CHUNK).collect();
        for (index, chunk) in chunks.iter().enumerate() {
            payload.clear();
            payload.extend_from_slice(&upto.to_le_bytes());
            payload.extend_from_slice(&(index as u64).to_le_bytes());
            payload.extend_from_slice(chunk);
            match heap.run_op(|op| op.alloc(owner, self.kinds.chunk, &payload)) {
                Ok(block) => written.push(block),
                Err(err) => return Err((written, err)),
            }
        }
        let commit = Commit {
            upto,
            chunks: chunks.len() as u64,
            len: bytes.len() as u64,
            format: match T::snapshot_format() {
                Ok(format) => format,
                Err(err) => return Err((written, err)),
            },
        };
        match heap.run_op(|op| op.alloc(owner, self.kinds.commit, &commit.encode())) {
            Ok(block) => written.push(block),
            Err(err) => return Err((written, err)),
        }
        Ok(written)
    }

    /// Deletes `blocks`, a batch per operation.
    fn delete(&self, blocks: &[PBlock]) -> Result<()> {
        for batch in blocks.chunks(256) {
            self.attached.heap().run_op(|op| {
                for &block in batch {
                    op.delete(block)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The records this structure lost to damage when the heap was opened with
    /// [`HeapConfig::quarantine_damaged`](montage_core::HeapConfig::quarantine_damaged)
    /// (such a loss is a gap, and `open` fails with [`Error::Corrupted`]).
    pub fn quarantined(&self) -> Vec<montage_core::Quarantined> {
        self.attached.quarantined()
    }

    fn check_poisoned(&self) -> Result<()> {
        // ORDERING: pairs with the Release store of `PoisonOnUnwind`.
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Panicked {
                structure: self.name.clone(),
            });
        }
        Ok(())
    }
}

/// A snapshot's commit: the sequence number it covers up to, its chunks and bytes, and the
/// format it was saved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Commit {
    upto: u64,
    chunks: u64,
    len: u64,
    format: u64,
}

impl Commit {
    fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (at, word) in [self.upto, self.chunks, self.len, self.format]
            .into_iter()
            .enumerate()
        {
            out[at * 8..at * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Commit> {
        if bytes.len() != 32 {
            return None;
        }
        let word = |at: usize| structure::word_at(bytes, at * 8);
        Some(Commit {
            upto: structure::seq_prefix(bytes)?,
            chunks: word(1)?,
            len: word(2)?,
            format: word(3)?,
        })
    }
}

/// What a structure's payloads are, as open found them.
#[derive(Default)]
struct Found {
    /// (sequence number, block, operation bytes)
    records: Vec<(u64, PBlock, Vec<u8>)>,
    /// (snapshot's `upto`, index, block, bytes)
    chunks: Vec<(u64, u64, PBlock, Vec<u8>)>,
    commits: Vec<(Commit, PBlock)>,
}

impl Found {
    /// Every live payload of the structure `attached` names, sorted by kind.
    fn scan(heap: &Heap, attached: &Attached, kinds: Kinds) -> Result<Found> {
        let found = Mutex::new(Found::default());
        structure::scan_payloads(
            heap,
            attached.owner(),
            &[kinds.record, kinds.chunk, kinds.commit],
            "montage_collections::Logged record",
            |type_id, block, bytes| {
                let bad = |what| corrupted(block.offset(), what);
                let seq = structure::seq_prefix(bytes)
                    .ok_or_else(|| bad("a log payload has no sequence number"))?;
                let mut found = lock(&found);
                if type_id == kinds.record {
                    found.records.push((seq, block, bytes[8..].to_vec()));
                } else if type_id == kinds.chunk {
                    let index = structure::word_at(bytes, 8)
                        .ok_or_else(|| bad("a snapshot chunk has no index"))?;
                    found.chunks.push((seq, index, block, bytes[16..].to_vec()));
                } else {
                    let commit = Commit::decode(bytes)
                        .ok_or_else(|| bad("a snapshot commit does not decode"))?;
                    found.commits.push((commit, block));
                }
                Ok(())
            },
        )?;
        Ok(found.into_inner().unwrap_or_else(PoisonError::into_inner))
    }

    /// The structure these payloads hold: the newest snapshot (or `initial`) with the
    /// records after it replayed; and the blocks no longer needed (older records, other
    /// snapshots), for deletion.
    fn rebuild<T: Replay>(
        self,
        initial: impl FnOnce() -> T,
        name: &str,
    ) -> Result<(State<T>, Vec<PBlock>)> {
        let Found {
            mut records,
            mut chunks,
            mut commits,
        } = self;
        commits.sort_unstable_by_key(|(commit, _)| commit.upto);
        let newest = commits.last().copied();
        let mut unneeded: Vec<PBlock> = Vec::new();
        let (value, upto, snapshot) = match newest {
            None => (None, 0, Vec::new()),
            Some((commit, block)) => {
                if commit.format != T::snapshot_format()? {
                    return Err(Error::LayoutMismatch {
                        type_name: "montage_collections::Logged snapshot",
                        stored: commit.format,
                        compiled: T::snapshot_format()?,
                    });
                }
                let mut mine: Vec<(u64, PBlock, Vec<u8>)> = Vec::new();
                for (upto, index, chunk_block, bytes) in chunks.drain(..) {
                    if upto == commit.upto {
                        mine.push((index, chunk_block, bytes));
                    } else {
                        unneeded.push(chunk_block);
                    }
                }
                mine.sort_unstable_by_key(|&(index, _, _)| index);
                let complete = mine.len() as u64 == commit.chunks
                    && mine
                        .iter()
                        .zip(0u64..)
                        .all(|(&(index, _, _), want)| index == want);
                let bytes: Vec<u8> = mine
                    .iter()
                    .flat_map(|(_, _, b)| b.iter().copied())
                    .collect();
                if !complete || bytes.len() as u64 != commit.len {
                    return Err(corrupted(
                        block.offset(),
                        "a committed snapshot has lost a chunk",
                    ));
                }
                let value = T::load(&bytes)
                    .ok_or_else(|| corrupted(block.offset(), "a snapshot does not load"))?;
                let mut snapshot: Vec<PBlock> = mine.into_iter().map(|(_, b, _)| b).collect();
                snapshot.push(block);
                unneeded.extend(commits[..commits.len() - 1].iter().map(|&(_, b)| b));
                (Some(value), commit.upto, snapshot)
            }
        };
        unneeded.extend(chunks.into_iter().map(|(_, _, b, _)| b));
        records.sort_unstable_by_key(|&(seq, _, _)| seq);
        let first = records.partition_point(|&(seq, _, _)| seq < upto);
        unneeded.extend(records.drain(..first).map(|(_, b, _)| b));
        for (expected, (seq, block, _)) in (upto..).zip(&records) {
            if *seq != expected {
                return Err(corrupted(
                    block.offset(),
                    if *seq < expected {
                        "two log records have the same sequence number"
                    } else {
                        "the log has a gap: a record it needs was lost"
                    },
                ));
            }
        }
        let next_seq = upto + records.len() as u64;
        let start = value.unwrap_or_else(initial);
        let value = replay(start, &records, name)?;
        let state = State {
            value,
            next_seq,
            records: records.into_iter().map(|(seq, b, _)| (seq, b)).collect(),
            snapshot_upto: upto,
            snapshot,
        };
        Ok((state, unneeded))
    }
}

/// Applies `records` (sequence number, block, operation bytes), in order, to `value`.
fn replay<T: Replay>(mut value: T, records: &[(u64, PBlock, Vec<u8>)], name: &str) -> Result<T> {
    let replayed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<T> {
        for (_, block, bytes) in records {
            let op = T::Op::decode(bytes).ok_or_else(|| {
                corrupted(
                    block.offset(),
                    "a log record does not decode as an operation",
                )
            })?;
            value.apply(op);
        }
        Ok(value)
    }));
    replayed.unwrap_or_else(|_| {
        Err(Error::Panicked {
            structure: name.to_owned(),
        })
    })
}
