//! The epoch-verified compare-and-swap for DRAM words.
//!
//! A nonblocking structure links its DRAM index with verified words. A swap succeeds only
//! if the value matches *and* the epoch clock still reads the calling operation's epoch.
//! Without that an operation of epoch `e` could link its change after operations of `e + 1`
//! had already acted on the old link, and recovery to the end of `e` would keep the later
//! change but not the earlier one. Two ways get it (INV-CAS-1):
//!
//! * [`VerifiedAtomic::compare_exchange`] swaps inside the clock's verify handshake
//!   (`OpGuard::verified`, INV-EP-4): the advancer does not publish the next epoch while the
//!   swap runs, and the swap does not run once the advance has begun. Nobody else has to
//!   finish such a swap, so a `VerifiedAtomic` word never holds a descriptor.
//! * The lock-free list's and queue's links (`publish_node`, the queue's head) swap by
//!   [`dcss`]: a double-compare single-swap (Harris, Fraser and Pratt, "A practical
//!   multi-word compare-and-swap operation", 2002) whose second compare is against the
//!   clock, as below.
//!
//! # The DCSS
//!
//! 1. The owner allocates a descriptor `{epoch, expected, new, status}` and swaps it into the
//!    word in place of `expected` (a tagged pointer, low bit 1; values are stored shifted
//!    left by one, so their low bit is 0).
//! 2. Anyone who finds a descriptor in the word (the owner, a competing CAS, a reader)
//!    completes it: reads the clock, tries to move `status` from undecided to succeeded (the
//!    clock reads the descriptor's epoch) or failed (it does not), and swaps the word from
//!    the descriptor to `new` or back to `expected` as `status` says.
//! 3. The first status transition decides; the DCSS linearizes at the clock read that
//!    preceded it, when the clock read the operation's epoch. Nobody returns a value while
//!    a descriptor is undecided, so no access can be ordered between that read and the
//!    decision.
//!
//! Descriptors are freed through crossbeam-epoch: the owner retires its descriptor once the
//! word no longer holds it, and anyone who may still dereference it is pinned. Under
//! `cfg(montage_loom)` they are leaked instead (loom explores bounded executions).

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::epoch::tracker::Tracker;
use crate::primitive::{AtomicPtr, AtomicU32, Ordering, fence};

/// Why a compare-and-swap did not happen, with the value the word held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasError<T> {
    /// The value found (for [`CasErrorKind::Mismatch`]), or the unchanged current value.
    pub current: T,
    /// Why the swap failed.
    pub kind: CasErrorKind,
}

/// The reason in a [`CasError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CasErrorKind {
    /// The word did not hold the expected value.
    Mismatch,
    /// The epoch clock moved past the operation's epoch: retry in a new operation.
    EpochAdvanced,
    /// A payload field: the payload was written in an epoch before the operation's, so it
    /// can change only by copy-on-write (`set_<field>`), which the structure must serialize.
    OlderEpoch,
}

impl<T: std::fmt::Debug> std::fmt::Display for CasError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            CasErrorKind::Mismatch => write!(f, "compare-and-swap found {:?}", self.current),
            CasErrorKind::EpochAdvanced => {
                f.write_str("compare-and-swap failed: the epoch advanced; retry the operation")
            }
            CasErrorKind::OlderEpoch => f.write_str(
                "compare-and-swap on a payload of an older epoch; update it by copy-on-write",
            ),
        }
    }
}

impl<T: std::fmt::Debug> std::error::Error for CasError<T> {}

mod sealed {
    pub trait Sealed {}
}

/// A value a [`VerifiedAtomic`] can hold: one machine word with its lowest bit free.
///
/// Implemented for the integer types up to 32 bits, `bool`, and for `u64` and `usize`
/// values below 2^63 (index positions and counters; never pointers into the persistent
/// heap, which live in payloads as [`POff`](crate::POff)).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be held by a `VerifiedAtomic`",
    note = "a verified word holds an integer of at most 32 bits, a `bool`, or a `u64`/`usize` below 2^63"
)]
pub trait CasWord: Copy + Eq + Send + Sync + 'static + sealed::Sealed {
    /// The word encoding, `< 2^63`.
    #[doc(hidden)]
    fn to_raw(self) -> usize;
    /// The inverse of `to_raw`.
    #[doc(hidden)]
    fn from_raw(raw: usize) -> Self;
}

macro_rules! small_words {
    ($($t:ty => $u:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl CasWord for $t {
            #[allow(clippy::cast_sign_loss)]
            fn to_raw(self) -> usize {
                // Through the unsigned twin, so that negative values do not sign-extend.
                self as $u as usize
            }
            #[allow(clippy::cast_possible_wrap)]
            fn from_raw(raw: usize) -> Self {
                raw as $u as $t
            }
        }
    )*};
}
small_words!(u8 => u8, u16 => u16, u32 => u32, i8 => u8, i16 => u16, i32 => u32);

// Words are 64 bits: values of up to 63 bits plus the descriptor tag.
const _: () = assert!(usize::BITS == 64);

impl sealed::Sealed for bool {}
impl CasWord for bool {
    fn to_raw(self) -> usize {
        usize::from(self)
    }
    fn from_raw(raw: usize) -> Self {
        raw != 0
    }
}

impl sealed::Sealed for usize {}
impl CasWord for usize {
    /// # Panics
    ///
    /// If `self >= 2^63`.
    fn to_raw(self) -> usize {
        assert!(self >> 63 == 0, "VerifiedAtomic values must be below 2^63");
        self
    }
    fn from_raw(raw: usize) -> Self {
        raw
    }
}

impl sealed::Sealed for u64 {}
impl CasWord for u64 {
    /// # Panics
    ///
    /// If `self >= 2^63`.
    fn to_raw(self) -> usize {
        assert!(self >> 63 == 0, "VerifiedAtomic values must be below 2^63");
        self as usize
    }
    fn from_raw(raw: usize) -> Self {
        raw as u64
    }
}

/// The low bit that marks a descriptor.
const DESCRIPTOR: usize = 1;
const UNDECIDED: u32 = 0;
const SUCCEEDED: u32 = 1;
const FAILED: u32 = 2;

/// One DCSS in progress.
#[derive(Debug)]
struct Descriptor {
    /// The heap whose clock decides it.
    instance: u64,
    epoch: Epoch,
    expected: Raw,
    new: Raw,
    status: AtomicU32,
}

/// What a [`Word`] holds when no swap is in progress: a value shifted left by one (an
/// encoded [`CasWord`]), or a link of the lock-free structures, a node's address shifted
/// left by one with a mark bit below it. Either way bit 0, the descriptor tag, is clear.
///
/// A link keeps its node pointer's provenance: addresses are only ever changed with
/// `map_addr` (strict provenance), never rebuilt from integers, so a node is reached only
/// through the pointer it was allocated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Raw(*mut ());

// SAFETY: a `Raw` is the content of a word, an address with its provenance; sending or
// sharing it dereferences nothing. Its pointee is reached only under the structures'
// protocol (pinned, INV-CAS-1), as `AtomicPtr` is `Send` whatever it points at.
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

impl Raw {
    /// The empty link; also the encoding of the value 0.
    pub(crate) const NULL: Raw = Raw(std::ptr::null_mut());

    /// The encoding of `value`, which is below 2^63.
    fn value(value: usize) -> Raw {
        debug_assert_eq!(value >> 63, 0);
        Raw(std::ptr::without_provenance_mut(value << 1))
    }

    /// The value this encodes.
    fn to_value(self) -> usize {
        self.0.addr() >> 1
    }

    /// A link to `node` (a null pointer for none), marked or not. Nodes are at least
    /// 2-aligned, so bit 0 of their address is free for the mark.
    pub(crate) fn link<T>(node: *mut T, marked: bool) -> Raw {
        Raw(node
            .cast::<()>()
            .map_addr(|addr| (addr | usize::from(marked)) << 1))
    }

    /// The node this link points at (null for none), with its provenance.
    pub(crate) fn node<T>(self) -> *mut T {
        self.0.map_addr(|raw| (raw >> 1) & !1).cast::<T>()
    }

    /// Whether this link is marked.
    pub(crate) fn is_marked(self) -> bool {
        (self.0.addr() >> 1) & 1 != 0
    }

    /// This link, marked or unmarked.
    pub(crate) fn with_mark(self, marked: bool) -> Raw {
        Raw::link(self.node::<()>(), marked)
    }
}

/// A DCSS word: a DRAM word that holds a [`Raw`], or, while a swap is in progress, a
/// descriptor's address with the tag bit set. Only this module can store into it, and only
/// `dcss` installs a descriptor, so a tagged word always holds the address of a descriptor
/// that is live (INV-CAS-1), with the provenance of its allocation.
#[derive(Debug)]
pub(crate) struct Word(AtomicPtr<()>);

impl Word {
    /// A word holding `raw`.
    pub(crate) fn new(raw: Raw) -> Word {
        Word(AtomicPtr::new(raw.0))
    }

    /// The word's value, completing any swap found in progress.
    pub(crate) fn load(&self, clock: Clock<'_>, guard: &reclaim::Guard) -> Raw {
        loop {
            // ORDERING: SeqCst, as in `dcss`.
            let found = self.0.load(Ordering::SeqCst);
            if found.addr() & DESCRIPTOR == 0 {
                return Raw(found);
            }
            help(self, found, clock, guard);
        }
    }

    /// Replaces `current` with `new` without verifying the epoch, for steps that are not
    /// linearization points (unlinking, marking, moving a lagging tail). Fails if the word
    /// holds anything else, a swap in progress included.
    pub(crate) fn swap_unverified(&self, current: Raw, new: Raw) -> bool {
        // ORDERING: SeqCst, as every access to DCSS words (INV-CAS-1).
        self.0
            .compare_exchange(current.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The word's value, for a caller no other thread can race (recovery's bulk load, or
    /// `Drop`): no swap can be in progress.
    pub(crate) fn load_exclusive(&self) -> Raw {
        // ORDERING: no other thread can reach the word.
        let found = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(found.addr() & DESCRIPTOR, 0);
        Raw(found)
    }

    /// Stores `raw`, for a caller no other thread can race (recovery's bulk load).
    pub(crate) fn store_exclusive(&self, raw: Raw) {
        // ORDERING: no other thread can reach the word.
        self.0.store(raw.0, Ordering::Relaxed);
    }
}

/// What a DCSS compares its epoch against: one heap's clock.
#[derive(Clone, Copy)]
pub(crate) struct Clock<'a> {
    pub(crate) tracker: &'a Tracker,
    pub(crate) instance: u64,
}

impl Clock<'_> {
    pub(crate) fn of<'a>(op: &'a OpGuard<'_>) -> Clock<'a> {
        let epochs = &op.runtime().epochs;
        Clock {
            tracker: epochs.tracker(),
            instance: epochs.instance(),
        }
    }
}

/// A DRAM word whose compare-and-swap is verified against the epoch clock (module docs).
///
/// All accesses take the operation they belong to: a reader that meets a swap in progress
/// completes it, which needs the clock. A `VerifiedAtomic` serves the operations of one heap.
pub struct VerifiedAtomic<T: CasWord> {
    word: Word,
    _value: PhantomData<T>,
}

impl<T: CasWord> VerifiedAtomic<T> {
    /// A word holding `value`.
    ///
    /// # Panics
    ///
    /// If `value` cannot be encoded (a `u64` or `usize` of 2^63 or more).
    pub fn new(value: T) -> VerifiedAtomic<T> {
        VerifiedAtomic {
            word: Word::new(encode(value)),
            _value: PhantomData,
        }
    }

    /// The current value, as of a point inside this call.
    ///
    /// # Panics
    ///
    /// If the word is shared with operations of another heap (a misuse).
    pub fn load(&self, op: &OpGuard<'_>) -> T {
        self.load_unpinned(Clock::of(op))
    }

    /// [`load`](Self::load) for a caller that is already pinned (the lock-free indexes).
    pub(crate) fn load_in(&self, clock: Clock<'_>, guard: &reclaim::Guard) -> T {
        decode(self.word.load(clock, guard))
    }

    /// [`load`](Self::load) that pins the thread only if it finds a swap in progress (whose
    /// descriptor it must then read): the same value, without the pin's fence when no swap
    /// is in the word, as is almost always the case.
    #[inline]
    pub(crate) fn load_unpinned(&self, clock: Clock<'_>) -> T {
        // ORDERING: SeqCst, as in `Word::load`, which returns the first value it reads that
        // is no descriptor, as this does.
        let found = self.word.0.load(Ordering::SeqCst);
        if found.addr() & DESCRIPTOR == 0 {
            return decode(Raw(found));
        }
        self.load_in(clock, &reclaim::pin())
    }

    /// Replaces `current` with `new` if the word holds `current` and the epoch clock still
    /// reads `op`'s epoch, both at one instant; returns the value replaced.
    ///
    /// # Errors
    ///
    /// [`CasErrorKind::Mismatch`] with the value found; [`CasErrorKind::EpochAdvanced`] when
    /// the clock has moved on (the operation must be retried in a new one).
    ///
    /// # Panics
    ///
    /// If `new` cannot be encoded, or the word is shared with operations of another heap.
    pub fn compare_exchange(&self, op: &OpGuard<'_>, current: T, new: T) -> Result<T, CasError<T>> {
        let (expected, new) = (encode(current), encode(new));
        // INV-CAS-1 through INV-EP-4: the swap runs only if no advance past the operation's
        // epoch has begun, and the next publish waits until it is done, so the clock reads
        // the operation's epoch at the swap. Nobody else has to complete such a swap, so a
        // value word never holds a descriptor.
        // ORDERING: SeqCst, as every access to DCSS words (INV-CAS-1).
        let swapped = op.verified(|| {
            self.word
                .0
                .compare_exchange(expected.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
        });
        match swapped {
            Some(Ok(_)) => Ok(current),
            Some(Err(found)) => {
                debug_assert_eq!(found.addr() & DESCRIPTOR, 0, "a value word never holds one");
                Err(CasError {
                    current: decode(Raw(found)),
                    kind: CasErrorKind::Mismatch,
                })
            }
            // `verified` refuses only once the clock has moved past the operation's epoch.
            None => Err(CasError {
                current: self.load(op),
                kind: CasErrorKind::EpochAdvanced,
            }),
        }
    }

    /// The value, given exclusive access (no swap can be in progress).
    pub fn into_inner(self) -> T {
        decode(self.word.load_exclusive())
    }
}

impl<T: CasWord + std::fmt::Debug> std::fmt::Debug for VerifiedAtomic<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // ORDERING: a diagnostic snapshot.
        let found = self.word.0.load(Ordering::Relaxed);
        let mut d = f.debug_struct("VerifiedAtomic");
        if found.addr() & DESCRIPTOR == 0 {
            d.field("value", &decode::<T>(Raw(found)));
        } else {
            d.field("value", &"<swap in progress>");
        }
        d.finish()
    }
}

fn encode<T: CasWord>(value: T) -> Raw {
    Raw::value(value.to_raw())
}

fn decode<T: CasWord>(raw: Raw) -> T {
    T::from_raw(raw.to_value())
}

/// The DCSS (module docs): `Ok(expected)` on success, else the raw value found and why.
pub(crate) fn dcss(
    word: &Word,
    clock: Clock<'_>,
    epoch: Epoch,
    expected: Raw,
    new: Raw,
) -> Result<Raw, (Raw, CasErrorKind)> {
    let guard = reclaim::pin();
    if clock.tracker.current() != epoch {
        return Err((word.load(clock, &guard), CasErrorKind::EpochAdvanced));
    }
    let descriptor = Box::new(Descriptor {
        instance: clock.instance,
        epoch,
        expected,
        new,
        status: AtomicU32::new(UNDECIDED),
    });
    let descriptor = NonNull::from(Box::leak(descriptor));
    // The descriptor's own pointer, tagged: its provenance goes into the word with it.
    let tagged = descriptor
        .as_ptr()
        .cast::<()>()
        .map_addr(|addr| addr | DESCRIPTOR);
    loop {
        // ORDERING: SeqCst: the DCSS needs one total order of the word swaps, the status
        // decisions and the clock reads (INV-CAS-1).
        match word
            .0
            .compare_exchange(expected.0, tagged, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => break,
            Err(found) if found.addr() & DESCRIPTOR != 0 => help(word, found, clock, &guard),
            Err(found) => {
                // SAFETY: `descriptor` came from `Box::leak` above and was never stored in
                // the word, so nobody else can reach it and it is freed exactly once.
                drop(unsafe { Box::from_raw(descriptor.as_ptr()) });
                return Err((Raw(found), CasErrorKind::Mismatch));
            }
        }
    }
    // SAFETY: the owner holds the only reference that frees the descriptor (`retire` below),
    // so it is live here.
    let succeeded = complete(word, unsafe { descriptor.as_ref() }, tagged, clock);
    // The word no longer holds the descriptor (`complete` swapped it out, or a helper did),
    // so only threads pinned before now can still reach it.
    reclaim::retire(descriptor, &guard);
    if succeeded {
        Ok(expected)
    } else {
        Err((expected, CasErrorKind::EpochAdvanced))
    }
}

/// Publishes `node`, a value leaked from a `Box` and never shared, by swapping `new` (its
/// encoding) into `word` in place of `expected`, verified against `epoch` (INV-CAS-1):
/// `Ok(true)` if it is linked, `Ok(false)` (node freed) if `word` held something else.
///
/// # Errors
///
/// [`Error::Aborted`](crate::Error::Aborted) (node freed) if the clock moved past `epoch`.
///
/// # Safety
///
/// `node` came from `Box::leak`, no other thread can reach it, and `new` encodes it.
pub(crate) unsafe fn publish_node<T>(
    word: &Word,
    clock: Clock<'_>,
    epoch: Epoch,
    expected: Raw,
    new: Raw,
    node: NonNull<T>,
) -> crate::error::Result<bool> {
    match dcss(word, clock, epoch, expected, new) {
        Ok(_) => Ok(true),
        Err((_, kind)) => {
            // SAFETY: by the contract, `node` came from `Box::leak` and no other thread can
            // reach it; the swap that would have published it failed.
            drop(unsafe { Box::from_raw(node.as_ptr()) });
            if kind == CasErrorKind::EpochAdvanced {
                Err(crate::error::Error::Aborted)
            } else {
                Ok(false)
            }
        }
    }
}

/// Frees a chain of nodes leaked from `Box`es, starting at the link `first` (a null link
/// ends it); `next` gives a node's link to its successor.
///
/// # Safety
///
/// The caller has exclusive access to the chain (no other thread can reach any of its
/// nodes), and every node in it came from `Box::leak`, is linked by the pointer it was
/// leaked as, and is freed nowhere else.
pub(crate) unsafe fn free_chain<T>(first: Raw, next: impl Fn(&T) -> Raw) {
    let mut link = first;
    while let Some(ptr) = NonNull::new(link.node::<T>()) {
        // SAFETY: by the contract, the node came from `Box::leak`, `ptr` carries that
        // allocation's provenance, nobody else can reach it, and it is freed only here.
        let boxed = unsafe { Box::from_raw(ptr.as_ptr()) };
        link = next(&boxed);
    }
}

/// Completes the swap whose tagged descriptor pointer `tagged` was read from `word`.
fn help(word: &Word, tagged: *mut (), clock: Clock<'_>, _guard: &reclaim::Guard) {
    let ptr = tagged
        .map_addr(|addr| addr & !DESCRIPTOR)
        .cast::<Descriptor>();
    // SAFETY:
    // - `tagged` was read from a word, and only `dcss` stores a tagged pointer into one: the
    //   pointer of a live `Box<Descriptor>`, with its provenance, tag bit set (cleared here);
    // - it is still allocated: it was in the word after this thread pinned `_guard`, and a
    //   descriptor is retired only after leaving the word, then freed only once every
    //   thread pinned before the retirement has unpinned (crossbeam-epoch's guarantee);
    //   under loom descriptors are never freed;
    // - only shared references to a descriptor are ever formed, and its mutable state is
    //   atomic.
    let descriptor = unsafe { &*ptr };
    assert_eq!(
        descriptor.instance, clock.instance,
        "a VerifiedAtomic was used by operations of two different heaps"
    );
    complete(word, descriptor, tagged, clock);
}

/// Decides the descriptor (if nobody has) and swaps it out of the word; true if it succeeded.
fn complete(word: &Word, descriptor: &Descriptor, tagged: *mut (), clock: Clock<'_>) -> bool {
    // ORDERING: store-load: the descriptor's installation (which this thread performed or
    // read) is ordered before the clock read, pairing with the fence in `Tracker::publish`
    // after the clock store (a Dekker pattern, as in the tracker's handshake). Either this
    // read sees the new epoch, or the publisher's later reads of the word see the
    // descriptor and complete it with the same decision. The fence makes this hold in
    // models, like loom's, that treat SeqCst accesses as acquire/release.
    fence(Ordering::SeqCst);
    let decision = if clock.tracker.current() == descriptor.epoch {
        SUCCEEDED
    } else {
        FAILED
    };
    // ORDERING: SeqCst, as in `dcss`; the first transition decides.
    let _ =
        descriptor
            .status
            .compare_exchange(UNDECIDED, decision, Ordering::SeqCst, Ordering::SeqCst);
    // ORDERING: SeqCst, as in `dcss`.
    let succeeded = descriptor.status.load(Ordering::SeqCst) == SUCCEEDED;
    let value = if succeeded {
        descriptor.new
    } else {
        descriptor.expected
    };
    // ORDERING: SeqCst, as in `dcss`. Failing means someone else already swapped it out.
    let _ = word
        .0
        .compare_exchange(tagged, value.0, Ordering::SeqCst, Ordering::SeqCst);
    succeeded
}

#[cfg(not(montage_loom))]
pub(crate) mod reclaim {
    use std::ptr::NonNull;

    pub(crate) use crossbeam_epoch::Guard;

    pub(crate) fn pin() -> Guard {
        crossbeam_epoch::pin()
    }

    /// Frees `descriptor` once no pinned thread can still reach it.
    pub(super) fn retire(descriptor: NonNull<super::Descriptor>, guard: &Guard) {
        // SAFETY: the owner retires its descriptor once, after `complete` swapped it out of
        // the word (INV-CAS-1); it came from `Box::leak` in `dcss`.
        unsafe { retire_box(descriptor, guard) };
    }

    /// Frees the `Box` at `ptr` once every thread pinned now has unpinned.
    ///
    /// # Safety
    ///
    /// `ptr` came from `Box::leak` (with its provenance), is retired once, and is no longer
    /// reachable from any shared word, so that only threads pinned now can still hold it.
    pub(crate) unsafe fn retire_box<T: Send>(ptr: NonNull<T>, guard: &Guard) {
        let ptr = ptr.as_ptr();
        let free = move || {
            // SAFETY:
            // - `ptr` came from `Box::leak` and is retired exactly once, after no shared word
            //   holds it any more (this function's contract);
            // - so only threads pinned before the retirement can hold it, and this runs after
            //   all of them have unpinned.
            drop(unsafe { Box::from_raw(ptr) });
        };
        // SAFETY: `defer_unchecked` runs `free` on some thread once every thread pinned now
        // has unpinned; `free` only frees an allocation (no thread-bound state, nothing
        // borrowed), which any thread may do at that point.
        unsafe { guard.defer_unchecked(free) };
    }
}

#[cfg(montage_loom)]
pub(crate) mod reclaim {
    use std::ptr::NonNull;

    /// Nothing to pin: descriptors and nodes are leaked under loom.
    pub(crate) struct Guard;

    pub(crate) fn pin() -> Guard {
        Guard
    }

    pub(super) fn retire(_descriptor: NonNull<super::Descriptor>, _guard: &Guard) {}

    /// Leaks (loom explores bounded executions).
    ///
    /// # Safety
    ///
    /// None needed; the signature matches the real one.
    pub(crate) unsafe fn retire_box<T: Send>(_ptr: NonNull<T>, _guard: &Guard) {}
}

#[cfg(all(test, montage_loom))]
mod loom_tests {
    use super::*;
    use crate::epoch::tracker::Slots;
    use loom::sync::Arc;

    const INSTANCE: u64 = 1;

    /// Slots whose clock reads 1, and their publisher.
    type TestSlots = Slots<(), ()>;

    fn clock(slots: &TestSlots) -> Clock<'_> {
        Clock {
            tracker: slots.tracker(),
            instance: INSTANCE,
        }
    }

    /// A swap of epoch 1 races with the publish of epoch 2 and a read after it: if the swap
    /// succeeded, the read (an operation of epoch 2) sees it; if it failed, nobody ever sees
    /// the new value.
    #[test]
    fn a_swap_never_succeeds_after_the_epoch_moved() {
        loom::model(|| {
            let (tracker, mut publisher) = TestSlots::new(Epoch::new(1), 1);
            let tracker = Arc::new(tracker);
            let word = Arc::new(Word::new(encode(0u32)));
            let owner = {
                let (tracker, word) = (tracker.clone(), word.clone());
                loom::thread::spawn(move || {
                    dcss(
                        &word,
                        clock(&tracker),
                        Epoch::new(1),
                        encode(0u32),
                        encode(1u32),
                    )
                    .is_ok()
                })
            };
            tracker.publish(&mut publisher, Epoch::new(2));
            let seen: u32 = decode(word.load(clock(&tracker), &reclaim::pin()));
            let succeeded = owner.join().unwrap();
            if succeeded {
                assert_eq!(
                    seen, 1,
                    "a successful swap of epoch 1 was not visible in epoch 2"
                );
            } else {
                assert_eq!(seen, 0);
                let last: u32 = decode(word.load(clock(&tracker), &reclaim::pin()));
                assert_eq!(last, 0, "a failed swap left its value behind");
            }
        });
    }

    /// Two swaps from the same value in the same epoch, and a reader that helps: exactly one
    /// swap succeeds, the word ends with its value, and the other reports the value it found.
    #[test]
    fn competing_swaps_lose_no_value() {
        loom::model(|| {
            let (tracker, _publisher) = TestSlots::new(Epoch::new(1), 2);
            let tracker = Arc::new(tracker);
            let word = Arc::new(Word::new(encode(0u32)));
            let swappers: Vec<_> = [1u32, 2]
                .into_iter()
                .map(|new| {
                    let (tracker, word) = (tracker.clone(), word.clone());
                    loom::thread::spawn(move || {
                        dcss(
                            &word,
                            clock(&tracker),
                            Epoch::new(1),
                            encode(0u32),
                            encode(new),
                        )
                        .map(decode::<u32>)
                        .map_err(|(raw, kind)| (decode::<u32>(raw), kind))
                    })
                })
                .collect();
            let read: u32 = decode(word.load(clock(&tracker), &reclaim::pin()));
            assert!(read <= 2);
            let results: Vec<_> = swappers.into_iter().map(|t| t.join().unwrap()).collect();
            let winners: Vec<u32> = results
                .iter()
                .zip([1u32, 2])
                .filter(|(r, _)| r.is_ok())
                .map(|(_, new)| new)
                .collect();
            assert_eq!(winners.len(), 1, "{results:?}");
            let last: u32 = decode(word.load(clock(&tracker), &reclaim::pin()));
            assert_eq!(last, winners[0]);
            for result in &results {
                if let Err((found, kind)) = result {
                    assert_eq!(*kind, CasErrorKind::Mismatch);
                    assert_eq!(*found, winners[0]);
                }
            }
        });
    }
}
