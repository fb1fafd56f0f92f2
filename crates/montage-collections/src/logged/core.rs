//! What [`Logged`](super::Logged) and [`LoggedShards`](super::LoggedShards) share: a
//! structure's shards (each a `T` with its own sequence, log and snapshot), the calls, the
//! compaction, the background snapshots and the shutdown.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use crossbeam_utils::CachePadded;
use montage_core::limits;
use montage_core::stamped::StampedWriteGuard;
use montage_core::{Attached, Codec, Error, Heap, InPlace, OpGuard, PBlock, Result, StampedRwLock};

use super::found::{Commit, Dead, Found, Rebuilt};
use super::{Replay, SnapshotPolicy};
use crate::structure::{self, lock};

/// The most shards a [`LoggedShards`](super::LoggedShards) has.
pub(super) const MAX_SHARDS: usize = 64;

/// Bytes of a snapshot per chunk payload, each written in an operation of its own.
const CHUNK: usize = 64 << 10;

/// Block sizes of log pages, header included: the first page of an epoch is as large as
/// the page before it if that one filled half its room, else the smallest, and each page
/// that fills is followed by one twice its size.
const PAGE_BLOCKS: [u64; 7] = [256, 512, 1024, 2048, 4096, 8192, 16384];

/// What a block's header and trailer take of its size.
const BLOCK_OVERHEAD: u64 = limits::HEADER_LEN + limits::TRAILER_LEN;

/// The payload of a log page in a block of `size` bytes: whole words.
const fn page_payload(size: u64) -> u64 {
    (size - BLOCK_OVERHEAD) / 8 * 8
}

/// The largest page's payload, and the zeros a new page is written with.
const MAX_PAGE: u64 = page_payload(PAGE_BLOCKS[PAGE_BLOCKS.len() - 1]);
static ZEROS: [u8; MAX_PAGE as usize] = [0; MAX_PAGE as usize];

/// Bytes a record takes in a page before the operation's encoding: its header word and its
/// sequence number.
pub(super) const PAGE_RECORD_PREFIX: u64 = 16;

/// The high half of a page record's header word (the low half is the encoding's length):
/// a page's records end at the first word that is zero.
const PAGE_RECORD_TAG: u64 = 0x4C4F_4752 << 32;

/// The header word of a page record whose encoding is `len` bytes (less than a page).
pub(super) fn record_header(len: u64) -> u64 {
    PAGE_RECORD_TAG | len
}

/// The encoding's length a page record's header word gives, or `None` if the word does
/// not carry the tag (damage).
pub(super) fn record_len(header: u64) -> Option<u64> {
    let low = u64::from(u32::MAX);
    (header & !low == PAGE_RECORD_TAG).then_some(header & low)
}

/// Where one record of a shard's log is: the block (a record payload of its own, or a log
/// page holding many), where the operation's encoding starts in its payload, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) block: PBlock,
    pub(super) at: u64,
    pub(super) len: u64,
}

impl Entry {
    /// The log bytes the record counts for in the snapshot policy.
    pub(super) fn bytes(&self) -> u64 {
        self.len + PAGE_RECORD_PREFIX
    }
}

/// The page a shard's calls of one epoch append their records to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Page {
    target: InPlace,
    /// Bytes of its payload the records take (a multiple of 8).
    tail: u64,
}

/// One shard's DRAM side, its fields in this order (`repr(C)`): those every call uses first,
/// those only a snapshot uses last. `value` comes first of all: std's `RwLock` keeps its
/// lock word in the 16 bytes before the value it guards, and the shard starts a cache line
/// ([`Shard`]), so a read finds the lock word and the value's first bytes (a `BTreeMap`'s
/// root) on one line, as in a plain `RwLock<T>`. With two threads, that took
/// `LoggedShards` of `BTreeMap`s from about 0.65x to 0.72x of locked maps at 90% reads
/// (medians of four rounds, `docs/PERFORMANCE.md`), and a call touches three lines of its
/// shard instead of four.
#[repr(C)]
pub(super) struct State<T> {
    pub(super) value: T,
    /// The sequence number the next record gets.
    pub(super) next_seq: u64,
    /// The payload bytes of `records`.
    pub(super) log_bytes: u64,
    /// The page of the current epoch, if a call of it started one.
    page: Option<Page>,
    /// The log bytes at which the policy asks for a snapshot (`u64::MAX`: never).
    trigger_at: u64,
    /// A background snapshot was asked for and has not ended.
    requested: bool,
    /// The records after the snapshot, in sequence order. A page's records are next to one
    /// another: a record written outside the page ends it.
    pub(super) records: VecDeque<Entry>,
    /// The sequence number the current snapshot covers up to (0: none).
    pub(super) snapshot_upto: u64,
    /// The current snapshot's chunks and commit.
    pub(super) snapshot: Vec<PBlock>,
    /// The bytes of the current snapshot's encoding.
    pub(super) snapshot_bytes: u64,
}

impl<T> State<T> {
    /// A shard's state as opening found it (no snapshot asked for yet).
    pub(super) fn new(
        value: T,
        next_seq: u64,
        records: VecDeque<Entry>,
        snapshot_upto: u64,
        snapshot: Vec<PBlock>,
        snapshot_bytes: u64,
    ) -> State<T> {
        let log_bytes = records.iter().map(Entry::bytes).sum();
        State {
            value,
            next_seq,
            records,
            page: None,
            log_bytes,
            snapshot_upto,
            snapshot,
            snapshot_bytes,
            trigger_at: u64::MAX,
            requested: false,
        }
    }

    /// Takes the records before `upto`, which a snapshot now covers (`bytes` of log
    /// between them), off the front of the log; returns them, oldest first, and whether the
    /// last one's block still holds a later record. The current page goes with its last
    /// record: the calls after it start a new one. Copies only the records after `upto`.
    fn take_covered(&mut self, upto: u64, bytes: u64) -> (VecDeque<Entry>, bool) {
        let count = self.records.partition_point(|entry| entry.seq < upto);
        let rest = self.records.split_off(count);
        let covered = std::mem::replace(&mut self.records, rest);
        debug_assert_eq!(covered.iter().map(Entry::bytes).sum::<u64>(), bytes);
        self.log_bytes -= bytes;
        let last = covered.back().map(|entry| entry.block);
        let last_kept = last.is_some() && self.records.front().map(|entry| entry.block) == last;
        if !last_kept && last.is_some() && self.page.map(|page| page.target.block()) == last {
            self.page = None;
        }
        (covered, last_kept)
    }
}

/// The type ids of one shard's payloads. Records and pages carry the operation's codec id,
/// so a log written by other operations is [`Error::LayoutMismatch`]; chunks and commits do
/// not, so that a new version of the code opens a structure whose log is empty (closed
/// cleanly) from its snapshot alone. All four carry the shard count and index.
#[derive(Clone, Copy)]
pub(super) struct Kinds {
    pub(super) record: u64,
    pub(super) page: u64,
    pub(super) chunk: u64,
    pub(super) commit: u64,
}

impl Kinds {
    pub(super) fn of<T: Replay>(shards: usize) -> Result<Vec<Kinds>> {
        let op = T::Op::codec_id()?;
        let n = shards as u64;
        Ok((0..n)
            .map(|i| Kinds {
                record: structure::type_id_of("logged-record", &[op, n, i]),
                page: structure::type_id_of("logged-page", &[op, n, i]),
                chunk: structure::type_id_of("logged-chunk", &[n, i]),
                commit: structure::type_id_of("logged-commit", &[n, i]),
            })
            .collect())
    }
}

/// One `T` with its log and snapshot; `state` first, at the start of its cache line.
#[repr(C)]
struct Shard<T> {
    /// Calls take it for writing, reads and serializations for reading.
    state: StampedRwLock<State<T>>,
    kinds: Kinds,
    /// Held by a compaction from its serialization to its deletions: one at a time.
    compacting: Mutex<()>,
}

/// A call's record, written, with its shard locked until the call is applied.
pub(super) struct Record<'a, T> {
    state: StampedWriteGuard<'a, State<T>>,
    entry: Entry,
    /// For a record in the shard's page (`State::page`, which holds it already): where the
    /// record's header word is, zeroed again if the call panics.
    in_page: Option<u64>,
}

/// Writes a record's bytes for `op` into `bytes`: a word for a page record's header and
/// one for the sequence number (`write_record` fills them in), then the operation's
/// encoding.
#[inline]
pub(super) fn encode_record<O: Codec>(op: &O, bytes: &mut Vec<u8>) -> Result<()> {
    bytes.clear();
    bytes.extend_from_slice(&[0; PAGE_RECORD_PREFIX as usize]);
    op.encode(bytes)
}

/// The most a shard's first snapshot sets aside before it starts, as a guess from its log's
/// bytes: an insert's record is about as long as the entry it makes, but a log of updates
/// to a few entries may be far longer than their snapshot.
const FIRST_SNAPSHOT_GUESS: u64 = 256 << 20;

/// The blocks of `covered` (records a snapshot covers, oldest first) that hold no other
/// record, each once: a page goes with its last record. Without the last record's block if
/// `last_kept` (the page still holds later records). A page's records are next to each
/// other in the log.
fn finished_blocks(covered: &VecDeque<Entry>, last_kept: bool) -> Vec<PBlock> {
    let mut blocks: Vec<PBlock> = Vec::new();
    for entry in covered {
        if blocks.last() != Some(&entry.block) {
            blocks.push(entry.block);
        }
    }
    if last_kept {
        blocks.pop();
    }
    blocks
}

/// Stores to every page of `spare`, so that its page faults are taken now. (Not
/// `vec![0; n]` or a `fill(0)` after the allocation: the compiler makes those a `calloc`,
/// whose pages no store has touched yet.)
fn touch_pages(spare: &mut [std::mem::MaybeUninit<u8>]) {
    for byte in spare.iter_mut().step_by(4096) {
        byte.write(0);
    }
    std::hint::black_box(spare);
}

/// The thread that takes the snapshots the policy asks for.
struct Worker {
    /// The index of a shard to compact.
    wake: mpsc::Sender<usize>,
    thread: JoinHandle<()>,
}

/// A logged structure: its shards and what they share.
pub(super) struct Core<T: Replay> {
    attached: Attached,
    name: String,
    /// Each on cache lines of its own: calls on one shard lock and change it while calls
    /// on the others read theirs.
    shards: Box<[CachePadded<Shard<T>>]>,
    /// Set when `apply` panicked: a `T` may be half changed, and only reopening rebuilds it.
    poisoned: AtomicBool,
    policy: Mutex<SnapshotPolicy>,
    /// Started at the first snapshot the policy asks for.
    worker: Mutex<Option<Worker>>,
    /// What the last background snapshot that failed failed with.
    background_error: Mutex<Option<Error>>,
}

impl<T: Replay> Core<T> {
    /// Attaches `name` and rebuilds its `shards` shards: `rebuild` turns what the heap holds
    /// for each shard (nothing for a new structure) into its state and the blocks to
    /// delete. Then deletes those blocks: what a crash left of a snapshot half made or of a
    /// deletion half done (on a heap opened read-only they stay, and every open ignores
    /// them).
    pub(super) fn open(
        heap: &Heap,
        name: &str,
        shards: usize,
        rebuild: impl FnOnce(Vec<Found>) -> Result<Vec<Rebuilt<T>>>,
    ) -> Result<Arc<Core<T>>> {
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(Error::InvalidConfig {
                what: "a logged structure has 1 to 64 shards",
            });
        }
        let kinds = Kinds::of::<T>(shards)?;
        let attached = heap.attach(name)?;
        let found = if attached.existed() {
            Found::scan(heap, &attached, &kinds)?
        } else {
            (0..shards).map(|_| Found::default()).collect()
        };
        let shards_rebuilt = rebuild(found)?;
        let mut leftovers = Dead::default();
        let shards = kinds
            .into_iter()
            .zip(shards_rebuilt)
            .map(|(kinds, (state, dead))| {
                leftovers.append(dead);
                CachePadded::new(Shard {
                    kinds,
                    state: StampedRwLock::new(state),
                    compacting: Mutex::new(()),
                })
            })
            .collect();
        let core = Core {
            attached,
            name: name.to_owned(),
            shards,
            poisoned: AtomicBool::new(false),
            policy: Mutex::new(SnapshotPolicy::default()),
            worker: Mutex::new(None),
            background_error: Mutex::new(None),
        };
        core.rearm_all();
        match core.remove(&leftovers) {
            Ok(()) | Err(Error::ReadOnly) => Ok(Arc::new(core)),
            Err(err) => Err(err),
        }
    }

    pub(super) fn shards(&self) -> usize {
        self.shards.len()
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn attached(&self) -> &Attached {
        &self.attached
    }

    fn failed_in_background(&self, err: Error) {
        *lock(&self.background_error) = Some(err);
    }

    pub(super) fn take_snapshot_error(&self) -> Option<Error> {
        lock(&self.background_error).take()
    }

    pub(super) fn set_policy(&self, policy: SnapshotPolicy) {
        *lock(&self.policy) = policy;
        self.rearm_all();
    }

    fn rearm_all(&self) {
        for index in 0..self.shards.len() {
            self.rearm(index, false);
        }
    }

    /// Sets shard `index`'s trigger from the policy, its snapshot and its log, and marks
    /// no snapshot asked for. After a failed snapshot the trigger is twice the log as it is
    /// (a full heap is not retried at every call).
    fn rearm(&self, index: usize, failed: bool) {
        let policy = *lock(&self.policy);
        let mut state = self.shards[index].state.write_outside_op();
        let mut at = policy.threshold(state.snapshot_bytes);
        if failed {
            at = at.max(state.log_bytes.saturating_mul(2));
        }
        state.trigger_at = at;
        state.requested = false;
    }

    /// Runs `f` on shard `index`'s value under its read lock.
    pub(super) fn read<R>(&self, index: usize, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.check_poisoned()?;
        Ok(f(&self.shards[index].state.read_outside_op().value))
    }

    /// `(records in the log, calls since creation)` of shard `index`.
    pub(super) fn counts(&self, index: usize) -> (u64, u64) {
        let state = self.shards[index].state.read_outside_op();
        (state.records.len() as u64, state.next_seq)
    }

    /// Whether replay rebuilds each shard's live value (`Logged::verify_replay`).
    pub(super) fn verify(
        &self,
        rebuild: impl FnOnce(Vec<Found>) -> Result<Vec<Rebuilt<T>>>,
        same: impl Fn(&T, &T) -> bool,
    ) -> Result<bool> {
        self.check_poisoned()?;
        // No compaction and no call while the whole log is read.
        let _no_compaction: Vec<_> = self.shards.iter().map(|s| lock(&s.compacting)).collect();
        let live: Vec<_> = self
            .shards
            .iter()
            .map(|s| s.state.read_outside_op())
            .collect();
        let kinds: Vec<Kinds> = self.shards.iter().map(|s| s.kinds).collect();
        let found = Found::scan(self.attached.heap(), &self.attached, &kinds)?;
        let shards_rebuilt = rebuild(found)?;
        Ok(shards_rebuilt
            .iter()
            .zip(&live)
            .all(|((rebuilt, _), live)| {
                rebuilt.next_seq == live.next_seq && same(&rebuilt.value, &live.value)
            }))
    }

    /// Compacts shard `index` (`Logged::compact`), then sets its trigger again.
    pub(super) fn compact(&self, index: usize) -> Result<bool> {
        let result = self.compact_once(index);
        self.rearm(index, result.is_err());
        result
    }

    fn compact_once(&self, index: usize) -> Result<bool> {
        self.check_poisoned()?;
        let shard = &self.shards[index];
        let _one = lock(&shard.compacting);
        // About the size of the last snapshot (before the first, of the log, up to
        // FIRST_SNAPSHOT_GUESS), so that the buffer is not copied as it grows; and every page
        // of it touched before the lock, not under it: a fresh buffer's first store to each
        // page costs more than the serialization itself (a 262 MB snapshot of 1M entries
        // stalled calls 250 ms with its faults under the lock).
        let expected = {
            let state = shard.state.read_outside_op();
            // Nothing to compact; calls only add to the log, and compactions take turns.
            if state.next_seq == state.snapshot_upto {
                return Ok(false);
            }
            let guess = if state.snapshot_bytes == 0 {
                state.log_bytes.min(FIRST_SNAPSHOT_GUESS)
            } else {
                state.snapshot_bytes + state.snapshot_bytes / 8
            };
            usize::try_from(guess).unwrap_or(0)
        };
        let mut bytes = Vec::with_capacity(expected);
        touch_pages(bytes.spare_capacity_mut());
        let (bytes, upto, covered_bytes) = {
            // Read-locked: calls wait for this one serialization, reads go on.
            let state = shard.state.read_outside_op();
            match state.value.save(&mut bytes) {
                None => {
                    return Err(Error::Unsupported {
                        what: "snapshots of a structure whose Replay::save returns None",
                    });
                }
                Some(saved) => saved?,
            }
            // Every record in the log now comes before `upto`.
            (bytes, state.next_seq, state.log_bytes)
        };
        let snapshot = match self.write_snapshot(shard.kinds, &bytes, upto) {
            Ok(snapshot) => snapshot,
            Err((written, err)) => {
                // Abandoned: its chunks go, the log stays.
                self.delete(&written, false)?;
                return Err(err);
            }
        };
        let (snapshots, covered, last_kept) = {
            let mut state = shard.state.write_outside_op();
            let snapshots = std::mem::replace(&mut state.snapshot, snapshot);
            let (covered, last_kept) = state.take_covered(upto, covered_bytes);
            state.snapshot_upto = upto;
            state.snapshot_bytes = bytes.len() as u64;
            (snapshots, covered, last_kept)
        };
        // Outside the lock: a snapshot may cover millions of records.
        let replaced = Dead {
            records: finished_blocks(&covered, last_kept),
            snapshots,
        };
        // In operations after the commit's, so in epochs no older than its.
        self.remove(&replaced)?;
        Ok(true)
    }

    /// Writes the snapshot `bytes`, which covers the records before `upto`: its chunks, each
    /// in an operation of its own, then its commit. Returns its blocks, or what it wrote
    /// before the error.
    fn write_snapshot(
        &self,
        kinds: Kinds,
        bytes: &[u8],
        upto: u64,
    ) -> Result<Vec<PBlock>, (Vec<PBlock>, Error)> {
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
            match heap.run_op(|op| op.alloc(owner, kinds.chunk, &payload)) {
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
        match heap.run_op(|op| op.alloc(owner, kinds.commit, &commit.encode())) {
            Ok(block) => written.push(block),
            Err(err) => return Err((written, err)),
        }
        Ok(written)
    }

    /// Deletes what a shard no longer needs: the snapshots with anti-blocks, the records
    /// without (`Dead`).
    fn remove(&self, dead: &Dead) -> Result<()> {
        self.delete(&dead.snapshots, false)?;
        self.delete(&dead.records, true)
    }

    /// Deletes `blocks`, a batch per operation; with `discard`, without anti-blocks
    /// (`OpGuard::discard`: a crash before their reclamation may bring them back).
    fn delete(&self, blocks: &[PBlock], discard: bool) -> Result<()> {
        for batch in blocks.chunks(256) {
            self.attached.heap().run_op(|op| {
                for &block in batch {
                    if discard {
                        op.discard(block)?;
                    } else {
                        op.delete(block)?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Stops the worker (after the snapshot it is taking), then compacts every shard whose
    /// log is not empty, so that the next open, by this code or a newer version, starts
    /// from snapshots alone. A `T` without snapshots keeps its log.
    pub(super) fn close(&self) -> Result<()> {
        let worker = lock(&self.worker).take();
        if let Some(Worker { wake, thread }) = worker {
            drop(wake);
            // A panic in the worker is a panic of `save`, which `compact` reports below.
            let _ = thread.join();
        }
        self.check_poisoned()?;
        for index in 0..self.shards.len() {
            match self.compact(index) {
                Ok(_) | Err(Error::Unsupported { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        // What a background snapshot failed with is stale now: this one succeeded.
        self.take_snapshot_error();
        Ok(())
    }

    /// Fails every later call: a `T` may be half changed, and only reopening rebuilds it.
    pub(super) fn poison(&self) {
        // ORDERING: pairs with the Acquire load of `check_poisoned`.
        self.poisoned.store(true, Ordering::Release);
    }

    pub(super) fn check_poisoned(&self) -> Result<()> {
        // ORDERING: pairs with the Release store in `poison`.
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Panicked {
                structure: self.name.clone(),
            });
        }
        Ok(())
    }
}

/// The calls, which may start the worker: it holds the structure, so `T` crosses threads.
impl<T: Replay + Send + Sync + 'static> Core<T> {
    /// Logs `op` on shard `index` and applies it there, in one heap operation (module docs
    /// of `logged`); asks the worker for a snapshot when the policy says so.
    pub(super) fn apply(this: &Arc<Core<T>>, index: usize, op: T::Op) -> Result<T::Output> {
        this.check_poisoned()?;
        let mut panic = None;
        let result = structure::with_encode_buffer(|bytes| {
            encode_record(&op, bytes)?;
            let mut op = Some(op);
            this.attached.heap().run_op(|guard| {
                let state = this.lock_shard(index, guard)?;
                let mut record = this.write_record(state, index, guard, bytes, true)?;
                // Taken once: from here the closure returns what ends `run_op` (a success or
                // the panic's error), never an error that runs it again.
                let Some(op) = op.take() else {
                    unreachable!("run_op ran a logged call again after it applied it")
                };
                match this.apply_record(&mut record, op) {
                    Ok(done) => Ok(done),
                    Err(payload) => {
                        // The error rolls the operation back, record and all, so the log
                        // never holds a call whose replay panics (a record in a page is
                        // unmade by its header word, since bytes written in place stay);
                        // the panic goes on to the caller below.
                        if let Some(at) = record.in_page
                            && let Some(page) = record.state.page.as_mut()
                        {
                            // A failure here is the heap's own (it is poisoned), and every
                            // later write reports it.
                            let _ = guard.write_in_place(&mut page.target, at, &[0; 8]);
                        }
                        panic = Some(payload);
                        Err(Error::Panicked {
                            structure: this.name.clone(),
                        })
                    }
                }
            })
        });
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        let (output, ask) = result?;
        if ask {
            Core::ask_for_snapshot(this, index);
        }
        Ok(output)
    }

    /// Locks shard `index` for writing by operation `guard`: the first step of a call.
    #[inline]
    pub(super) fn lock_shard<'a>(
        &'a self,
        index: usize,
        guard: &OpGuard<'_>,
    ) -> Result<StampedWriteGuard<'a, State<T>>> {
        self.shards[index].state.write(guard)
    }

    /// In operation `guard`, with shard `index` locked (`state`): writes the record whose
    /// bytes (`encode_record`) are `bytes`, with the shard's next sequence number: appended
    /// to the shard's page of this epoch if `in_page` (a page is started if there is none,
    /// or it is full), as a payload of its own otherwise, or if it is too long for a page.
    /// The last step of a call that can fail.
    #[inline]
    pub(super) fn write_record<'a>(
        &'a self,
        mut state: StampedWriteGuard<'a, State<T>>,
        index: usize,
        guard: &OpGuard<'_>,
        bytes: &mut [u8],
        in_page: bool,
    ) -> Result<Record<'a, T>> {
        let seq = state.next_seq;
        let prefix = PAGE_RECORD_PREFIX as usize;
        bytes[8..prefix].copy_from_slice(&seq.to_le_bytes());
        let len = (bytes.len() - prefix) as u64;
        // Whole words: the next record's header word is aligned.
        let room = (bytes.len() as u64).next_multiple_of(8);
        let kinds = self.shards[index].kinds;
        if in_page && room <= MAX_PAGE {
            let mut page = match state.page {
                Some(page)
                    if page.target.epoch() == guard.epoch()
                        && page.tail + room <= page.target.len() =>
                {
                    page
                }
                current => self.new_page(current, guard, kinds.page, room)?,
            };
            let at = page.tail;
            // The length fits the header's low half: the record fits a page.
            bytes[..8].copy_from_slice(&record_header(len).to_le_bytes());
            guard.write_in_place(&mut page.target, at, bytes)?;
            page.tail += room;
            let entry = Entry {
                seq,
                block: page.target.block(),
                at: at + PAGE_RECORD_PREFIX,
                len,
            };
            // Now, rather than once the call is applied: the only call that is not applied
            // after this is one whose `apply` panics, which poisons the structure, and no
            // call, compaction or close uses a poisoned structure's state again.
            state.page = Some(page);
            return Ok(Record {
                state,
                entry,
                in_page: Some(at),
            });
        }
        let block = guard.alloc(self.attached.owner(), kinds.record, &bytes[8..])?;
        let entry = Entry {
            seq,
            block,
            at: 8,
            len,
        };
        Ok(Record {
            state,
            entry,
            in_page: None,
        })
    }

    /// Starts a page for a record of `room` bytes in `guard`'s epoch, after `current` (the
    /// shard's page, of an older epoch or full): twice as large as `current` if it is of
    /// this epoch, as large as the last page if that one filled half its room, else the
    /// smallest; always large enough for the record.
    fn new_page(
        &self,
        current: Option<Page>,
        guard: &OpGuard<'_>,
        kind: u64,
        room: u64,
    ) -> Result<Page> {
        let want = match current {
            Some(page) if page.target.epoch() == guard.epoch() => page.target.len() * 2,
            Some(page) if page.tail * 2 >= page.target.len() => page.target.len(),
            _ => page_payload(PAGE_BLOCKS[0]),
        };
        let len = PAGE_BLOCKS
            .iter()
            .map(|&size| page_payload(size))
            .find(|&len| len >= want.max(room))
            .unwrap_or(MAX_PAGE);
        let block = guard.alloc(self.attached.owner(), kind, &ZEROS[..len as usize])?;
        Ok(Page {
            target: guard.in_place(block)?,
            tail: 0,
        })
    }

    /// Applies `op`, whose record `record` wrote, to the shard; returns its output and
    /// whether the policy asks for a snapshot now. If `apply` panics, poisons the structure
    /// (`T` may be half changed) and returns the panic.
    #[inline]
    pub(super) fn apply_record(
        &self,
        record: &mut Record<'_, T>,
        op: T::Op,
    ) -> std::thread::Result<(T::Output, bool)> {
        // One stamping access for the whole update.
        let state: &mut State<T> = &mut record.state;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.value.apply(op))) {
            Ok(output) => {
                let entry = record.entry;
                state.next_seq = entry.seq + 1;
                state.records.push_back(entry);
                state.log_bytes += entry.bytes();
                // A record outside the page ends it, so that a page's records stay together.
                if record.in_page.is_none() {
                    state.page = None;
                }
                let ask = !state.requested && state.log_bytes >= state.trigger_at;
                if ask {
                    state.requested = true;
                }
                Ok((output, ask))
            }
            Err(payload) => {
                self.poison();
                Err(payload)
            }
        }
    }

    /// Hands shard `index` to the worker, starting it first if needed.
    pub(super) fn ask_for_snapshot(this: &Arc<Core<T>>, index: usize) {
        let mut worker = lock(&this.worker);
        if worker.is_none() {
            let (wake, asked) = mpsc::channel::<usize>();
            // Weak: the worker must not keep the structure alive; the handle's drop stops it.
            let core = Arc::downgrade(this);
            let spawned = std::thread::Builder::new()
                .name("montage-snapshots".to_owned())
                .spawn(move || {
                    for index in asked {
                        let Some(core) = core.upgrade() else { break };
                        core.background_compact(index);
                    }
                });
            match spawned {
                Ok(thread) => *worker = Some(Worker { wake, thread }),
                Err(err) => {
                    drop(worker);
                    this.failed_in_background(Error::Io {
                        op: "spawn the snapshot worker",
                        path: "<thread>".into(),
                        source: err,
                    });
                    this.rearm(index, true);
                    return;
                }
            }
        }
        if let Some(worker) = worker.as_ref() {
            // The worker ends only when this sender is dropped (at shutdown), so it hears.
            let _ = worker.wake.send(index);
        }
    }

    /// A snapshot the policy asked for; what it fails with is kept for
    /// `take_snapshot_error`.
    fn background_compact(&self, index: usize) {
        match self.compact(index) {
            Ok(_) => {}
            Err(Error::Unsupported { .. }) => {
                // No snapshots for this `T`: never ask again.
                *lock(&self.policy) = SnapshotPolicy::manual();
                self.rearm_all();
            }
            Err(err) => self.failed_in_background(err),
        }
    }
}

/// Records `seqs` of 8 bytes each in a page at `block`, for tests.
#[cfg(test)]
pub(super) fn page_entries(block: u64, seqs: std::ops::Range<u64>) -> impl Iterator<Item = Entry> {
    seqs.map(move |seq| Entry {
        seq,
        block: PBlock::from_offset(block),
        at: PAGE_RECORD_PREFIX,
        len: 8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot's compaction takes the records it covers off the log and frees each
    /// block of them once, but not a page that still holds a later record.
    #[test]
    fn compaction_frees_the_blocks_whose_records_the_snapshot_covers_all() {
        let records: VecDeque<Entry> = page_entries(0x1000, 0..3)
            .chain(page_entries(0x2000, 3..4))
            .chain(page_entries(0x3000, 4..7))
            .collect();
        let mut state = State::new((), 7, records, 0, Vec::new(), 0);
        let total = state.log_bytes;
        // Covers the first five: the page at 0x3000 keeps calls 5 and 6.
        let (covered, last_kept) = state.take_covered(5, 5 * (8 + PAGE_RECORD_PREFIX));
        assert_eq!(covered.len(), 5);
        assert!(last_kept);
        let offsets = |blocks: Vec<PBlock>| -> Vec<u64> {
            blocks.iter().map(|block| block.offset()).collect()
        };
        assert_eq!(
            offsets(finished_blocks(&covered, last_kept)),
            [0x1000, 0x2000]
        );
        let left: Vec<u64> = state.records.iter().map(|entry| entry.seq).collect();
        assert_eq!(left, [5, 6]);
        assert_eq!(state.log_bytes, total - 5 * (8 + PAGE_RECORD_PREFIX));
        // Then the rest: the page goes with its last record.
        let (covered, last_kept) = state.take_covered(7, 2 * (8 + PAGE_RECORD_PREFIX));
        assert!(!last_kept);
        assert_eq!(offsets(finished_blocks(&covered, last_kept)), [0x3000]);
        assert!(state.records.is_empty());
        assert_eq!(state.log_bytes, 0);
    }
}
