//! The epoch clock: operations announce the epoch they run in, a background advancer (or a
//! `sync` caller) moves the clock, writes back what each epoch wrote, reclaims what the
//! protocol allows, and persists the epoch word. This is what makes the heap buffered
//! durably linearizable (DESIGN.md section 5).
//!
//! # The advance `e -> e + 1`
//!
//! Advances are serialized (one at a time, by the background thread or by `sync` callers,
//! which share them: group commit). With the clock at `e`:
//!
//! 1. wait until no operation that began in `e - 1` is still running (INV-EP-1);
//! 2. flush every range that operations of `e - 1` wrote (one batched pass);
//! 3. reclaim (`reclaim.rs`): invalidate what operations of earlier epochs superseded,
//!    deleted or killed, and anti-blocks, as far as INV-EP-3 and INV-EP-5 allow;
//! 4. seal (`Media::seal_epoch`): fence, store `e + 1` into the epoch word, flush, fence
//!    (INV-EP-2); on the journal backend, one record holding all of the above and the
//!    word, written but not yet committed (`sync` commits);
//! 5. publish `e + 1` to new operations.
//!
//! So when the durable word reads `w` (on the journal: the word of the last committed
//! record), every block written in epochs `<= w - 2` is durable, and recovery keeps exactly the blocks of epochs `<= w - 2` (newest version per uid, anti-blocks
//! meaning deleted).
//!
//! The background advancer skips an advance that would have nothing to write back or
//! reclaim, so an idle heap stops writing; `sync` returns at once when no ended operation has
//! writes waiting, because they are then durable and covered by the stored word already.
//!
//! # Reclamation rules (INV-EP-3; on the journal also INV-EP-5, see `reclaim.rs`)
//!
//! * A version superseded (copy-on-write) or deleted in epoch `r` stays valid on the media
//!   until the advance to `r + 3`. By then its replacement or anti-block, written in `r`, is
//!   durable (the word reached `r + 2` one advance earlier), so recovery can no longer choose
//!   the old version; and no operation of an epoch `<= r + 1`, which might still hold its
//!   handle from before the replacement, is running (step 1 of that advance).
//! * An anti-block written in `r` stays until the advance to `r + 4`: the version it shadows
//!   was durably invalidated by the advance to `r + 3`, so dropping the anti-block can no
//!   longer resurrect it.
//! * A block killed in `r` (allocated by an operation that aborted, or deleted in the epoch
//!   that created it) has its meta word zeroed in `r`; that store is written back with the
//!   rest of epoch `r`, and the block is reused from the advance to `r + 3`, like a
//!   superseded version.
//! * A retired block carries the retired bit, so a second operation that tries to supersede
//!   or delete it fails with `Error::Retired` instead of freeing it twice.
//!
//! # Announcements (INV-EP-1)
//!
//! No operation runs in an epoch after the advancer has found it quiescent; `tracker.rs`
//! has the handshake and its argument, and loom tests that explore it.

#[allow(unsafe_code)]
// Under loom the queue leaks its nodes instead: loom's atomics do not fit the nodes' layout.
#[cfg_attr(montage_loom, allow(dead_code))]
pub(crate) mod nodes;
pub(crate) mod op;
pub(crate) mod reclaim;
pub(crate) mod stamped;
#[allow(unsafe_code)]
pub(crate) mod tracker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::alloc::block::{BlockInfo, PBlock};
use crate::alloc::{Allocator, Caches, ThreadCache};
use crate::base::epoch::Epoch;
use crate::config::{EpochLength, WriteBack};
use crate::error::{Error, Result};
use crate::meta::registry::Registry;
use crate::meta::structure_name;
use crate::persist::Media;
use crate::spare::recycle;
use reclaim::Reclaim;
use tracker::{Announcement, Publisher, Refused, Slots, Tracker};

/// How long sealed journal records may wait for a background commit.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// What the advance lock guards.
#[derive(Debug)]
struct Advancing {
    /// Advances made since the heap opened.
    count: u64,
    reclaim: Reclaim,
    /// The right to publish epochs and take the slots' logs.
    publisher: Publisher,
    /// The ranges an advance writes back, kept for its capacity (see `crate::spare`).
    persist: Vec<(u64, u64)>,
    /// The blocks whose payload checksums an advance writes again, kept likewise.
    written: Vec<PBlock>,
    /// Scratch space for those checksums.
    buf: Vec<u8>,
}

/// What operations of one epoch left for the advancer, in one thread slot: the slot's log
/// of that epoch.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// Byte ranges to write back.
    persist: Vec<(u64, u64)>,
    /// Blocks whose payloads were changed in part, in place: the advance writes their
    /// payload checksums again (INV-SUM-1). Each came with a range in `persist`, so this is
    /// empty whenever `persist` is.
    written: Vec<PBlock>,
    /// Superseded, deleted or killed blocks, reclaimed three advances later.
    victims: Vec<PBlock>,
    /// Anti-blocks, reclaimed four advances later.
    antis: Vec<PBlock>,
}

impl Bucket {
    /// Takes what an ending operation left: its written ranges, the blocks it changed in part
    /// in place, the versions it retired and its anti-blocks.
    fn take_from(
        &mut self,
        persist: &mut Vec<(u64, u64)>,
        written: &mut Vec<PBlock>,
        victims: &mut Vec<PBlock>,
        antis: &mut Vec<PBlock>,
    ) {
        move_all(&mut self.persist, persist);
        move_all(&mut self.written, written);
        move_all(&mut self.victims, victims);
        move_all(&mut self.antis, antis);
        // The advancer read these lines when it last took this log: ask for the next ones now,
        // so that a later operation's entries do not wait for them (the wait would fall on
        // the next locked instruction, the operation's leave).
        crate::persist::prefetch_tail_for_write(&self.persist);
        crate::persist::prefetch_tail_for_write(&self.victims);
        crate::persist::prefetch_tail_for_write(&self.antis);
    }
}

/// Moves everything in `from` to the end of `to`. Most operations leave one or two of a
/// bucket's four lists empty, and skipping those saves a call each.
#[inline]
fn move_all<T>(to: &mut Vec<T>, from: &mut Vec<T>) {
    if !from.is_empty() {
        to.append(from);
    }
}

/// What a thread slot keeps between operations: the thread's allocator cache, the
/// lock-free queue's nodes that its operations unlinked or may reuse, and the logs of
/// finished operations, kept for their capacity.
#[derive(Debug, Default)]
pub(crate) struct SlotState {
    cache: ThreadCache,
    #[cfg_attr(montage_loom, allow(dead_code))] // as the module
    nodes: nodes::NodeCache,
    #[allow(clippy::vec_box)] // the boxes, not the vector, are what moves
    spare_logs: Vec<Box<op::OpLog>>,
}

/// An operation's announcement in a slot of this heap.
pub(crate) type OpAnnouncement<'h> = Announcement<'h, SlotState, Bucket>;

/// Instance ids for open heaps (0 is never used, so a zeroed thread state names no heap).
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The epoch state of one open heap.
#[derive(Debug)]
pub(crate) struct Epochs {
    /// The clock, the announcements and the thread slots. The clock equals the stored
    /// epoch word, which is persisted before a new value is published.
    slots: Slots<SlotState, Bucket>,
    /// Serializes advances; holds their count and the reclamation pipeline.
    advance: Mutex<Advancing>,
    /// Set when an advance failed half-way: durability can no longer be promised.
    stopped: AtomicBool,
    /// The next uid to hand out.
    next_uid: AtomicU64,
    /// See [`instance`](Self::instance).
    instance: u64,
    /// Wakes the background advancer early (shutdown).
    wake: (Mutex<bool>, Condvar),
    pub(crate) length: EpochLength,
}

impl Epochs {
    pub(crate) fn new(epoch: Epoch, next_uid: u64, slots: usize, length: EpochLength) -> Epochs {
        let (slots, publisher) = Slots::new(epoch, slots);
        Epochs {
            slots,
            advance: Mutex::new(Advancing {
                count: 0,
                reclaim: Reclaim::new(epoch),
                publisher,
                persist: Vec::new(),
                written: Vec::new(),
                buf: Vec::new(),
            }),
            stopped: AtomicBool::new(false),
            next_uid: AtomicU64::new(next_uid),
            // ORDERING: only distinctness matters.
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            wake: (Mutex::new(false), Condvar::new()),
            length,
        }
    }

    /// The epoch new operations join, which is also the durable epoch word.
    pub(crate) fn current(&self) -> Epoch {
        self.slots.tracker().current()
    }

    /// The clock and announcement handshake.
    pub(crate) fn tracker(&self) -> &Tracker {
        self.slots.tracker()
    }

    /// Reserves `count` consecutive uids; returns the first.
    pub(crate) fn reserve_uids(&self, count: u64) -> u64 {
        // ORDERING: uids only need to be distinct.
        self.next_uid.fetch_add(count, Ordering::Relaxed)
    }

    /// An id unique to this open heap among all heaps this process opens.
    #[inline]
    pub(crate) fn instance(&self) -> u64 {
        self.instance
    }

    #[inline]
    fn check_running(&self) -> Result<()> {
        // ORDERING: Acquire pairs with the Release in `stop`.
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::ClockStopped {
                reason: "an epoch advance failed; reopen the heap to recover",
            });
        }
        Ok(())
    }

    fn stop(&self) {
        // ORDERING: pairs with the Acquire in `check_running`.
        self.stopped.store(true, Ordering::Release);
    }

    /// Announces an operation in the calling thread's slot (INV-EP-1).
    #[inline]
    pub(crate) fn announce(&self) -> Result<OpAnnouncement<'_>> {
        self.check_running()?;
        self.slots
            .announce(crate::thread_id::hold())
            .map_err(|refused| match refused {
                Refused::Closed => Error::Closed,
                Refused::Nested => Error::NestedOperation,
            })
    }

    /// Whether the calling thread has an operation open on this heap.
    pub(crate) fn has_open_op(&self) -> bool {
        self.slots.owner_busy(crate::thread_id::current()) || op::has_shared_op(self.instance)
    }

    /// The allocator caches of callers outside operations (the raw block interface).
    pub(crate) fn outside_op_caches(&self) -> OutsideOp<'_> {
        OutsideOp(&self.slots)
    }

    /// Makes the pending raw frees of every slot durable (at close, when no operation runs;
    /// operations free nothing directly, so only the shared slots hold any).
    pub(crate) fn drain_pending_frees(&self, media: &Media, alloc: &Allocator) -> Result<()> {
        let mut result = Ok(());
        self.slots.each_shared_state(|state| {
            if result.is_ok() {
                result = alloc.drain_pending(media, &mut state.cache);
            }
        });
        result
    }

    /// Fails with [`Error::Closed`] once the heap is closed.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.tracker().is_heap_closed() {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Refuses every later operation, `sync` and advance, and waits for the running
    /// operations to end; `false` if the heap was closed already. The closer then makes
    /// everything durable with [`sync_closing`](Self::sync_closing).
    pub(crate) fn close(&self) -> bool {
        self.slots.close_heap()
    }

    /// Takes the advance lock, which serializes advances and holds the number made. A
    /// poisoned lock means an advance panicked half-way: durability can't be promised.
    fn lock_advance(&self) -> Result<MutexGuard<'_, Advancing>> {
        self.advance.lock().map_err(|_| Error::ClockStopped {
            reason: "an epoch advance panicked; reopen the heap to recover",
        })
    }

    /// Moves the clock forward once (see the module docs); returns the new epoch. Like a
    /// background tick, commits the journal when reclamation has waited on it for two
    /// advances, so a heap advanced only by hand still reclaims.
    pub(crate) fn advance(&self, media: &Media, alloc: &Allocator) -> Result<Epoch> {
        self.check_open()?;
        let mut advancing = self.lock_advance()?;
        let epoch = self.advance_held(&mut advancing, media, alloc)?;
        let commit = advancing.reclaim.blocked_for(2);
        drop(advancing);
        if commit {
            self.commit(media, media.last_sealed())?;
        }
        Ok(epoch)
    }

    /// One advance, with the advance lock held. A failure stops the clock.
    fn advance_held(
        &self,
        advancing: &mut Advancing,
        media: &Media,
        alloc: &Allocator,
    ) -> Result<Epoch> {
        self.check_running()?;
        let result = self.advance_locked(advancing, media, alloc);
        if result.is_err() {
            self.stop();
        } else {
            advancing.count += 1;
        }
        result
    }

    /// Makes `ticket` durable; a failure stops the clock.
    fn commit(&self, media: &Media, ticket: u64) -> Result<()> {
        let result = media.commit(ticket);
        if result.is_err() {
            self.stop();
        }
        result
    }

    /// Whether no ended operation left anything (writes, or blocks to reclaim) in any
    /// slot's log. Called with the advance lock held, so no advance is half done: a drained
    /// log means its epoch's writes are durable and the stored word covers it.
    fn nothing_pending(&self) -> bool {
        !self.slots.any_filled()
    }

    /// What `sync` waits for: every operation that ended before the call is durable and
    /// inside the epochs recovery keeps. When no ended operation has writes waiting, that is
    /// already so and nothing is advanced; otherwise the clock moves two epochs past the call.
    /// Callers queue on the advance lock, so one advance serves every caller whose target it
    /// reaches (group commit).
    pub(crate) fn sync(&self, media: &Media, alloc: &Allocator) -> Result<()> {
        self.check_open()?;
        self.sync_closing(media, alloc)
    }

    /// [`sync`](Self::sync) for the closer, which has closed the heap already.
    pub(crate) fn sync_closing(&self, media: &Media, alloc: &Allocator) -> Result<()> {
        self.check_running()?;
        let target = self.current().plus(2);
        let ticket = {
            let mut advancing = self.lock_advance()?;
            if !self.nothing_pending() {
                while self.current() < target {
                    self.advance_held(&mut advancing, media, alloc)?;
                }
            }
            media.last_sealed()
        };
        // Outside the advance lock, so the next caller's advances overlap this flush; every
        // caller whose records this flush covers returns without one of its own.
        self.commit(media, ticket)?;
        self.check_running()
    }

    /// One tick of the background advancer: an advance, unless it would have nothing to
    /// write back or reclaim (then it would only rewrite the epoch word), so an idle heap
    /// stops writing. On the journal, then a commit if reclamation has waited on one for two
    /// ticks or records have waited a second or filled an eighth of the ring, and a
    /// checkpoint when three quarters of the ring are in use.
    fn tick(&self, media: &Media, alloc: &Allocator) -> Result<()> {
        let mut advancing = self.lock_advance()?;
        if !(self.nothing_pending() && advancing.reclaim.is_empty()) {
            self.advance_held(&mut advancing, media, alloc)?;
        }
        let blocked = advancing.reclaim.blocked_for(2);
        drop(advancing);
        if let Some(journal) = media.journal() {
            if blocked || journal.commit_due(COMMIT_INTERVAL) {
                self.commit(media, journal.last_sealed())?;
            }
            if journal.checkpoint_due() {
                let result = journal.checkpoint();
                if result.is_err() {
                    self.stop();
                }
                result?;
            }
        }
        Ok(())
    }

    fn advance_locked(
        &self,
        advancing: &mut Advancing,
        media: &Media,
        alloc: &Allocator,
    ) -> Result<Epoch> {
        let Advancing {
            reclaim,
            publisher,
            persist,
            written,
            buf,
            ..
        } = advancing;
        let e = self.current();
        // 1-3. Once every operation of e - 1 has ended (INV-EP-1), collect its write-backs,
        // and what e - 2 retired. (Before the first epoch these name no epoch that ran, and
        // the logs are empty.)
        persist.clear();
        written.clear();
        let (mut victims, mut antis) = reclaim.spare_lists();
        self.slots.drain_logs(publisher, e.minus(1), |log| {
            persist.append(&mut log.persist);
            written.append(&mut log.written);
            !(log.victims.is_empty() && log.antis.is_empty())
        });
        if e.minus(2) < e.minus(1) {
            self.slots.drain_logs(publisher, e.minus(2), |log| {
                victims.append(&mut log.victims);
                antis.append(&mut log.antis);
                !log.persist.is_empty()
            });
        }
        reclaim.retire(e.minus(2), victims, antis);
        // 2b. The payload checksums of the blocks of e - 1 written in place, whose payloads no
        // operation changes any more (INV-SUM-1); their trailers are written back below.
        for &block in written.iter() {
            if let Some(range) = alloc.seal_payload(media, block, Some(e.minus(1)), buf)? {
                persist.push(range);
            }
        }
        recycle(written);
        // Not sorted or merged: a line flushed twice costs little, sorting hundreds of
        // thousands of ranges per epoch costs a core (the journal backend merges
        // them themselves).
        // PERSIST: INV-EP-2: every block written in e - 1 is durable before the word reads
        // e + 1; `seal_epoch` below completes these flushes first.
        media.flush_all(persist)?;
        recycle(persist);
        // 4. Reclaim what INV-EP-3 and INV-EP-5 allow.
        let staged = reclaim.invalidate_due(media, alloc, e)?;
        // 5. The new epoch word, after everything above (INV-EP-2).
        let next = e.next();
        if next > Epoch::LIMIT {
            return Err(Error::ClockStopped {
                reason: "the epoch clock reached its limit",
            });
        }
        let ticket = media.seal_epoch(next.get())?;
        // INV-HDR-2: on the journal the clock stays within `JOURNAL_LEAD` epochs of the last
        // durable record (every advance seals at least one record, so half as many records
        // leave room for the records of one more advance).
        if media
            .journal()
            .is_some_and(|journal| journal.uncommitted() >= Epoch::JOURNAL_LEAD / 2)
        {
            self.commit(media, ticket)?;
        }
        reclaim.sealed(alloc, media, next, ticket, staged);
        // 6. Publish (INV-EP-1).
        self.slots.publish(publisher, next);
        Ok(next)
    }

    /// Asks the background advancer to stop.
    pub(crate) fn request_shutdown(&self) {
        *lock(&self.wake.0) = true;
        self.wake.1.notify_all();
    }

    /// Sleeps until `deadline` (not at all if it has passed; with none, until woken), or
    /// until shutdown is requested; returns whether to stop.
    pub(crate) fn sleep_until(&self, deadline: Option<Instant>) -> bool {
        let guard = lock(&self.wake.0);
        let guard = match deadline {
            Some(deadline) => {
                let wait = deadline.saturating_duration_since(Instant::now());
                self.wake
                    .1
                    .wait_timeout_while(guard, wait, |stop| !*stop)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => self
                .wake
                .1
                .wait_while(guard, |stop| !*stop)
                .unwrap_or_else(PoisonError::into_inner),
        };
        *guard
    }

    /// Whether blocks wait for reclamation: retired or killed by ended operations, or in
    /// the reclamation pipeline. Advancing the clock gives them back to the allocator.
    pub(crate) fn reclamation_pending(&self) -> Result<bool> {
        let advancing = self.lock_advance()?;
        Ok(!(self.nothing_pending() && advancing.reclaim.is_empty()))
    }

    /// How many advances this heap has made since it was opened.
    pub(crate) fn advances(&self) -> u64 {
        lock(&self.advance).count
    }
}

/// The allocator caches of a caller outside any operation: a shared slot's, under its lock,
/// and, when the heap is full, those of idle slots.
#[derive(Debug)]
pub(crate) struct OutsideOp<'a>(&'a Slots<SlotState, Bucket>);

impl Caches for OutsideOp<'_> {
    fn mine<R>(&self, f: impl FnOnce(&mut ThreadCache) -> R) -> R {
        self.0.with_shared_state(|state| f(&mut state.cache))
    }

    fn find_idle<R>(&self, mut f: impl FnMut(&mut ThreadCache) -> Option<R>) -> Option<R> {
        self.0.find_idle(|state| f(&mut state.cache))
    }
}

/// What an operation allocates with: its own slot's cache and, when the heap is full, those
/// of idle slots.
impl Caches for std::cell::RefCell<OpAnnouncement<'_>> {
    fn mine<R>(&self, f: impl FnOnce(&mut ThreadCache) -> R) -> R {
        self.borrow_mut().state(|state| f(&mut state.cache))
    }

    fn find_idle<R>(&self, mut f: impl FnMut(&mut ThreadCache) -> Option<R>) -> Option<R> {
        let slots = self.borrow().slots();
        slots.find_idle(|state| f(&mut state.cache))
    }
}

/// The background advancer: advances the clock every epoch length until shutdown, or
/// until an advance fails (the clock then stays stopped and `sync` reports it).
pub(crate) fn run_advancer(runtime: &Runtime, length: Duration) {
    let Runtime {
        media,
        alloc,
        epochs,
        ..
    } = runtime;
    // A fixed rate: each advance begins one length after the one before it began, so the
    // clock keeps its period while an advance takes less than that (a busy heap's advance
    // flushes and reclaims what a whole epoch wrote), and runs advance after advance when
    // one takes longer, rather than falling a whole advance further behind each time.
    // (A length too long to add to a time never ends: only shutdown wakes the advancer.)
    let mut deadline = Instant::now().checked_add(length);
    while !epochs.sleep_until(deadline) {
        let began = Instant::now();
        if epochs.tick(media, alloc).is_err() {
            return;
        }
        deadline = began.checked_add(length);
    }
}

/// What operations run on: the media, the allocator, the clock and the type registry of one
/// open heap. The heap owns one; every [`OpGuard`](op::OpGuard) borrows it.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) media: Media,
    pub(crate) alloc: Allocator,
    pub(crate) epochs: Epochs,
    /// The payload types the heap holds, checked when an operation stores one.
    pub(crate) types: Registry,
    /// When operations' writes are written back.
    pub(crate) write_back: WriteBack,
    /// The names of the heap's structures, by slot (owner id - 1), as its directory lists
    /// them.
    pub(crate) directory: Mutex<Vec<Option<String>>>,
    /// Whether reads verify payload checksums ([`HeapConfig::verify_reads`]).
    ///
    /// [`HeapConfig::verify_reads`]: crate::HeapConfig::verify_reads
    pub(crate) verify_reads: bool,
    /// Whether the heap was opened read-only ([`HeapConfig::read_only`]): every call that
    /// would change it fails.
    ///
    /// [`HeapConfig::read_only`]: crate::HeapConfig::read_only
    pub(crate) read_only: bool,
}

impl Runtime {
    /// Fails with [`Error::ReadOnly`] on a heap opened read-only: for every call that changes
    /// a payload, the directory or the registry, before it changes anything.
    #[inline]
    pub(crate) fn writable(&self) -> Result<()> {
        if self.read_only {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// With [`verify_reads`](Self::verify_reads) on, checks the payload of the block `info`
    /// describes against its checksum, if the block was written in an epoch no later than
    /// the one `cut` gives: the caller's view of the clock minus two, since the checksum of a
    /// payload changed in place in a later epoch may not be written yet (INV-SUM-1). `cut` is
    /// called only when reads are verified, so a read outside an operation loads no clock
    /// otherwise. Fails with [`Error::DamagedPayload`] naming the block's structure.
    #[inline]
    pub(crate) fn verify_payload(
        &self,
        info: &BlockInfo,
        cut: impl FnOnce() -> Epoch,
    ) -> Result<()> {
        if !self.verify_reads || info.spec.epoch > cut() {
            return Ok(());
        }
        self.check_payload(info)
    }

    /// [`verify_payload`](Self::verify_payload)'s check of a payload it must verify: out of
    /// line, as reads verify only when the heap is configured to.
    #[inline(never)]
    fn check_payload(&self, info: &BlockInfo) -> Result<()> {
        let creation_id = self.alloc.creation_id();
        if crate::alloc::payload_intact(&self.media, creation_id, info, &mut Vec::new())? {
            return Ok(());
        }
        let structure = structure_name(&lock(&self.directory), info.spec.owner.get())
            .unwrap_or_else(|| "-".to_owned());
        Err(Error::DamagedPayload {
            offset: info.block.offset(),
            structure,
        })
    }

    /// Advances the clock once (see the module docs).
    pub(crate) fn advance(&self) -> Result<Epoch> {
        self.epochs.advance(&self.media, &self.alloc)
    }

    /// Makes every ended operation durable (see [`Epochs::sync`]).
    pub(crate) fn sync(&self) -> Result<()> {
        self.epochs.sync(&self.media, &self.alloc)
    }

    /// Checks `type_id` against the heap's type registry under `name`, recording it if the
    /// heap has never stored a type of that name.
    pub(crate) fn check_type(&self, name: &'static str, type_id: u64) -> Result<()> {
        self.types
            .check_or_register(&self.media, name, type_id, !self.read_only)
    }

    /// [`sync`](Self::sync) for the closer, after [`Epochs::close`].
    pub(crate) fn sync_closing(&self) -> Result<()> {
        self.epochs.sync_closing(&self.media, &self.alloc)
    }
}
