//! The announcement handshake between operations and the advancer (INV-EP-1), and the
//! per-thread slots whose cells it hands from one party to another (INV-SLOT-1).
//!
//! # Announcements
//!
//! An operation reads the clock `e`, increments counter `e % 4` of its slot, and re-reads
//! the clock; if it moved, it undoes the increment and tries again. The advancer publishes
//! `e + 1` before it ever checks counter `e % 4` (at the next advance). All four steps are
//! sequentially consistent, so in their single total order either the increment comes
//! before the advancer's check (which then sees it and waits) or after it, in which case
//! the re-read comes after the publish and sees `e + 1`: no operation runs in an epoch the
//! advancer has found quiescent. Four counters suffice because only epochs `e - 1` and `e`
//! can have running operations while the clock reads `e`.
//!
//! The same pattern makes epoch-verified writes possible (INV-EP-4): a thread about to make
//! a write that must land in epoch `e` increments its slot's `verifying` counter and then
//! reads `closing`, the last epoch the advancer has begun to close; the advancer stores
//! `closing = e` and then waits for every `verifying` counter to drain before it publishes
//! `e + 1`. Either the writer sees `closing >= e` and gives up (once the clock has moved
//! on, which it then does at once, so that its retry runs in the new epoch), or the
//! advancer sees its increment and waits for the write to finish: a verified write of epoch
//! `e` happens before any operation of `e + 1` begins.
//!
//! # Slots (INV-SLOT-1)
//!
//! Every operation runs in a slot of the heap's [`Slots`]. The thread whose id
//! (`thread_id.rs`) is `i` owns slot `i` when `i` is below the number of owned slots: its
//! cells, a state `S` (the allocator's thread cache) and four logs `L` (what operations of
//! each epoch mod 4 leave for the advancer), are plain memory that no lock guards. Other
//! threads (beyond that count, or in thread teardown) announce in one of a few shared
//! slots, whose cells are mutexes. Three parties reach an owned slot's cells, never two at
//! once:
//!
//! * **the owner**, through the [`Announcement`] of its operation: the state, and the log
//!   of the announcement's epoch. The announcement holds the thread's id (so no other
//!   thread can own the slot meanwhile), and a slot takes one announcement at a time.
//! * **the advancer**, holding the heap's one [`Publisher`]: the log of an epoch the clock
//!   has passed by one to three, once no operation of that epoch runs. No operation can
//!   join that epoch any more, and none can join the epoch four later, which shares the
//!   log, before the publisher publishes again.
//! * **a thief**, an allocation that found the heap full and looks for free blocks in other
//!   threads' caches: the state, after it has set the slot's `frozen` flag and then found
//!   none of the slot's counters raised. An announcement raises a counter and then reads
//!   the flag; if it is set, it withdraws and waits for the thief to finish. Both halves
//!   are sequentially consistent, as in the handshake above: either the thief sees the
//!   raised counter and leaves the state alone, or the owner sees the flag.
//!
//! The loom models at the end of this file check each handover, with loom's own cells
//! reporting any two accesses that are not ordered.

use std::sync::atomic::AtomicU64 as IdCounter;

use crossbeam_utils::CachePadded;

use crate::base::epoch::Epoch;
use crate::primitive::{
    AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering, UnsafeCell, after_seqcst_access, fence,
    lock, yield_now,
};
use crate::thread_id::Held;

/// How many shared slots a heap has, for threads without an owned slot and for callers
/// outside operations.
const SHARED_SLOTS: usize = 4;

/// The clock and the running-operation counters.
#[derive(Debug)]
pub(crate) struct Tracker {
    current: CachePadded<AtomicU64>,
    /// The newest epoch the advancer has begun to close: verified writes of it or older fail.
    closing: CachePadded<AtomicU64>,
    /// The owned slots' counters, then the shared slots'.
    counters: Box<[CachePadded<Counters>]>,
    /// Set once, when the heap closes: no operation begins after it (see [`close_heap`]).
    ///
    /// [`close_heap`]: Tracker::close_heap
    heap_closed: AtomicBool,
}

/// One slot's counters and flags.
#[derive(Debug)]
struct Counters {
    /// Running operations, by epoch mod 4.
    running: [AtomicU32; 4],
    /// Verified writes in progress.
    verifying: AtomicU32,
    /// Set by a thief while it uses an owned slot's state.
    frozen: AtomicBool,
    /// Whether an announcement of this owned slot is alive. Only the slot's owner reads or
    /// writes it (an atomic only to say so without `unsafe`).
    busy: AtomicBool,
    /// Whether the log of each epoch mod 4 may hold something: set by the operations that
    /// write to it, cleared by the advancer when it takes everything.
    filled: [AtomicBool; 4],
}

impl Counters {
    fn new() -> Counters {
        Counters {
            running: std::array::from_fn(|_| AtomicU32::new(0)),
            verifying: AtomicU32::new(0),
            frozen: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            filled: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// Whether no operation of any epoch is announced here.
    fn idle(&self) -> bool {
        // ORDERING: SeqCst, the thief's half of the freeze handshake (module docs).
        self.running.iter().all(|c| c.load(Ordering::SeqCst) == 0)
    }
}

impl Tracker {
    fn new(epoch: Epoch, slots: usize) -> Tracker {
        Tracker {
            current: CachePadded::new(AtomicU64::new(epoch.get())),
            closing: CachePadded::new(AtomicU64::new(epoch.minus(1).get())),
            counters: (0..slots)
                .map(|_| CachePadded::new(Counters::new()))
                .collect(),
            heap_closed: AtomicBool::new(false),
        }
    }

    /// The epoch new operations join.
    #[inline]
    pub(crate) fn current(&self) -> Epoch {
        // ORDERING: SeqCst, part of the handshake (module docs).
        Epoch::new(self.current.load(Ordering::SeqCst))
    }

    /// Announces an operation in the slot whose counters are `counters` (owned, if `owned`);
    /// returns the epoch it runs in, or `None` once the tracker is
    /// [closed](Self::close_heap).
    #[inline]
    fn announce(&self, counters: &Counters, owned: bool) -> Option<Epoch> {
        loop {
            let epoch = self.current();
            let counter = &counters.running[epoch.slot4()];
            // ORDERING: SeqCst, part of the handshake (module docs).
            counter.fetch_add(1, Ordering::SeqCst);
            // ORDERING: the store-load half of the handshake (a Dekker pattern): the SeqCst
            // increment precedes the SeqCst re-read in the single total order; loom needs a
            // fence to see that (see `after_seqcst_access`).
            after_seqcst_access();
            // ORDERING: SeqCst, the operation's half of the closing handshake (see
            // `close_heap`): read after the increment, so either `close_heap` sees the
            // increment or this sees the flag.
            if self.heap_closed.load(Ordering::SeqCst) {
                // ORDERING: Release, as in `leave`; this operation never ran.
                counter.fetch_sub(1, Ordering::Release);
                return None;
            }
            // ORDERING: SeqCst, the owner's half of the freeze handshake (module docs): read
            // after the increment, so either the thief sees the increment or this sees the
            // flag.
            if owned && counters.frozen.load(Ordering::SeqCst) {
                // ORDERING: withdrawing our own increment; a thief that saw it gave up.
                counter.fetch_sub(1, Ordering::Relaxed);
                // ORDERING: Acquire pairs with the thief's Release when it unfreezes: what it
                // did to the state happens-before this thread's next use of it.
                while counters.frozen.load(Ordering::Acquire) {
                    yield_now();
                }
                continue;
            }
            if self.current() == epoch {
                return Some(epoch);
            }
            // ORDERING: withdrawing our own increment; an advancer that saw it waits a little
            // longer, which is harmless.
            counter.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Refuses every later announcement and waits until the operations already announced
    /// have left. Returns `false` (and waits for nothing) if the tracker was closed already.
    ///
    /// The same store-load handshake as between `announce` and the advancer: the flag is
    /// stored before the counters are read, and an operation's increment before its read of
    /// the flag, so an operation that did not see the flag is counted here and waited for.
    fn close_heap(&self) -> bool {
        // ORDERING: SeqCst, the closer's half of the handshake.
        if self.heap_closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        // ORDERING: store-load: the flag is ordered before the reads of the counters.
        fence(Ordering::SeqCst);
        // No operation can begin now, so each counter only drains (a refused announce's
        // increment is withdrawn at once).
        for epoch in 0..4 {
            self.wait_quiescent(Epoch::new(epoch));
        }
        true
    }

    /// Whether the heap has been closed.
    pub(crate) fn is_heap_closed(&self) -> bool {
        // ORDERING: Acquire: a caller that sees the flag sees what the closer did before it.
        self.heap_closed.load(Ordering::Acquire)
    }

    /// Runs `f` if no advance past `epoch` has begun, holding the next publish back until
    /// `f` returns (module docs); `None` if the advancer has begun to close `epoch`.
    fn verify<R>(&self, counters: &Counters, epoch: Epoch, f: impl FnOnce() -> R) -> Option<R> {
        /// Withdraws the increment even if `f` unwinds, so that the advancer is never stuck.
        struct Leave<'a>(&'a AtomicU32);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                // ORDERING: Release: the verified write happens-before the advancer's
                // SeqCst read of the drained counter, and so before the publish.
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        let counter = &counters.verifying;
        // ORDERING: SeqCst, the writer's half of the handshake (module docs).
        counter.fetch_add(1, Ordering::SeqCst);
        let leave = Leave(counter);
        // ORDERING: store-load: the SeqCst increment is ordered before the SeqCst read of
        // `closing`, as in `announce`.
        after_seqcst_access();
        // ORDERING: SeqCst, part of the handshake (module docs).
        if self.closing.load(Ordering::SeqCst) >= epoch.get() {
            drop(leave);
            // The advance past `epoch` has begun, and its publish waits only for verified
            // writes, each short: return once the clock has moved on, so that the caller's
            // retry runs in the new epoch.
            let mut spins = 0u32;
            while self.current() <= epoch {
                backoff(&mut spins);
            }
            return None;
        }
        Some(f())
    }

    /// Makes `epoch` the clock's value, after every verified write of the epoch it closes
    /// has finished (module docs).
    fn publish(&self, epoch: Epoch) {
        // ORDERING: SeqCst, the advancer's half of the verified-write handshake.
        self.closing.store(epoch.minus(1).get(), Ordering::SeqCst);
        // ORDERING: store-load: `closing` is ordered before the reads of the counters.
        fence(Ordering::SeqCst);
        let mut spins = 0u32;
        // ORDERING: SeqCst, part of the handshake; pairs with the Release in `verify`.
        while self
            .counters
            .iter()
            .any(|slot| slot.verifying.load(Ordering::SeqCst) != 0)
        {
            backoff(&mut spins);
        }
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.current.store(epoch.get(), Ordering::SeqCst);
        // ORDERING: the other store-load half: the publish is ordered before every later
        // check of the counters (see `announce`).
        fence(Ordering::SeqCst);
    }

    /// Whether no operation of `epoch` is running, in one pass over the slots.
    fn is_quiescent(&self, epoch: Epoch) -> bool {
        let index = epoch.slot4();
        // ORDERING: SeqCst, part of the handshake (module docs).
        self.counters
            .iter()
            .all(|slot| slot.running[index].load(Ordering::SeqCst) == 0)
    }

    /// Waits until no operation of `epoch` is running.
    fn wait_quiescent(&self, epoch: Epoch) {
        let mut spins = 0u32;
        while !self.is_quiescent(epoch) {
            spins = spins.saturating_add(1);
            if cfg!(montage_loom) || (64..1024).contains(&spins) {
                // Under loom, every wait is a scheduling point.
                yield_now();
            } else if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

/// One round of a short wait for another thread: a pause for the first 64 rounds, then a
/// yield of the processor (every round under loom, where each wait must be a scheduling
/// point).
fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if !cfg!(montage_loom) && *spins < 64 {
        std::hint::spin_loop();
    } else {
        yield_now();
    }
}

/// Why [`Slots::announce`] refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The heap is closed.
    Closed,
    /// The calling thread has an operation announced in this heap already.
    Nested,
}

/// Which slot an announcement is in: an owned slot, by the owner's thread id, or a shared
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotId {
    Own(usize),
    Shared(usize),
}

/// The cells of the slot an [`Announcement`] is in.
#[derive(Debug)]
enum Cells<'s, S, L> {
    Own(&'s OwnCells<S, L>),
    Shared(&'s SharedCells<S, L>),
}

/// An owned slot's cells (module docs).
#[derive(Debug)]
struct OwnCells<S, L> {
    state: UnsafeCell<S>,
    logs: [UnsafeCell<L>; 4],
}

/// A shared slot's cells.
#[derive(Debug)]
struct SharedCells<S, L> {
    state: Mutex<S>,
    logs: Mutex<[L; 4]>,
}

/// One heap's clock, announcement counters and per-thread slots (module docs): states `S`
/// and logs `L`.
#[derive(Debug)]
pub(crate) struct Slots<S, L> {
    tracker: Tracker,
    own: Box<[CachePadded<OwnCells<S, L>>]>,
    shared: Box<[CachePadded<SharedCells<S, L>>]>,
    /// Names the one [`Publisher`] of these slots.
    id: u64,
}

// SAFETY: the cells of an owned slot are `UnsafeCell`s, which are not `Sync`; every access to
// them follows INV-SLOT-1 (module docs): the owner only through its `Announcement`, the
// advancer only holding the `Publisher` and after the epoch is quiescent, a thief only between
// freezing the slot and unfreezing it, after finding it idle. Those accesses never overlap,
// and each handover is a synchronizing pair of atomics (loom-checked below). `S` and `L` move
// between threads that way, hence `Send`.
unsafe impl<S: Send, L: Send> Sync for Slots<S, L> {}

/// The right to move a [`Slots`]' clock and to take its logs: one per `Slots`, kept by
/// whoever serializes the epoch advances.
#[derive(Debug)]
pub(crate) struct Publisher {
    id: u64,
}

/// Distinguishes one `Slots` (and its publisher) from another.
static NEXT_ID: IdCounter = IdCounter::new(0);

impl<S: Default, L: Default> Slots<S, L> {
    /// Slots with the clock at `epoch`, `own` owned slots and a few shared ones, and the one
    /// publisher of their clock.
    pub(crate) fn new(epoch: Epoch, own: usize) -> (Slots<S, L>, Publisher) {
        // ORDERING: only distinctness matters.
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slots = Slots {
            tracker: Tracker::new(epoch, own + SHARED_SLOTS),
            own: (0..own)
                .map(|_| {
                    CachePadded::new(OwnCells {
                        state: UnsafeCell::new(S::default()),
                        logs: std::array::from_fn(|_| UnsafeCell::new(L::default())),
                    })
                })
                .collect(),
            shared: (0..SHARED_SLOTS)
                .map(|_| {
                    CachePadded::new(SharedCells {
                        state: Mutex::new(S::default()),
                        logs: Mutex::new(std::array::from_fn(|_| L::default())),
                    })
                })
                .collect(),
            id,
        };
        (slots, Publisher { id })
    }
}

impl<S, L> Slots<S, L> {
    /// The clock and its counters.
    pub(crate) fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    fn counters(&self, slot: SlotId) -> &Counters {
        let index = match slot {
            SlotId::Own(i) => i,
            SlotId::Shared(j) => self.own.len() + j,
        };
        &self.tracker.counters[index]
    }

    /// The slot of the thread with id `id` (`None` in thread teardown).
    fn slot_of(&self, id: Option<usize>) -> SlotId {
        match id {
            Some(i) if i < self.own.len() => SlotId::Own(i),
            Some(i) => SlotId::Shared(i % SHARED_SLOTS),
            None => SlotId::Shared(0),
        }
    }

    /// Announces an operation of the thread whose id `held` holds, in its slot.
    ///
    /// # Errors
    ///
    /// [`Refused::Closed`] once the heap is closed; [`Refused::Nested`] if the thread has an
    /// operation announced in its owned slot already.
    #[inline]
    pub(crate) fn announce(&self, held: Held) -> Result<Announcement<'_, S, L>, Refused> {
        let slot = self.slot_of(held.id());
        let counters = self.counters(slot);
        let owned = matches!(slot, SlotId::Own(_));
        // ORDERING: only the owner reads or writes `busy`.
        if owned && counters.busy.load(Ordering::Relaxed) {
            return Err(Refused::Nested);
        }
        let epoch = self
            .tracker
            .announce(counters, owned)
            .ok_or(Refused::Closed)?;
        let cells = match slot {
            SlotId::Own(i) => {
                // ORDERING: as above.
                counters.busy.store(true, Ordering::Relaxed);
                Cells::Own(&self.own[i])
            }
            SlotId::Shared(j) => Cells::Shared(&self.shared[j]),
        };
        Ok(Announcement {
            slots: self,
            cells,
            counters,
            epoch,
            held,
        })
    }

    /// Whether the thread with id `id`, the calling thread, has an operation announced in
    /// its owned slot (`false` if it has no owned slot).
    pub(crate) fn owner_busy(&self, id: Option<usize>) -> bool {
        let slot = self.slot_of(id);
        // ORDERING: only the owner reads or writes `busy`, and the caller is the owner.
        matches!(slot, SlotId::Own(_)) && self.counters(slot).busy.load(Ordering::Relaxed)
    }

    /// Runs `f` on a shared slot's state, for a caller outside any operation (the raw block
    /// interface).
    pub(crate) fn with_shared_state<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        let index = crate::thread_id::current().map_or(0, |id| id % SHARED_SLOTS);
        f(&mut lock(&self.shared[index].state))
    }

    /// Runs `f` on every shared slot's state in turn (at close: no operation runs).
    pub(crate) fn each_shared_state(&self, mut f: impl FnMut(&mut S)) {
        for cells in &*self.shared {
            f(&mut lock(&cells.state));
        }
    }

    /// Runs `f` on the state of every slot that no thread is using at this moment (an owned
    /// slot with no operation announced, a shared slot whose lock is free), until `f`
    /// returns `Some`; the rest are skipped. For an allocation that found the heap full.
    pub(crate) fn find_idle<R>(&self, mut f: impl FnMut(&mut S) -> Option<R>) -> Option<R> {
        for index in 0..self.own.len() {
            if let Some(Some(found)) = self.try_steal(index, &mut f) {
                return Some(found);
            }
        }
        self.shared
            .iter()
            .find_map(|cells| match cells.state.try_lock() {
                Ok(mut state) => f(&mut state),
                Err(_) => None,
            })
    }

    /// Runs `f` on owned slot `index`'s state if no operation is announced there: the
    /// thief's side of the freeze handshake (module docs). `None` if the slot was busy.
    fn try_steal<R>(&self, index: usize, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        let counters = &self.tracker.counters[index];
        // ORDERING: SeqCst, the thief's half of the freeze handshake (module docs). A flag set
        // already means another thief has the slot.
        if counters.frozen.swap(true, Ordering::SeqCst) {
            return None;
        }
        // ORDERING: store-load: the flag precedes the reads of the counters (as in
        // `announce`).
        after_seqcst_access();
        let result = counters.idle().then(|| {
            self.own[index].state.with_mut(|state| {
                // SAFETY: INV-SLOT-1: the slot is frozen and was idle after the flag was set, so
                // its owner has no announcement alive and cannot take one before the flag is
                // cleared below (an announcement that meets the flag waits); no other thief
                // holds the flag; the pointer comes from the live cell.
                f(unsafe { &mut *state })
            })
        });
        // ORDERING: Release: what this thief did happens-before the owner's next use of the
        // state (its announce reads the flag, SeqCst, hence Acquire).
        counters.frozen.store(false, Ordering::Release);
        result
    }

    /// Whether the log of some epoch, in some slot, may hold something.
    pub(crate) fn any_filled(&self) -> bool {
        // ORDERING: Acquire: an operation that ended before the caller looked (and so set
        // its flag before its Release leave) is seen.
        self.tracker
            .counters
            .iter()
            .any(|slot| slot.filled.iter().any(|f| f.load(Ordering::Acquire)))
    }

    fn check(&self, publisher: &Publisher) {
        assert_eq!(
            publisher.id, self.id,
            "a publisher moves only the clock of its own slots"
        );
    }

    /// Makes `epoch` the clock's value (module docs).
    pub(crate) fn publish(&self, publisher: &mut Publisher, epoch: Epoch) {
        self.check(publisher);
        self.tracker.publish(epoch);
    }

    /// Waits until no operation of `epoch` runs, then runs `f` on the log of `epoch` in
    /// every slot whose log may hold something; `f` returns whether it left something in
    /// the log. `epoch` must be one to three epochs behind the clock.
    ///
    /// # Panics
    ///
    /// If `epoch` is not one to three epochs behind the clock, or `publisher` is another
    /// `Slots`' publisher.
    pub(crate) fn drain_logs(
        &self,
        publisher: &mut Publisher,
        epoch: Epoch,
        mut f: impl FnMut(&mut L) -> bool,
    ) {
        self.check(publisher);
        let current = self.tracker.current();
        assert!(
            epoch < current && current.get() - epoch.get() <= 3,
            "the logs of epoch {epoch} drained with the clock at {current}"
        );
        self.tracker.wait_quiescent(epoch);
        let index = epoch.slot4();
        for (slot, cells) in self.own.iter().enumerate() {
            let filled = &self.tracker.counters[slot].filled[index];
            // ORDERING: Acquire, as in `any_filled` (the operations of `epoch` have left).
            if !filled.load(Ordering::Acquire) {
                continue;
            }
            let kept = cells.logs[index].with_mut(|log| {
                // SAFETY: INV-SLOT-1: no operation of `epoch` runs (waited above) or can start
                // (the clock is past it); none of `epoch + 4`, which shares the log, can run
                // before this publisher publishes three more times, and `&mut Publisher`
                // keeps it from publishing until this returns. So only this call reaches the
                // cell, and the owners' writes to it happened-before the waited-for leaves.
                f(unsafe { &mut *log })
            });
            if !kept {
                // ORDERING: the next writer of this log begins after the next publishes,
                // which are SeqCst stores after this one: it sees this store before its own.
                filled.store(false, Ordering::Relaxed);
            }
        }
        for (j, cells) in self.shared.iter().enumerate() {
            let filled = &self.tracker.counters[self.own.len() + j].filled[index];
            // ORDERING: as above.
            if filled.load(Ordering::Acquire) && !f(&mut lock(&cells.logs)[index]) {
                // ORDERING: as above.
                filled.store(false, Ordering::Relaxed);
            }
        }
    }

    /// Refuses every later announcement and waits until the running operations have left;
    /// `false` (and waits for nothing) if the slots were closed already.
    pub(crate) fn close_heap(&self) -> bool {
        self.tracker.close_heap()
    }
}

/// An operation's announcement (INV-EP-1): its slot and epoch, and the access to the slot's
/// state and to its log of that epoch. Dropping it withdraws the announcement.
#[derive(Debug)]
pub(crate) struct Announcement<'s, S, L> {
    slots: &'s Slots<S, L>,
    /// The slot's cells and counters, looked up once, when the operation announced.
    cells: Cells<'s, S, L>,
    counters: &'s Counters,
    epoch: Epoch,
    /// Keeps the thread's id, and so its owned slot, this thread's while the announcement
    /// lives.
    held: Held,
}

impl<'s, S, L> Announcement<'s, S, L> {
    /// The epoch the operation runs in.
    pub(crate) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether the operation is announced in a slot its thread owns.
    #[inline]
    pub(crate) fn owned(&self) -> bool {
        matches!(self.cells, Cells::Own(_))
    }

    /// The slots the operation is announced in.
    pub(crate) fn slots(&self) -> &'s Slots<S, L> {
        self.slots
    }

    /// Runs `f` on the slot's state.
    #[inline]
    pub(crate) fn state<R>(&mut self, f: impl FnOnce(&mut S) -> R) -> R {
        match self.cells {
            Cells::Own(cells) => cells.state.with_mut(|state| {
                // SAFETY: INV-SLOT-1: this announcement is alive, so the slot is not idle and no
                // thief uses its state (a thief that froze it first has finished: announce
                // waited for the flag to clear); this thread holds the owner's id (`held`),
                // `busy` let it announce once, and `&mut self` makes this the only borrow.
                f(unsafe { &mut *state })
            }),
            Cells::Shared(cells) => f(&mut lock(&cells.state)),
        }
    }

    /// Marks the slot's log of the operation's epoch as holding something, for a caller
    /// about to add to it; returns the log's index.
    #[inline]
    fn fill_log(&self) -> usize {
        let index = self.epoch.slot4();
        let filled = &self.counters.filled[index];
        // ORDERING: Relaxed, as only one party writes the flag at a time (the writers of
        // this epoch's log, or the advancer after they left); the Release of `leave`
        // publishes it with the log.
        if !filled.load(Ordering::Relaxed) {
            filled.store(true, Ordering::Relaxed);
        }
        index
    }

    /// Runs `f` on the slot's log of the operation's epoch, and marks the log as holding
    /// something (call it only to add to it).
    #[inline]
    pub(crate) fn log<R>(&mut self, f: impl FnOnce(&mut L) -> R) -> R {
        let index = self.fill_log();
        match self.cells {
            Cells::Own(cells) => cells.logs[index].with_mut(|log| {
                // SAFETY: INV-SLOT-1: the operation is announced in `self.epoch`, so the
                // advancer does not take this log before it leaves (it waits for the epoch to
                // be quiescent), and no other epoch using the log can run meanwhile; this
                // thread owns the slot (`held`, `busy`), and `&mut self` makes this the only
                // borrow.
                f(unsafe { &mut *log })
            }),
            Cells::Shared(cells) => f(&mut lock(&cells.logs)[index]),
        }
    }

    /// Runs `f` on the slot's state and on its log of the operation's epoch at once, and
    /// marks the log as holding something (as [`log`](Self::log) does): for an allocation
    /// that takes a block from the state's cache and logs its write-back in one step.
    #[inline]
    pub(crate) fn state_and_log<R>(&mut self, f: impl FnOnce(&mut S, &mut L) -> R) -> R {
        let index = self.fill_log();
        match self.cells {
            Cells::Own(cells) => cells.state.with_mut(|state| {
                cells.logs[index].with_mut(|log| {
                    // SAFETY: INV-SLOT-1, as in `state`; the log is another cell.
                    let state = unsafe { &mut *state };
                    // SAFETY: INV-SLOT-1, as in `log`; `&mut self` makes this and the state
                    // above the only borrows of the two cells.
                    let log = unsafe { &mut *log };
                    f(state, log)
                })
            }),
            // The state's lock, then the logs': no party takes the state's while it holds
            // the logs' (the advancer takes only the logs', a thief only the state's).
            Cells::Shared(cells) => f(&mut lock(&cells.state), &mut lock(&cells.logs)[index]),
        }
    }

    /// The id of the thread the operation runs in (`None` in thread teardown), held: no
    /// other thread has it while the announcement lives.
    pub(crate) fn thread_id(&self) -> Option<usize> {
        self.held.id()
    }

    /// Runs `f` if no advance past the operation's epoch has begun (INV-EP-4; see
    /// [`Tracker`]'s module docs); `None` if the epoch has begun to close.
    pub(crate) fn verify<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        self.slots.tracker.verify(self.counters, self.epoch, f)
    }
}

impl<S, L> Drop for Announcement<'_, S, L> {
    fn drop(&mut self) {
        let counters = self.counters;
        let counter = &counters.running[self.epoch.slot4()];
        if self.owned() {
            // ORDERING: only the owner reads or writes `busy`.
            counters.busy.store(false, Ordering::Relaxed);
            // An owned slot's counters change only in its owner's thread (announce, its
            // withdrawals, this), so the decrement needs no read-modify-write: a plain
            // store, where a locked instruction would wait for every store before it.
            // ORDERING: Relaxed load of a value only this thread writes; Release store, as
            // below.
            counter.store(counter.load(Ordering::Relaxed) - 1, Ordering::Release);
        } else {
            // ORDERING: Release: what the operation did to the slot's cells happens-before
            // the advancer's or a thief's SeqCst (hence Acquire) read of the drained counter.
            counter.fetch_sub(1, Ordering::Release);
        }
    }
}

#[cfg(all(test, montage_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64 as Flag;

    type TestSlots = Slots<u64, u64>;

    fn slots(epoch: u64, own: usize) -> (Arc<TestSlots>, Publisher) {
        let (slots, publisher) = Slots::new(Epoch::new(epoch), own);
        (Arc::new(slots), publisher)
    }

    /// An operation announces while the advancer publishes the next epoch and checks the old
    /// one: if the advancer finds epoch 1 quiescent, the operation is not running in it.
    #[test]
    fn an_epoch_found_quiescent_has_no_running_operation() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 1);
            // The epoch the operation is running in, 0 when none.
            let running_in = Arc::new(Flag::new(0));
            let op = {
                let (slots, running_in) = (slots.clone(), running_in.clone());
                loom::thread::spawn(move || {
                    let ann = slots.announce(Held::for_loom(0)).unwrap();
                    running_in.store(ann.epoch().get(), Ordering::SeqCst);
                    running_in.store(0, Ordering::SeqCst);
                })
            };
            slots.publish(&mut publisher, Epoch::new(2));
            if slots.tracker.is_quiescent(Epoch::new(1)) {
                assert_ne!(running_in.load(Ordering::SeqCst), 1);
            }
            op.join().unwrap();
        });
    }

    /// Two operations in two slots and an advancer that moves the clock twice: whenever it
    /// finds an epoch quiescent, neither operation runs in it.
    #[test]
    fn two_slots_and_two_advances() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 2);
            let running: Arc<[Flag; 2]> = Arc::new([Flag::new(0), Flag::new(0)]);
            let ops: Vec<_> = (0..2)
                .map(|slot| {
                    let (slots, running) = (slots.clone(), running.clone());
                    loom::thread::spawn(move || {
                        let ann = slots.announce(Held::for_loom(slot)).unwrap();
                        running[slot].store(ann.epoch().get(), Ordering::SeqCst);
                        running[slot].store(0, Ordering::SeqCst);
                    })
                })
                .collect();
            for next in [2u64, 3] {
                slots.publish(&mut publisher, Epoch::new(next));
                if slots.tracker.is_quiescent(Epoch::new(next - 1)) {
                    for flag in running.iter() {
                        assert_ne!(flag.load(Ordering::SeqCst), next - 1);
                    }
                }
            }
            for op in ops {
                op.join().unwrap();
            }
        });
    }

    /// A verified write of epoch 1 races with the publish of epoch 2: if it succeeded, it is
    /// visible to whoever reads after the publish returns (so to every operation of epoch
    /// 2); if the publish came first, it fails.
    #[test]
    fn a_verified_write_happens_before_the_next_epoch() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 1);
            let word = Arc::new(Flag::new(0));
            let writer = {
                let (slots, word) = (slots.clone(), word.clone());
                loom::thread::spawn(move || {
                    // Only an operation of epoch 1 makes the write this test is about.
                    let Ok(ann) = slots.announce(Held::for_loom(0)) else {
                        return false;
                    };
                    ann.epoch() == Epoch::new(1)
                        && ann.verify(|| word.store(1, Ordering::Relaxed)).is_some()
                })
            };
            slots.publish(&mut publisher, Epoch::new(2));
            let seen = word.load(Ordering::Relaxed);
            let wrote = writer.join().unwrap();
            if wrote {
                assert_eq!(
                    seen, 1,
                    "a verified write of epoch 1 landed after epoch 2 began"
                );
            } else {
                assert_eq!(word.load(Ordering::Relaxed), 0);
            }
        });
    }

    /// An operation announces while the heap closes: when `close` returns, the operation was
    /// either refused or has left; it never runs after the closer goes on.
    #[test]
    fn no_operation_runs_after_close_returns() {
        loom::model(|| {
            let (slots, _publisher) = slots(1, 1);
            // 1 while the operation runs.
            let running = Arc::new(Flag::new(0));
            let op = {
                let (slots, running) = (slots.clone(), running.clone());
                loom::thread::spawn(move || {
                    if let Ok(_ann) = slots.announce(Held::for_loom(0)) {
                        running.store(1, Ordering::SeqCst);
                        running.store(0, Ordering::SeqCst);
                    }
                })
            };
            assert!(slots.close_heap());
            assert_eq!(running.load(Ordering::SeqCst), 0);
            assert!(
                !slots.close_heap(),
                "a second close reported it closed the tracker"
            );
            op.join().unwrap();
            assert_eq!(
                slots.announce(Held::for_loom(0)).err(),
                Some(Refused::Closed)
            );
        });
    }

    /// The owner writes its epoch's log while the advancer publishes and drains the log of
    /// the epoch before: loom's cells report any access to one log that is not ordered, and
    /// the advancer takes every value an operation of the drained epoch wrote.
    #[test]
    fn the_advancer_takes_a_log_only_after_its_writers_left() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 1);
            let op = {
                let slots = slots.clone();
                loom::thread::spawn(move || {
                    let mut ann = slots.announce(Held::for_loom(0)).unwrap();
                    let epoch = ann.epoch().get();
                    ann.log(|log| *log += epoch);
                    ann.state(|state| *state += 1);
                    epoch
                })
            };
            slots.publish(&mut publisher, Epoch::new(2));
            let mut taken = 0;
            slots.drain_logs(&mut publisher, Epoch::new(1), |log| {
                taken += std::mem::take(log);
                false
            });
            let epoch = op.join().unwrap();
            // An operation of epoch 1 left 1 in the log the drain took; one of epoch 2 wrote
            // the log of epoch 2, which the drain did not touch.
            assert_eq!(taken, u64::from(epoch == 1));
        });
    }

    /// An owner runs two operations in a row (its leave is a plain store, not a locked
    /// decrement) while the advancer publishes and drains twice: every value an operation
    /// logged in a drained epoch is taken exactly once, and the counters end at zero.
    #[test]
    fn an_owner_leaves_with_a_plain_store_and_the_advancer_sees_it() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 1);
            let op = {
                let slots = slots.clone();
                loom::thread::spawn(move || {
                    let mut epochs = Vec::new();
                    for _ in 0..2 {
                        let mut ann = slots.announce(Held::for_loom(0)).unwrap();
                        let epoch = ann.epoch().get();
                        ann.log(|log| *log += 1);
                        epochs.push(epoch);
                    }
                    epochs
                })
            };
            let mut taken = 0;
            for next in [2u64, 3] {
                slots.publish(&mut publisher, Epoch::new(next));
                slots.drain_logs(&mut publisher, Epoch::new(next - 1), |log| {
                    taken += std::mem::take(log);
                    false
                });
            }
            let epochs = op.join().unwrap();
            let drained = epochs.iter().filter(|&&e| e < 3).count() as u64;
            assert_eq!(taken, drained, "operations of epochs {epochs:?}");
            for epoch in 1..=3 {
                assert!(slots.tracker.is_quiescent(Epoch::new(epoch)));
            }
        });
    }

    /// A thief takes an owned slot's state while its owner announces and uses it: loom's
    /// cells report any overlap, and the two changes are never lost.
    #[test]
    fn a_thief_and_the_owner_never_use_the_state_at_once() {
        loom::model(|| {
            let (slots, _publisher) = slots(1, 1);
            let owner = {
                let slots = slots.clone();
                loom::thread::spawn(move || {
                    let mut ann = slots.announce(Held::for_loom(0)).unwrap();
                    ann.state(|state| *state += 1);
                })
            };
            let stolen = slots.try_steal(0, |state| *state += 10);
            owner.join().unwrap();
            let mut ann = slots.announce(Held::for_loom(0)).unwrap();
            let total = ann.state(|state| *state);
            assert_eq!(total, 1 + if stolen.is_some() { 10 } else { 0 });
        });
    }

    /// An owner takes its slot's state and its log at once (`state_and_log`, as an
    /// allocation does) while a thief tries to take the state and the advancer publishes and
    /// drains the owner's epoch: loom's cells report any overlap of either cell, the state's
    /// changes are never lost, and the log's entry is taken once, when the epoch drained.
    #[test]
    fn state_and_log_at_once_race_with_neither_the_thief_nor_the_advancer() {
        loom::model(|| {
            let (slots, mut publisher) = slots(1, 1);
            let owner = {
                let slots = slots.clone();
                loom::thread::spawn(move || {
                    let mut ann = slots.announce(Held::for_loom(0)).unwrap();
                    ann.state_and_log(|state, log| {
                        *state += 1;
                        *log += 1;
                    });
                    ann.epoch().get()
                })
            };
            let stolen = slots.try_steal(0, |state| *state += 10);
            slots.publish(&mut publisher, Epoch::new(2));
            let mut taken = 0;
            slots.drain_logs(&mut publisher, Epoch::new(1), |log| {
                taken += std::mem::take(log);
                false
            });
            let epoch = owner.join().unwrap();
            assert_eq!(
                taken,
                u64::from(epoch == 1),
                "the owner ran in epoch {epoch}"
            );
            let mut ann = slots.announce(Held::for_loom(0)).unwrap();
            let total = ann.state(|state| *state);
            assert_eq!(total, 1 + if stolen.is_some() { 10 } else { 0 });
        });
    }

    /// A second announcement by the owner of a slot is refused while the first lives, and
    /// allowed after it.
    #[test]
    fn an_owned_slot_takes_one_announcement_at_a_time() {
        loom::model(|| {
            let (slots, _publisher) = slots(1, 1);
            let first = slots.announce(Held::for_loom(0)).unwrap();
            assert_eq!(
                slots.announce(Held::for_loom(0)).err(),
                Some(Refused::Nested)
            );
            drop(first);
            assert!(slots.announce(Held::for_loom(0)).is_ok());
        });
    }
}
