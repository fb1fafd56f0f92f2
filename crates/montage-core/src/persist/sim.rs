//! The power-failure simulator: a persistence backend that sees every store into the heap and
//! can build any post-crash image the hardware model allows.
//!
//! # Model
//!
//! The heap's bytes (the *volatile image*) are what loads return. Beside them the simulator
//! keeps the *durable image* (what is guaranteed to survive) and, per persistence unit (a
//! 64-byte cache line, or a 512-byte sector in [`SimMode::File`]), the log of stores to that unit
//! that are not yet durable, in program order.
//!
//! * A store updates the volatile image and appends to its unit's log.
//! * A flush of a range records, on the calling thread's list, how long each unit's log is
//!   at that moment.
//! * A fence moves, for each entry on the calling thread's list, that much of the unit's log
//!   into the durable image. A fence orders only the calling thread's flushes, as `sfence`
//!   does. A successful compare-and-swap is logged like a store and is *not* a fence, so
//!   nothing can silently depend on x86's locked instructions ordering write-backs.
//! * [`Simulator::crash`] builds a post-crash image: the durable image plus, for each unit
//!   independently, a seeded random prefix of its log (biased so that "none" and "all" are
//!   common). Units are independent because the order of cache evictions is arbitrary;
//!   stores to one line stay in order because x86 keeps them in order.
//!
//! Modes change the last step: [`SimMode::WordTear`] lets each 8-byte word of a dirty line be
//! old or new independently (a stricter superset of the prefix rule), [`SimMode::Eadr`] keeps
//! one global store order, ignores flushes and treats a fence as draining the calling
//! thread's store buffer (everything up to its last store becomes durable).
//!
//! [`SimMode::File`] models an ordinary file with the journal backend: stores into the heap
//! are logged per 512-byte sector and become durable only when the heap file is synced (a
//! checkpoint); the journal file is a second image whose writes are logged per sector and
//! become durable at its `fdatasync`. A crash keeps, per sector of each file, a random
//! prefix of what was not synced: any early write-back of the mapping, torn at sectors.
//!
//! Every image the simulator holds (the durable image, the snapshot at a crash point, each
//! crash image) is kept as shared copy-on-write pages ([`Pages`]), so taking one costs a
//! vector of page pointers rather than a copy of the heap.
//!
//! A crash can also be taken *in the past*: [`Simulator::crash_at`] makes the simulator
//! snapshot its state just before the given persistence event, and `crash` then builds the
//! image from that snapshot while the workload runs on to its end.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use crate::base::epoch::Epoch;
use crate::base::region::Region;
use crate::config::SimMode;
use crate::error::Result;
use crate::persist::pages::Pages;

/// The most stores the eADR mode keeps undecided; older ones are folded into the durable
/// image, which only narrows the set of images a crash can produce; every one stays legal.
const EADR_WINDOW: usize = 1 << 20;

/// One logged store: bytes at a heap offset, all inside one unit.
#[derive(Debug, Clone)]
struct Store {
    offset: u64,
    bytes: StoreBytes,
}

#[derive(Debug, Clone)]
enum StoreBytes {
    Word(u64),
    Range(Box<[u8]>),
}

impl Store {
    /// Calls `f` with the stored bytes.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match &self.bytes {
            StoreBytes::Word(value) => f(&value.to_ne_bytes()),
            StoreBytes::Range(bytes) => f(bytes),
        }
    }

    /// Applies the store to `image`; a store past its end changes nothing.
    fn apply(&self, image: &mut Pages) {
        self.with_bytes(|bytes| image.write(self.offset as usize, bytes));
    }
}

/// Stores to one unit that are not yet durable; `applied` counts the earlier stores to the
/// unit that already are, so flush marks are absolute positions in the unit's history.
#[derive(Debug, Clone, Default)]
struct UnitLog {
    applied: u64,
    pending: VecDeque<Store>,
}

/// What a crash image is built from.
#[derive(Debug, Clone)]
struct Persisted {
    durable: Pages,
    units: BTreeMap<u64, UnitLog>,
    /// eADR mode: every store not yet folded into `durable`, in global order, with the
    /// thread that made it.
    global: VecDeque<(ThreadId, Store)>,
    /// File mode: the journal file's durable bytes and unsynced writes.
    journal: Option<FileLog>,
}

/// A simulated file behind a page cache: its durable bytes and, per sector, the writes not
/// yet synced.
#[derive(Debug, Clone)]
struct FileLog {
    durable: Pages,
    units: BTreeMap<u64, UnitLog>,
}

impl FileLog {
    fn log(&mut self, offset: u64, bytes: &[u8]) {
        split_units(offset, bytes, JOURNAL_SECTOR, |store| {
            self.units
                .entry(store.offset / JOURNAL_SECTOR)
                .or_default()
                .pending
                .push_back(store);
        });
    }

    fn sync(&mut self) {
        fold(&mut self.units, &mut self.durable);
    }
}

/// The sector of the simulated journal file.
const JOURNAL_SECTOR: u64 = 512;

/// Makes every logged store durable.
fn fold(units: &mut BTreeMap<u64, UnitLog>, durable: &mut Pages) {
    for (_, log) in std::mem::take(units) {
        for store in log.pending {
            store.apply(durable);
        }
    }
}

#[derive(Debug)]
struct State {
    persisted: Persisted,
    /// Per thread: (unit, log position) marks recorded by flushes, made durable by a fence.
    flushed: HashMap<ThreadId, Vec<(u64, u64)>>,
    events: u64,
    crash_at: Option<u64>,
    snapshot: Option<(u64, Persisted)>,
    /// File mode: what reads of the journal file return.
    journal: Pages,
}

/// A post-crash heap image, with the seed and crash step that produced it.
#[derive(Debug, Clone)]
pub struct CrashImage {
    bytes: Pages,
    journal: Option<Pages>,
    seed: u64,
    step: Option<u64>,
}

impl CrashImage {
    /// The image's bytes: a whole heap as it would be found after the crash.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.to_vec()
    }

    /// The image with the little-endian `value` stored at `offset` of the heap's bytes: for
    /// a test that gives a crash image what the simulator's write-backs are unlikely to.
    #[cfg(test)]
    pub(crate) fn with_word(mut self, offset: u64, value: u64) -> CrashImage {
        let written = usize::try_from(offset)
            .is_ok_and(|offset| self.bytes.write(offset, &value.to_le_bytes()));
        assert!(written, "offset {offset:#x} is outside the image");
        self
    }

    /// The little-endian word at `offset` of the heap's bytes (0 past the image).
    #[cfg(test)]
    pub(crate) fn word_at(&self, offset: u64) -> u64 {
        let mut word = [0u8; 8];
        let _ = usize::try_from(offset).is_ok_and(|offset| self.bytes.read(offset, &mut word));
        u64::from_le_bytes(word)
    }

    /// Consumes the image into its bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes.to_vec()
    }

    /// Consumes the image into the heap's bytes and the journal's, if any.
    pub(crate) fn into_parts(self) -> (Pages, Option<Pages>) {
        (self.bytes, self.journal)
    }

    /// The journal file's bytes, for an image of a journal heap ([`SimMode::File`]).
    pub fn journal_bytes(&self) -> Option<Vec<u8>> {
        self.journal.as_ref().map(Pages::to_vec)
    }

    /// The epoch word the image holds, which decides what recovery of it keeps (the blocks
    /// of epochs up to two below it): for a journal heap the word of the journal's last
    /// valid record, else the heap's stored word. `None` if the image is too short to hold
    /// a superblock, or its journal has no valid header or is damaged.
    pub fn epoch_word(&self) -> Option<Epoch> {
        if let Some(journal) = &self.journal {
            return crate::persist::journal::durable_word_of(journal.clone()).map(Epoch::new);
        }
        let mut word = [0u8; 8];
        self.bytes
            .read(crate::base::layout::EPOCH_OFFSET as usize, &mut word)
            .then(|| Epoch::new(u64::from_le_bytes(word)))
    }

    /// The seed that chose which pending stores survived.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The persistence event before which the crash happened, if it was set with
    /// [`Simulator::crash_at`]; `None` for a crash at the end of the run.
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// An image made from raw bytes, for reopening a heap that was saved elsewhere.
    pub fn from_bytes(bytes: &[u8]) -> CrashImage {
        CrashImage {
            bytes: Pages::from_bytes(bytes),
            journal: None,
            seed: 0,
            step: None,
        }
    }
}

/// The power-failure simulator behind a [`BackendKind::Simulated`](crate::BackendKind) heap.
///
/// Obtain it with [`Heap::simulator`](crate::Heap::simulator); it stays usable after the heap
/// is closed, so a test can close a heap and still build crash images of it.
#[derive(Debug)]
pub struct Simulator {
    mode: SimMode,
    state: Mutex<State>,
}

impl Simulator {
    /// A simulator whose durable image starts as `initial` (all of it durable), with, in
    /// file mode, a journal file that starts as `journal`.
    pub(crate) fn new(mode: SimMode, initial: Pages, journal: Option<Pages>) -> Simulator {
        Simulator {
            mode,
            state: Mutex::new(State {
                persisted: Persisted {
                    durable: initial,
                    units: BTreeMap::new(),
                    global: VecDeque::new(),
                    journal: journal.clone().map(|durable| FileLog {
                        durable,
                        units: BTreeMap::new(),
                    }),
                },
                flushed: HashMap::new(),
                events: 0,
                crash_at: None,
                snapshot: None,
                journal: journal.unwrap_or_default(),
            }),
        }
    }

    /// The crash model in use.
    pub fn mode(&self) -> SimMode {
        self.mode
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent: every operation mutates
        // it only after its own checks, so the poison flag carries no information here.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many persistence events (stores, flushes, fences) have happened so far.
    pub fn events(&self) -> u64 {
        self.lock().events
    }

    /// Makes the simulator remember its state just before persistence event `step` (counting
    /// from 0), so that a later [`crash`](Self::crash) crashes there. Replaces any earlier
    /// crash point and snapshot.
    pub fn crash_at(&self, step: u64) {
        let mut state = self.lock();
        state.crash_at = Some(step);
        state.snapshot = None;
        if state.events == step {
            let snap = state.persisted.clone();
            state.snapshot = Some((step, snap));
        }
    }

    /// Builds a post-crash image. If a crash point was set and reached, the image is of the
    /// state at that point; otherwise of the state now. The same seed always gives the same
    /// image.
    pub fn crash(&self, seed: u64) -> CrashImage {
        CRASHES_ON_THREAD.with(|count| count.set(count.get() + 1));
        let state = self.lock();
        let (step, persisted) = match &state.snapshot {
            Some((step, snap)) => (Some(*step), snap),
            None => (None, &state.persisted),
        };
        let bytes = build_image(self.mode, persisted, seed);
        let journal = persisted.journal.as_ref().map(|file| {
            let mut rng = SplitMix64::new(seed ^ 0x6A6F_7572_6E61_6C00);
            let mut image = file.durable.clone();
            for log in file.units.values() {
                let keep = rng.prefix_len(log.pending.len() as u64) as usize;
                for store in log.pending.iter().take(keep) {
                    store.apply(&mut image);
                }
            }
            image
        });
        CrashImage {
            bytes,
            journal,
            seed,
            step,
        }
    }

    /// The durable image alone: what survives if every pending store is lost.
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().persisted.durable.to_vec()
    }

    /// The durable state alone as a crash image (with the journal's, in file mode).
    pub fn durable(&self) -> CrashImage {
        let state = self.lock();
        CrashImage {
            bytes: state.persisted.durable.clone(),
            journal: state.persisted.journal.as_ref().map(|f| f.durable.clone()),
            seed: 0,
            step: None,
        }
    }

    /// File mode: the journal file's length.
    pub(crate) fn journal_len(&self) -> u64 {
        self.lock().journal.len() as u64
    }

    /// File mode: a write into the journal file's page cache.
    pub(crate) fn journal_write(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let mut state = self.lock();
        if !state.journal.write(offset as usize, bytes) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Self::event(&mut state);
        if let Some(file) = &mut state.persisted.journal {
            file.log(offset, bytes);
        }
        Ok(())
    }

    /// File mode: a read of the journal file.
    pub(crate) fn journal_read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.lock().journal.read(offset as usize, buf) {
            Ok(())
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
        }
    }

    /// File mode: `fdatasync` of the journal file.
    pub(crate) fn journal_sync(&self) {
        let mut state = self.lock();
        Self::event(&mut state);
        if let Some(file) = &mut state.persisted.journal {
            file.sync();
        }
    }

    /// File mode: `fdatasync` of the heap file: every store so far is durable.
    pub(crate) fn data_sync(&self) {
        let mut state = self.lock();
        Self::event(&mut state);
        let Persisted { durable, units, .. } = &mut state.persisted;
        fold(units, durable);
    }

    /// The heap file grew to `len` bytes, durably (the grower synced the file's new length
    /// before anything may depend on it): the durable image grows with zeros. A crash
    /// before this event finds the shorter file.
    pub(crate) fn extend(&self, len: u64) {
        let mut state = self.lock();
        Self::event(&mut state);
        state.persisted.durable.grow(len as usize);
    }

    /// Counts one event, taking the snapshot first if this is the crash point.
    fn event(state: &mut State) {
        if state.crash_at == Some(state.events) && state.snapshot.is_none() {
            let snap = state.persisted.clone();
            state.snapshot = Some((state.events, snap));
        }
        state.events += 1;
    }

    fn log(&self, state: &mut State, offset: u64, bytes: &[u8]) {
        split_units(offset, bytes, self.mode.unit(), |store| {
            self.log_store(state, store);
        });
    }

    /// Stores a word into the region and logs it.
    pub(crate) fn store(
        &self,
        region: &Region,
        offset: u64,
        value: u64,
        order: std::sync::atomic::Ordering,
    ) -> Result<()> {
        let word = region.word(offset)?;
        let mut state = self.lock();
        Self::event(&mut state);
        word.store(value, order);
        let store = Store {
            offset,
            bytes: StoreBytes::Word(value),
        };
        self.log_store(&mut state, store);
        Ok(())
    }

    fn log_store(&self, state: &mut State, store: Store) {
        if self.mode == SimMode::Eadr {
            let me = std::thread::current().id();
            state.persisted.global.push_back((me, store));
            if state.persisted.global.len() > EADR_WINDOW
                && let Some((_, old)) = state.persisted.global.pop_front()
            {
                old.apply(&mut state.persisted.durable);
            }
            return;
        }
        let unit = self.mode.unit();
        state
            .persisted
            .units
            .entry(store.offset / unit)
            .or_default()
            .pending
            .push_back(store);
    }

    /// Compare-and-swap on a word; logs a store when it succeeds. Not a fence.
    pub(crate) fn compare_exchange(
        &self,
        region: &Region,
        offset: u64,
        current: u64,
        new: u64,
    ) -> Result<Result<u64, u64>> {
        let word = region.word(offset)?;
        let mut state = self.lock();
        Self::event(&mut state);
        // ORDERING: as `Media::compare_exchange` on the other backends.
        let result = word.compare_exchange(
            current,
            new,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
        if result.is_ok() {
            let store = Store {
                offset,
                bytes: StoreBytes::Word(new),
            };
            self.log_store(&mut state, store);
        }
        Ok(result)
    }

    /// Copies bytes into the region and logs them.
    pub(crate) fn write(&self, region: &Region, offset: u64, bytes: &[u8]) -> Result<()> {
        region.check(offset, bytes.len() as u64)?;
        let mut state = self.lock();
        Self::event(&mut state);
        region.write(offset, bytes)?;
        self.log(&mut state, offset, bytes);
        Ok(())
    }

    /// Records, for the calling thread, how far the logs of the units in the range had grown.
    pub(crate) fn flush(&self, offset: u64, len: u64) {
        let mut state = self.lock();
        Self::event(&mut state);
        if self.mode == SimMode::Eadr || len == 0 {
            return;
        }
        let unit = self.mode.unit();
        let first = offset / unit;
        let last = (offset.saturating_add(len) - 1) / unit;
        let mut marks = Vec::new();
        for (&index, log) in state.persisted.units.range(first..=last) {
            if !log.pending.is_empty() {
                marks.push((index, log.applied + log.pending.len() as u64));
            }
        }
        if !marks.is_empty() {
            let me = std::thread::current().id();
            state.flushed.entry(me).or_default().extend(marks);
        }
    }

    /// Makes durable what the calling thread's earlier flushes recorded. In eADR mode,
    /// makes durable every store up to the calling thread's last one: the fence drains its
    /// store buffer, and what is visible is durable.
    pub(crate) fn fence(&self) {
        let mut state = self.lock();
        Self::event(&mut state);
        let me = std::thread::current().id();
        if self.mode == SimMode::Eadr {
            let Persisted {
                durable, global, ..
            } = &mut state.persisted;
            if let Some(last) = global.iter().rposition(|(thread, _)| *thread == me) {
                for (_, store) in global.drain(..=last) {
                    store.apply(durable);
                }
            }
            return;
        }
        let Some(marks) = state.flushed.remove(&me) else {
            return;
        };
        let persisted = &mut state.persisted;
        for (index, upto) in marks {
            let Some(log) = persisted.units.get_mut(&index) else {
                continue;
            };
            while log.applied < upto {
                let Some(store) = log.pending.pop_front() else {
                    break;
                };
                store.apply(&mut persisted.durable);
                log.applied += 1;
            }
            if log.pending.is_empty() {
                persisted.units.remove(&index);
            }
        }
    }
}

/// Splits a byte range into stores that each stay inside one unit.
fn split_units(offset: u64, bytes: &[u8], unit: u64, mut push: impl FnMut(Store)) {
    let mut at = offset;
    let mut rest = bytes;
    while !rest.is_empty() {
        let room = (unit - at % unit) as usize;
        let (head, tail) = rest.split_at(room.min(rest.len()));
        push(Store {
            offset: at,
            bytes: StoreBytes::Range(head.into()),
        });
        at += head.len() as u64;
        rest = tail;
    }
}

thread_local! {
    /// How many crash images this thread has built; see [`crashes_on_this_thread`].
    static CRASHES_ON_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many crash images [`Simulator::crash`] has built on the calling thread: each is one
/// simulated power failure, and the crash tests count them with this (per thread, so tests
/// running side by side do not count each other's).
pub fn crashes_on_this_thread() -> u64 {
    CRASHES_ON_THREAD.with(std::cell::Cell::get)
}

/// A small deterministic generator (splitmix64): the same seed gives the same crash image on
/// every machine and build.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..=max`, uniformly (up to a negligible modulo bias).
    pub fn below_or_equal(&mut self, max: u64) -> u64 {
        match max.checked_add(1) {
            Some(span) => self.next_u64() % span,
            None => self.next_u64(),
        }
    }

    /// How many of `len` pending stores survive: a third none, a third all, a third uniform.
    fn prefix_len(&mut self, len: u64) -> u64 {
        match self.next_u64() % 3 {
            0 => 0,
            1 => len,
            _ => self.below_or_equal(len),
        }
    }
}

fn build_image(mode: SimMode, persisted: &Persisted, seed: u64) -> Pages {
    let mut rng = SplitMix64::new(seed);
    let mut image = persisted.durable.clone();
    match mode {
        SimMode::Prefix | SimMode::File => {
            for log in persisted.units.values() {
                let keep = rng.prefix_len(log.pending.len() as u64) as usize;
                for store in log.pending.iter().take(keep) {
                    store.apply(&mut image);
                }
            }
        }
        SimMode::WordTear => {
            for (&index, log) in &persisted.units {
                let start = (index * 64) as usize;
                let mut latest = [0u8; 64];
                if !persisted.durable.read(start, &mut latest) {
                    continue;
                }
                for store in &log.pending {
                    let at = (store.offset as usize).saturating_sub(start);
                    store.with_bytes(|bytes| {
                        if let Some(dst) = latest.get_mut(at..at + bytes.len()) {
                            dst.copy_from_slice(bytes);
                        }
                    });
                }
                // Which words are torn to their new value: all, none, or a random mix.
                let mask = match rng.next_u64() % 3 {
                    0 => 0u64,
                    1 => u64::MAX,
                    _ => rng.next_u64(),
                };
                for word in 0..8 {
                    if mask & (1 << word) != 0 {
                        image.write(start + word * 8, &latest[word * 8..word * 8 + 8]);
                    }
                }
            }
        }
        SimMode::Eadr => {
            let keep = rng.prefix_len(persisted.global.len() as u64) as usize;
            for (_, store) in persisted.global.iter().take(keep) {
                store.apply(&mut image);
            }
        }
    }
    image
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::base::mapping::Mapping;
    use crate::persist::{Backend, Media};

    const LEN: usize = 8192;

    fn media(mode: SimMode) -> (Media, Arc<Simulator>) {
        let sim = Arc::new(Simulator::new(mode, Pages::zeroed(LEN), None));
        let region = Region::new(Mapping::anonymous(LEN, true).unwrap());
        (Media::new(region, Backend::Simulated(sim.clone())), sim)
    }

    fn word(image: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(image[offset..offset + 8].try_into().unwrap())
    }

    /// The set of values word `offset` takes over many crash seeds.
    fn outcomes(sim: &Simulator, offsets: &[usize]) -> BTreeSet<Vec<u64>> {
        (0..300)
            .map(|seed| {
                let image = sim.crash(seed);
                let bytes = image.to_bytes();
                offsets.iter().map(|&o| word(&bytes, o)).collect()
            })
            .collect()
    }

    #[test]
    fn an_unflushed_store_can_be_lost_or_kept() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(0, 7).unwrap();
        assert_eq!(outcomes(&sim, &[0]), BTreeSet::from([vec![0], vec![7]]));
    }

    #[test]
    fn a_flushed_but_unfenced_store_can_be_lost() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(0, 7).unwrap();
        m.flush(0, 8).unwrap();
        assert!(outcomes(&sim, &[0]).contains(&vec![0]));
    }

    #[test]
    fn a_flushed_and_fenced_store_is_never_lost() {
        for mode in SimMode::ALL {
            let (m, sim) = media(mode);
            m.store(0, 7).unwrap();
            m.flush(0, 8).unwrap();
            m.fence().unwrap();
            assert_eq!(outcomes(&sim, &[0]), BTreeSet::from([vec![7]]), "{mode:?}");
            assert_eq!(word(&sim.durable_image(), 0), 7);
        }
    }

    #[test]
    fn a_fence_covers_only_the_flushes_of_its_own_thread() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(0, 7).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| m.flush(0, 8).unwrap());
        });
        m.fence().unwrap();
        assert_eq!(word(&sim.durable_image(), 0), 0);
        m.flush(0, 8).unwrap();
        m.fence().unwrap();
        assert_eq!(word(&sim.durable_image(), 0), 7);
    }

    #[test]
    fn a_store_after_the_flush_is_not_made_durable_by_the_fence() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(0, 1).unwrap();
        m.flush(0, 8).unwrap();
        m.store(0, 2).unwrap();
        m.fence().unwrap();
        assert_eq!(word(&sim.durable_image(), 0), 1);
        assert_eq!(outcomes(&sim, &[0]), BTreeSet::from([vec![1], vec![2]]));
    }

    #[test]
    fn stores_to_one_line_persist_in_order() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(0, 1).unwrap();
        m.store(8, 1).unwrap();
        let seen = outcomes(&sim, &[0, 8]);
        assert_eq!(seen, BTreeSet::from([vec![0, 0], vec![1, 0], vec![1, 1]]));
    }

    #[test]
    fn word_tearing_breaks_same_line_order() {
        let (m, sim) = media(SimMode::WordTear);
        m.store(0, 1).unwrap();
        m.store(8, 1).unwrap();
        assert!(outcomes(&sim, &[0, 8]).contains(&vec![0, 1]));
    }

    #[test]
    fn every_allowed_pattern_of_two_lines_is_reachable_and_no_other() {
        let (m, sim) = media(SimMode::Prefix);
        for line in [0u64, 64] {
            m.store(line, 1).unwrap();
            m.store(line + 8, 1).unwrap();
        }
        let seen = outcomes(&sim, &[0, 8, 64, 72]);
        let per_line = [[0, 0], [1, 0], [1, 1]];
        let mut want = BTreeSet::new();
        for a in per_line {
            for b in per_line {
                want.insert(vec![a[0], a[1], b[0], b[1]]);
            }
        }
        assert_eq!(seen, want);
    }

    #[test]
    fn eadr_keeps_one_global_order_and_ignores_flushes() {
        let (m, sim) = media(SimMode::Eadr);
        m.store(0, 1).unwrap();
        m.store(4096, 1).unwrap();
        m.store(128, 1).unwrap();
        let seen = outcomes(&sim, &[0, 4096, 128]);
        let want = BTreeSet::from([vec![0, 0, 0], vec![1, 0, 0], vec![1, 1, 0], vec![1, 1, 1]]);
        assert_eq!(seen, want);
    }

    #[test]
    fn file_mode_keeps_order_within_a_sector_but_not_across_sectors() {
        let (m, sim) = media(SimMode::File);
        m.store(0, 1).unwrap();
        m.store(256, 1).unwrap();
        m.store(512, 1).unwrap();
        let seen = outcomes(&sim, &[0, 256, 512]);
        assert!(!seen.contains(&vec![0, 1, 0]) && !seen.contains(&vec![0, 1, 1]));
        assert!(seen.contains(&vec![0, 0, 1]));
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn byte_ranges_are_logged_per_line() {
        let (m, sim) = media(SimMode::Prefix);
        m.write(60, &[0xAB; 8]).unwrap();
        let seen: BTreeSet<(u8, u8)> = (0..300)
            .map(|seed| {
                let image = sim.crash(seed);
                let bytes = image.to_bytes();
                (bytes[60], bytes[64])
            })
            .collect();
        assert_eq!(
            seen.len(),
            4,
            "the two lines of a straddling write are independent"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_image() {
        let (m, sim) = media(SimMode::Prefix);
        for i in 0..64u64 {
            m.store(i * 64, i + 1).unwrap();
        }
        assert_eq!(sim.crash(99).to_bytes(), sim.crash(99).to_bytes());
        assert_ne!(sim.crash(1).to_bytes(), sim.crash(2).to_bytes());
    }

    #[test]
    fn a_crash_point_freezes_the_state_before_that_event() {
        let (m, sim) = media(SimMode::Prefix);
        m.persist(0, 8).unwrap();
        m.store(0, 1).unwrap();
        m.persist(0, 8).unwrap();
        let step = sim.events();
        sim.crash_at(step);
        m.store(0, 2).unwrap();
        m.persist(0, 8).unwrap();
        let image = sim.crash(5);
        assert_eq!(image.step(), Some(step));
        assert_eq!(word(&image.to_bytes(), 0), 1);
        // A crash point in the future is taken when the run reaches it.
        sim.crash_at(sim.events() + 1);
        m.store(0, 3).unwrap();
        m.store(8, 3).unwrap();
        assert_eq!(
            outcomes(&sim, &[0, 8]),
            BTreeSet::from([vec![2, 0], vec![3, 0]])
        );
    }

    #[test]
    fn a_successful_cas_is_a_store_but_not_a_fence() {
        let (m, sim) = media(SimMode::Prefix);
        m.store(64, 5).unwrap();
        m.flush(64, 8).unwrap();
        assert_eq!(m.compare_exchange(0, 0, 9).unwrap(), Ok(0));
        assert_eq!(m.compare_exchange(0, 0, 10).unwrap(), Err(9));
        assert_eq!(word(&sim.durable_image(), 64), 0);
        assert_eq!(outcomes(&sim, &[0]), BTreeSet::from([vec![0], vec![9]]));
    }
}
