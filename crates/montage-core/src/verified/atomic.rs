//! The epoch-verified compare-and-swap for DRAM words.
//!
//! A nonblocking structure links its DRAM index with verified words. A swap succeeds only
//! if the word holds the expected value *and* the epoch clock still reads the calling
//! operation's epoch. Without that an operation of epoch `e` could make its change after
//! operations of `e + 1` had already acted on the old value, and recovery to the end of `e`
//! would keep the later change but not the earlier one (INV-CAS-1).
//!
//! # The double-compare single-swap
//!
//! Every verified swap of a word ([`VerifiedAtomic::compare_exchange`], the list's new
//! links, the queue's head) is a DCSS (Harris, Fraser and Pratt, "A practical multi-word
//! compare-and-swap operation", 2002) whose second compare is against the clock:
//!
//! 1. The owner writes the swap into its descriptor (`epoch`, `expected`, `new`, and a
//!    status that starts undecided) and swaps a tag naming the descriptor into the word in
//!    place of `expected` (low bit 1; values are stored shifted left by one, so their low
//!    bit is 0).
//! 2. Anyone who finds a tag in the word (the owner, a competing swap, a reader) completes
//!    the swap: reads the clock, tries to move the status from undecided to succeeded (the
//!    clock reads the swap's epoch) or failed (it does not), and swaps the word from the tag
//!    to `new` or back to `expected` as the status says.
//! 3. The first status transition decides; the swap linearizes at the clock read that
//!    preceded it, when the clock read the operation's epoch. Nobody returns a value while a
//!    swap is undecided, so no access can be ordered between that read and the decision.
//!
//! No thread ever waits for another: a thread stalled anywhere in a swap holds nobody
//! back, since whoever meets its tag finishes the swap for it. The structures built on it
//! are lock-free.
//!
//! # Descriptors that are reused, not allocated
//!
//! A descriptor is not allocated per swap. Each thread has one (`descriptor.rs`), reused
//! by every swap it makes, since it makes one at a time (Arbel-Raviv and Brown, "Reuse,
//! don't recycle", 2017). A swap has a sequence number, the descriptor's previous one plus
//! one, and the tag carries the owner's thread id and the sequence number; the status word
//! carries the sequence number beside the state. Before the owner overwrites the fields for
//! a new swap it moves the status to the new number, so a helper that read the fields of
//! an older swap finds the number changed when it checks the status afterwards (a sequence
//! lock) and lets the swap be: it is over, and its tag has left the word. Every transition
//! of the status names the sequence number it expects, so no helper can decide a later
//! swap with an older one's fields. Nothing is freed, so nothing needs to be reclaimed, and
//! no descriptor is ever read after it is gone.
//!
//! An operation of a thread without a descriptor (one in thread teardown, whose id is
//! gone, or one whose id is beyond what a tag can name) swaps inside the clock's verify
//! handshake instead (`OpGuard::verified`, INV-EP-4), which holds the next publish back
//! while the swap runs: correct as well, but a thread stalled inside it delays the clock.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::base::epoch::Epoch;
use crate::epoch::op::OpGuard;
use crate::epoch::tracker::Tracker;
use crate::primitive::{AtomicPtr, Ordering, after_seqcst_access};
use crate::verified::descriptor::{self, Descriptor, Descriptors, SEQ_MASK, Swap, THREAD_BITS};

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

/// The low bit that marks a tag.
const DESCRIPTOR: usize = 1;
/// The thread id in a tag, above the tag bit ([`THREAD_BITS`] of them); the sequence number
/// is above it.
const THREAD_MASK: usize = (1 << THREAD_BITS) - 1;

/// What a word holds while a swap is in progress: the owner's thread id and the swap's
/// sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tag {
    thread: usize,
    seq: u64,
}

impl Tag {
    /// The word's content for this tag (an integer: it points at nothing).
    fn encode(self) -> *mut () {
        debug_assert!(self.seq <= SEQ_MASK);
        let seq = usize::try_from(self.seq).expect("words are 64 bits");
        std::ptr::without_provenance_mut(
            (seq << (THREAD_BITS + 1)) | (self.thread << 1) | DESCRIPTOR,
        )
    }

    /// The tag in a word's content, if it holds one.
    fn decode(found: *mut ()) -> Option<Tag> {
        let raw = found.addr();
        (raw & DESCRIPTOR != 0).then(|| Tag {
            thread: (raw >> 1) & THREAD_MASK,
            seq: (raw >> (THREAD_BITS + 1)) as u64,
        })
    }
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

/// A verified word: a DRAM word that holds a [`Raw`], or, while a swap is in progress, a
/// [`Tag`]. Only this module can store into it, and only a swap installs a tag (module
/// docs).
#[derive(Debug)]
pub(crate) struct Word(AtomicPtr<()>);

impl Word {
    /// A word holding `raw`.
    pub(crate) fn new(raw: Raw) -> Word {
        Word(AtomicPtr::new(raw.0))
    }

    /// The word's value, completing any swap found in progress.
    #[inline]
    pub(crate) fn load(&self, clock: Clock<'_>) -> Raw {
        loop {
            // ORDERING: SeqCst: the swaps need one total order of the word accesses, the
            // status decisions and the clock reads (INV-CAS-1).
            let found = self.0.load(Ordering::SeqCst);
            match Tag::decode(found) {
                None => return Raw(found),
                Some(tag) => help(self, tag, clock),
            }
        }
    }

    /// The word's value, or `None` while a swap is in progress: a read for a caller outside
    /// any operation, which has no clock to decide the swap with and must not wait for it.
    /// A value returned is one the word held at this load, outside every swap: a decided
    /// one, never the new value of a swap that may still fail.
    #[inline]
    pub(crate) fn peek(&self) -> Option<Raw> {
        // ORDERING: SeqCst, as every access to verified words (INV-CAS-1); it also acquires
        // what the swap that stored the value published (a node, a payload).
        let found = self.0.load(Ordering::SeqCst);
        Tag::decode(found).is_none().then_some(Raw(found))
    }

    /// Replaces `current` with `new` without verifying the epoch, for steps that are not
    /// linearization points (unlinking, marking, moving a lagging tail). Fails if the word
    /// holds anything else, a swap in progress included.
    pub(crate) fn swap_unverified(&self, current: Raw, new: Raw) -> bool {
        // ORDERING: SeqCst, as every access to verified words (INV-CAS-1).
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

/// What a swap compares its epoch against (one heap's clock, and the heap's instance
/// number), and where it finds the descriptors of the tags it meets.
#[derive(Clone, Copy)]
pub(crate) struct Clock<'a> {
    pub(crate) tracker: &'a Tracker,
    pub(crate) instance: u64,
    pub(crate) descriptors: &'a Descriptors,
}

impl Clock<'_> {
    pub(crate) fn of<'a>(op: &'a OpGuard<'_>) -> Clock<'a> {
        let epochs = &op.runtime().epochs;
        Clock {
            tracker: epochs.tracker(),
            instance: epochs.instance(),
            descriptors: descriptor::process(),
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
        self.load_in(Clock::of(op))
    }

    /// The current value, or `None` while a swap of the word is in progress, for a caller
    /// outside any operation (see `Word::peek`).
    #[inline]
    pub(crate) fn peek(&self) -> Option<T> {
        self.word.peek().map(decode)
    }

    /// [`load`](Self::load) for a caller that has the clock at hand.
    #[inline]
    pub(crate) fn load_in(&self, clock: Clock<'_>) -> T {
        decode(self.word.load(clock))
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
        match dcss(&self.word, op, encode(current), encode(new)) {
            Ok(()) => Ok(current),
            Err((found, kind)) => Err(CasError {
                current: decode(found),
                kind,
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

/// The verified swap (module docs) of `word` from `expected` to `new` in `op`'s epoch:
/// `Ok` on success, else the value found and why not.
pub(crate) fn dcss(
    word: &Word,
    op: &OpGuard<'_>,
    expected: Raw,
    new: Raw,
) -> Result<(), (Raw, CasErrorKind)> {
    let clock = Clock::of(op);
    // The id is held while the operation runs, so the descriptor is this thread's alone.
    let mine = op
        .thread_id()
        .and_then(|thread| Some((thread, clock.descriptors.own(thread)?)));
    match mine {
        Some((thread, descriptor)) => {
            let owner = Owner { thread, descriptor };
            dcss_as(word, owner, clock, op.epoch(), expected, new)
        }
        None => swap_in_handshake(word, clock, expected, new, |attempt| op.verified(attempt)),
    }
}

/// The descriptor a swap uses, the calling thread's, and the thread's id.
#[derive(Clone, Copy)]
struct Owner<'a> {
    thread: usize,
    descriptor: &'a Descriptor,
}

/// [`dcss`] by the owner of a descriptor, for an operation of `epoch`.
fn dcss_as(
    word: &Word,
    owner: Owner<'_>,
    clock: Clock<'_>,
    epoch: Epoch,
    expected: Raw,
    new: Raw,
) -> Result<(), (Raw, CasErrorKind)> {
    let Owner { thread, descriptor } = owner;
    if clock.tracker.current() != epoch {
        return Err((word.load(clock), CasErrorKind::EpochAdvanced));
    }
    let swap = Swap {
        heap: clock.instance,
        epoch,
        expected: expected.0,
        new: new.0,
    };
    let seq = descriptor.begin(swap);
    let tag = Tag { thread, seq };
    loop {
        // ORDERING: SeqCst, as every access to verified words (INV-CAS-1).
        match word
            .0
            .compare_exchange(expected.0, tag.encode(), Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => break,
            Err(found) => match Tag::decode(found) {
                Some(other) => help(word, other, clock),
                None => return Err((Raw(found), CasErrorKind::Mismatch)),
            },
        }
    }
    match complete(word, descriptor, tag, swap, clock) {
        Some(true) => Ok(()),
        Some(false) => Err((expected, CasErrorKind::EpochAdvanced)),
        None => unreachable!("only the owner moves its descriptor to a new swap"),
    }
}

/// One compare-and-swap of a word's content: the content replaced, or the one found.
type Attempt = Result<*mut (), *mut ()>;

/// The swap of an operation without a descriptor (module docs): a plain
/// compare-and-swap inside the clock's verify handshake (module docs), which `verified`
/// runs (`OpGuard::verified`: `None` once the clock has moved past the operation's epoch).
#[cold]
fn swap_in_handshake(
    word: &Word,
    clock: Clock<'_>,
    expected: Raw,
    new: Raw,
    verified: impl Fn(&dyn Fn() -> Attempt) -> Option<Attempt>,
) -> Result<(), (Raw, CasErrorKind)> {
    loop {
        // INV-CAS-1 through INV-EP-4: the swap runs only if no advance past the operation's
        // epoch has begun, and the next publish waits until it is done, so the clock reads
        // the operation's epoch at the swap.
        // ORDERING: SeqCst, as every access to verified words (INV-CAS-1).
        let swapped = verified(&|| {
            word.0
                .compare_exchange(expected.0, new.0, Ordering::SeqCst, Ordering::SeqCst)
        });
        match swapped {
            Some(Ok(_)) => return Ok(()),
            Some(Err(found)) => match Tag::decode(found) {
                // Another thread's swap: complete it, outside the handshake, and retry.
                Some(tag) => help(word, tag, clock),
                None => return Err((Raw(found), CasErrorKind::Mismatch)),
            },
            // `verified` refuses only once the clock has moved past the operation's epoch.
            None => return Err((word.load(clock), CasErrorKind::EpochAdvanced)),
        }
    }
}

/// Publishes `node`, a value leaked from a `Box` and never shared, by swapping `new` (its
/// encoding) into `word` in place of `expected`, verified against `op`'s epoch
/// (INV-CAS-1): `Ok(true)` if it is linked, `Ok(false)` (node freed) if `word` held
/// something else.
///
/// # Errors
///
/// [`Error::Aborted`](crate::Error::Aborted) (node freed) if the clock moved past the
/// operation's epoch.
///
/// # Safety
///
/// `node` came from `Box::leak`, no other thread can reach it, and `new` encodes it.
pub(crate) unsafe fn publish_node<T>(
    word: &Word,
    op: &OpGuard<'_>,
    expected: Raw,
    new: Raw,
    node: NonNull<T>,
) -> crate::error::Result<bool> {
    match dcss(word, op, expected, new) {
        Ok(()) => Ok(true),
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

/// Completes the swap whose tag `tag` was read from `word`, unless it is over.
#[cold]
fn help(word: &Word, tag: Tag, clock: Clock<'_>) {
    let descriptor = clock
        .descriptors
        .find(tag.thread)
        .expect("a tag names the descriptor of the swap that installed it");
    let Some(swap) = descriptor.read(tag.seq) else {
        // The owner has begun a later swap, so this one is over and its tag is gone.
        return;
    };
    // The swap must be decided against its own heap's clock, which this thread has not.
    assert_eq!(
        swap.heap, clock.instance,
        "a verified word was used by operations of two different heaps"
    );
    complete(word, descriptor, tag, swap, clock);
}

/// Decides `swap`, whose tag is `tag` (if nobody has), and swaps the tag out of the word:
/// whether it succeeded, or `None` if the swap turned out to be over (its owner has begun
/// another).
fn complete(
    word: &Word,
    descriptor: &Descriptor,
    tag: Tag,
    swap: Swap,
    clock: Clock<'_>,
) -> Option<bool> {
    // ORDERING: the tag's installation (which this thread performed, or read) precedes the
    // clock read in the single total order of SeqCst accesses, as the publish precedes every
    // later check of the word by an operation of the next epoch: either this read sees the
    // new epoch, or that check sees the tag and completes it with the same decision.
    after_seqcst_access();
    let succeeded = descriptor.decide(tag.seq, clock.tracker.current() == swap.epoch)?;
    let value = if succeeded { swap.new } else { swap.expected };
    // ORDERING: SeqCst, as every access to verified words. Failing means someone else
    // already swapped it out.
    let _ = word
        .0
        .compare_exchange(tag.encode(), value, Ordering::SeqCst, Ordering::SeqCst);
    Some(succeeded)
}

/// Deferred freeing of the list's nodes: through crossbeam-epoch (the queue reuses its nodes
/// through the thread slots, `epoch/nodes.rs`).
#[cfg(not(montage_loom))]
pub(crate) mod reclaim {
    use std::ptr::NonNull;

    pub(crate) use crossbeam_epoch::Guard;

    pub(crate) fn pin() -> Guard {
        crossbeam_epoch::pin()
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

/// Deferred freeing of the list's nodes: none, under loom.
#[cfg(montage_loom)]
pub(crate) mod reclaim {
    use std::ptr::NonNull;

    /// Nothing to pin: nodes are leaked under loom.
    pub(crate) struct Guard;

    pub(crate) fn pin() -> Guard {
        Guard
    }

    /// Leaks (loom explores bounded executions).
    ///
    /// # Safety
    ///
    /// None needed; the signature matches the real one.
    pub(crate) unsafe fn retire_box<T: Send>(_ptr: NonNull<T>, _guard: &Guard) {}
}

#[cfg(all(test, not(montage_loom)))]
mod tests {
    use super::*;
    use crate::{Heap, HeapConfig};

    /// A word that one heap's operation is swapping, met by an operation of another heap:
    /// the reader stops with the misuse named instead of completing the swap against its
    /// own clock (where it could write the other heap's values into the word).
    #[test]
    fn a_word_shared_by_two_heaps_is_refused() {
        let first = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let second = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let word = VerifiedAtomic::new(0u32);
        // The first heap's swap, stopped after it installed its tag (as a thread stalled
        // there would leave it): its descriptor filled in, the tag in the word.
        let op = first.begin_op().unwrap();
        let clock = Clock::of(&op);
        let thread = op.thread_id().unwrap();
        let descriptor = clock.descriptors.own(thread).unwrap();
        let seq = descriptor.begin(Swap {
            heap: clock.instance,
            epoch: op.epoch(),
            expected: encode(0u32).0,
            new: encode(1u32).0,
        });
        word.word
            .0
            .store(Tag { thread, seq }.encode(), Ordering::SeqCst);
        drop(op);
        // Another thread, in an operation of the second heap.
        let read = std::thread::scope(|s| s.spawn(|| second.run_op(|op| Ok(word.load(op)))).join());
        let panic = read.expect_err("a reader completed another heap's swap");
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        assert!(
            message.contains("a verified word was used by operations of two different heaps"),
            "the reader stopped for another reason: {message}"
        );
    }
}

#[cfg(all(test, montage_loom))]
mod loom_tests {
    use super::*;
    use crate::epoch::tracker::{Publisher, Slots};
    use crate::thread_id::Held;
    use loom::sync::Arc;

    /// A heap's slots, whose clock reads 1, and a table of descriptors, for one execution.
    struct Env {
        slots: Slots<(), ()>,
        descriptors: Descriptors,
    }

    impl Env {
        /// The slots with `own` owned slots, a table whose descriptors for the first ids
        /// exist already (loom does not see into the table's `OnceLock`), and the
        /// publisher.
        fn new(own: usize) -> (Arc<Env>, Publisher) {
            let (slots, publisher) = Slots::new(Epoch::new(1), own);
            let descriptors = Descriptors::new();
            assert!(descriptors.own(0).is_some());
            (Arc::new(Env { slots, descriptors }), publisher)
        }

        /// [`swap`](Self::swap) on a thread of its own.
        fn spawn_swap(
            env: &Arc<Env>,
            thread: usize,
            word: &Arc<Word>,
            from: u32,
            to: u32,
        ) -> loom::thread::JoinHandle<Result<(), (u32, CasErrorKind)>> {
            let (env, word) = (env.clone(), word.clone());
            loom::thread::spawn(move || env.swap(thread, &word, from, to))
        }

        fn clock(&self) -> Clock<'_> {
            Clock {
                tracker: self.slots.tracker(),
                instance: 1,
                descriptors: &self.descriptors,
            }
        }

        /// A swap of epoch 1 by the thread whose id is `thread`.
        fn swap(
            &self,
            thread: usize,
            word: &Word,
            from: u32,
            to: u32,
        ) -> Result<(), (u32, CasErrorKind)> {
            let owner = Owner {
                thread,
                descriptor: self.descriptors.find(thread).unwrap(),
            };
            dcss_as(
                word,
                owner,
                self.clock(),
                Epoch::new(1),
                encode(from),
                encode(to),
            )
            .map_err(|(raw, kind)| (decode(raw), kind))
        }

        fn read(&self, word: &Word) -> u32 {
            decode(word.load(self.clock()))
        }
    }

    /// A swap of epoch 1 races with the publish of epoch 2 and a read after it: if the swap
    /// succeeded, the read (an operation of epoch 2) sees it; if it failed, nobody ever sees
    /// the new value.
    #[test]
    fn a_swap_never_succeeds_after_the_epoch_moved() {
        loom::model(|| {
            let (env, mut publisher) = Env::new(1);
            let word = Arc::new(Word::new(encode(0u32)));
            let owner = Env::spawn_swap(&env, 0, &word, 0, 1);
            env.slots.publish(&mut publisher, Epoch::new(2));
            let seen = env.read(&word);
            let succeeded = owner.join().unwrap().is_ok();
            if succeeded {
                assert_eq!(
                    seen, 1,
                    "a successful swap of epoch 1 was not visible in epoch 2"
                );
            } else {
                assert_eq!(seen, 0);
                assert_eq!(env.read(&word), 0, "a failed swap left its value behind");
            }
        });
    }

    /// A read outside any operation (`Word::peek`) races with a swap of epoch 1 and the
    /// publish of epoch 2: it answers only with a decided value, never with the new value of
    /// a swap that fails, and after it sees the new value every read does.
    #[test]
    fn a_read_outside_operations_sees_only_decided_values() {
        loom::model(|| {
            let (env, mut publisher) = Env::new(1);
            let word = Arc::new(Word::new(encode(0u32)));
            let owner = Env::spawn_swap(&env, 0, &word, 0, 1);
            let peeked = {
                let word = word.clone();
                loom::thread::spawn(move || {
                    let first = word.peek().map(decode::<u32>);
                    let second = word.peek().map(decode::<u32>);
                    (first, second)
                })
            };
            env.slots.publish(&mut publisher, Epoch::new(2));
            let succeeded = owner.join().unwrap().is_ok();
            let (first, second) = peeked.join().unwrap();
            for seen in [first, second].into_iter().flatten() {
                assert!(
                    seen == 0 || (seen == 1 && succeeded),
                    "read {seen} outside an operation; the swap succeeded: {succeeded}"
                );
            }
            if first == Some(1) {
                assert_eq!(second, Some(1), "a read outside went back");
            }
        });
    }

    /// Two swaps from the same value in the same epoch, and a reader that helps: exactly one
    /// swap succeeds, the word ends with its value, and the other reports the value it found.
    #[test]
    fn competing_swaps_lose_no_value() {
        loom::model(|| {
            let (env, _publisher) = Env::new(2);
            let word = Arc::new(Word::new(encode(0u32)));
            let swappers: Vec<_> = [1u32, 2]
                .into_iter()
                .map(|new| Env::spawn_swap(&env, new as usize - 1, &word, 0, new))
                .collect();
            assert!(env.read(&word) <= 2);
            let results: Vec<_> = swappers.into_iter().map(|t| t.join().unwrap()).collect();
            let winners: Vec<u32> = results
                .iter()
                .zip([1u32, 2])
                .filter(|(r, _)| r.is_ok())
                .map(|(_, new)| new)
                .collect();
            assert_eq!(winners.len(), 1, "{results:?}");
            assert_eq!(env.read(&word), winners[0]);
            for result in &results {
                if let Err((found, kind)) = result {
                    assert_eq!(*kind, CasErrorKind::Mismatch);
                    assert_eq!(*found, winners[0]);
                }
            }
        });
    }

    /// A swap with a descriptor races with one through the handshake (an operation of a
    /// thread without a descriptor) and with a publish: at most one succeeds, a swap of
    /// epoch 1 only while the clock still read 1, the word ends with the winner's value, and
    /// a loser that found a value reports the winner's.
    #[test]
    fn a_swap_with_a_descriptor_and_one_through_the_handshake_lose_no_value() {
        loom::model(|| {
            let (env, mut publisher) = Env::new(1);
            let word = Arc::new(Word::new(encode(0u32)));
            let owner = Env::spawn_swap(&env, 0, &word, 0, 1);
            let shared = {
                let (env, word) = (env.clone(), word.clone());
                loom::thread::spawn(move || {
                    // An operation (in a shared slot: thread id 1 is beyond the one owned
                    // slot) that swaps as a thread without a descriptor does.
                    let ann = env.slots.announce(Held::for_loom(1)).unwrap();
                    let result = swap_in_handshake(
                        &word,
                        env.clock(),
                        encode(0u32),
                        encode(2u32),
                        |attempt| ann.verify(attempt),
                    );
                    (
                        ann.epoch(),
                        result.map_err(|(raw, kind)| (decode::<u32>(raw), kind)),
                    )
                })
            };
            env.slots.publish(&mut publisher, Epoch::new(2));
            let seen = env.read(&word);
            let by_owner = owner.join().unwrap();
            let (epoch, by_shared) = shared.join().unwrap();
            let last = env.read(&word);
            assert!(
                !(by_owner.is_ok() && by_shared.is_ok()),
                "both swaps succeeded"
            );
            let winner = match (&by_owner, &by_shared) {
                (Ok(()), _) => 1,
                (_, Ok(())) => 2,
                _ => 0,
            };
            assert_eq!(last, winner);
            // A swap of epoch 1 that succeeded did so before epoch 2 began, so the read after
            // the publish sees it. (The shared slot's operation may have begun in epoch 2.)
            if by_owner.is_ok() || (by_shared.is_ok() && epoch == Epoch::new(1)) {
                assert_eq!(seen, winner, "a swap of epoch 1 landed after epoch 2 began");
            }
            for (result, own) in [(by_owner, 1), (by_shared, 2)] {
                if let Err((found, CasErrorKind::Mismatch)) = result {
                    assert_ne!(found, own);
                    assert_eq!(found, winner);
                }
            }
        });
    }

    /// The owner reuses its descriptor for a second swap of the same word while a helper
    /// may still be completing the first: the helper never finishes the second swap with
    /// the first one's fields (which would put 1 back where the second put 2).
    #[test]
    fn a_reused_descriptor_is_never_mistaken_for_an_earlier_swap() {
        loom::model(|| {
            let (env, _publisher) = Env::new(1);
            let word = Arc::new(Word::new(encode(0u32)));
            let helper = {
                let (env, word) = (env.clone(), word.clone());
                loom::thread::spawn(move || env.read(&word))
            };
            assert_eq!(env.swap(0, &word, 0, 1), Ok(()));
            assert_eq!(env.swap(0, &word, 1, 2), Ok(()));
            let seen = helper.join().unwrap();
            assert!(seen <= 2, "the helper read {seen}");
            assert_eq!(env.read(&word), 2, "the second swap was undone");
        });
    }
}
