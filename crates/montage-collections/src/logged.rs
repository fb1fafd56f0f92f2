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
//! heap operation that writes its record).
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
//! This first form keeps every record: the log grows with the calls, and opening replays
//! them all. Snapshots, which bound both, are the next step.

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
///     fn apply(&mut self, &(account, amount): &(u64, i64)) -> i64 {
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
    fn apply(&mut self, op: &Self::Op) -> Self::Output;
}

/// The DRAM side.
struct State<T> {
    value: T,
    /// The sequence number the next record gets.
    next_seq: u64,
}

/// A structure `T` in DRAM whose changes are logged to the heap and replayed when it is
/// opened again (module docs).
pub struct Logged<T: Replay> {
    attached: Attached,
    name: String,
    type_id: u64,
    state: StampedLock<State<T>>,
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

/// The largest sequence number a record may have (2^62): a larger one is damage.
const SEQ_LIMIT: u64 = 1 << 62;

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
        let type_id = record_type_id::<T>()?;
        let attached = heap.attach(name)?;
        let mut records = Vec::new();
        if attached.existed() {
            let found = Mutex::new(Vec::new());
            structure::scan_payloads(
                heap,
                attached.owner(),
                &[type_id],
                "montage_collections::Logged record",
                |_, block, bytes| {
                    let seq = bytes
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes)
                        .filter(|&seq| seq <= SEQ_LIMIT)
                        .ok_or_else(|| {
                            corrupted(block.offset(), "a log record has no sequence number")
                        })?;
                    lock(&found).push((seq, block, bytes[8..].to_vec()));
                    Ok(())
                },
            )?;
            records = found.into_inner().unwrap_or_else(PoisonError::into_inner);
        }
        let (value, next_seq) = replay(initial(), records, name)?;
        Ok(Logged {
            attached,
            name: name.to_owned(),
            type_id,
            state: StampedLock::new(State { value, next_seq }),
            poisoned: AtomicBool::new(false),
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
    #[allow(clippy::needless_pass_by_value)] // the operation is the caller's to give up
    pub fn apply(&self, op: T::Op) -> Result<T::Output> {
        self.check_poisoned()?;
        let mut panic = None;
        let result = structure::with_encode_buffer(|bytes| {
            bytes.clear();
            bytes.extend_from_slice(&[0; 8]);
            op.encode(bytes)?;
            self.attached.heap().run_op(|guard| {
                let mut state = self.state.lock(guard)?;
                let seq = state.next_seq;
                bytes[..8].copy_from_slice(&seq.to_le_bytes());
                // The last step that can fail: after it, the call happens.
                guard.alloc(self.attached.owner(), self.type_id, bytes)?;
                let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    state.value.apply(&op)
                }));
                match applied {
                    Ok(output) => {
                        state.next_seq = seq + 1;
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

    /// How many records the log holds: the calls since the structure was created.
    pub fn log_len(&self) -> u64 {
        self.state.lock_outside_op().next_seq
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

/// The type id of the records of a `T`: the operations' codec.
fn record_type_id<T: Replay>() -> Result<u64> {
    Ok(structure::type_id_of(
        "logged-record",
        &[T::Op::codec_id()?],
    ))
}

/// Applies the recovered `records` (sequence number, block, operation bytes) to `value` in
/// sequence order; returns it and the next sequence number.
fn replay<T: Replay>(
    mut value: T,
    mut records: Vec<(u64, PBlock, Vec<u8>)>,
    name: &str,
) -> Result<(T, u64)> {
    records.sort_unstable_by_key(|&(seq, _, _)| seq);
    for (expected, (seq, block, _)) in (0u64..).zip(&records) {
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
    let next_seq = records.len() as u64;
    let replayed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<T> {
        for (_, block, bytes) in &records {
            let op = T::Op::decode(bytes).ok_or_else(|| {
                corrupted(
                    block.offset(),
                    "a log record does not decode as an operation",
                )
            })?;
            value.apply(&op);
        }
        Ok(value)
    }));
    match replayed {
        Ok(value) => Ok((value?, next_seq)),
        Err(_) => Err(Error::Panicked {
            structure: name.to_owned(),
        }),
    }
}
