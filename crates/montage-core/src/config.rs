//! `HeapConfig`: where a heap lives, how big it is, which persistence backend writes it back,
//! and how its clock advances. A leaf: every layer reads its configuration from here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// How the simulator decides what a crash preserves.
#[cfg(any(test, feature = "sim"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimMode {
    /// Per cache line, a random prefix of the stores not yet durable (x86 with ADR).
    Prefix,
    /// Per cache line, each 8-byte word independently old or new: a stricter superset of
    /// `Prefix` that also breaks same-line ordering.
    WordTear,
    /// One global store order, flushes irrelevant: a random prefix of every store not yet
    /// folded into the durable image (platforms with eADR).
    Eadr,
    /// An ordinary file with the journal backend: the heap file and its journal each
    /// behind a page cache. Only what an `fdatasync` covered is certain; of every other
    /// write, each 512-byte sector independently keeps a random prefix, and the heap file's
    /// mapped pages may reach the disk at any moment before.
    File,
}

#[cfg(any(test, feature = "sim"))]
impl SimMode {
    /// Every mode, for tests that sweep them all.
    pub const ALL: [SimMode; 4] = [
        SimMode::Prefix,
        SimMode::WordTear,
        SimMode::Eadr,
        SimMode::File,
    ];

    /// The unit a crash keeps or loses as a whole prefix of stores: a line, or a disk
    /// sector.
    pub(crate) fn unit(self) -> u64 {
        match self {
            SimMode::File => 512,
            _ => 64,
        }
    }
}

/// The persistence backend a heap uses, chosen when the heap is created or opened.
///
/// The backend decides what "flush" and "fence" do; everything else in the runtime is the same.
/// See `docs/design.md` ("Persistence model") for what each one makes durable, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// Persistent memory (a DAX file or any mapping): `clwb`, else `clflushopt`, else
    /// `clflush` per cache line, detected at run time, and `sfence`. x86-64 only.
    Pmem,
    /// Platforms whose caches are in the persistence domain (eADR): no flushes, `sfence` only.
    Eadr,
    /// An ordinary file with a redo journal beside it (`<heap file>.journal`): an epoch
    /// advance appends what the epoch wrote to the journal as one record, `sync` makes it
    /// durable with one `fdatasync` shared by every caller waiting at that moment, and the
    /// heap file itself is made durable only at checkpoints, in the background. A failed
    /// write or flush poisons the heap.
    Journal,
    /// No write-back at all: for measuring the runtime's own overhead. Not crash-safe.
    Volatile,
    /// The power-failure simulator (in memory only): every store is logged so that
    /// [`Simulator::crash`](crate::sim::Simulator::crash) can build any legal post-crash
    /// image. With the `sim` feature only.
    #[cfg(any(test, feature = "sim"))]
    Simulated(SimMode),
}

impl BackendKind {
    /// The backend a file heap uses when none is chosen: `Journal`, which is crash-safe on
    /// any file system.
    pub const DEFAULT: BackendKind = BackendKind::Journal;
}

/// When an operation's writes are written back to the persistence domain.
///
/// Buffering them to the end of the operation's epoch is the point of the design (see
/// `docs/design.md`); writing them back as each operation ends is the cost a strictly
/// (durably linearizable) persistent structure pays, and is here to measure that cost side by
/// side with the same runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WriteBack {
    /// With the operation's epoch, by the epoch advance (the default).
    #[default]
    Epoch,
    /// As each operation ends: the operation writes back every range it wrote and fences
    /// before it returns (the epoch advance still passes over them, finding them clean).
    ///
    /// Recovery is unchanged: it keeps what the epoch rules keep (everything two epochs behind
    /// the stored clock), so this mode costs what strict durability costs without promising
    /// more than [`Epoch`](Self::Epoch). Use it to measure, not to serve.
    MeasureEachOp,
}

/// How the clock advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochLength {
    /// A background thread advances the clock this often (and `sync` advances it at once).
    Every(Duration),
    /// No background thread: the clock moves only when `sync` or
    /// [`Heap::advance_epoch`](crate::Heap::advance_epoch) moves it. For deterministic tests.
    Manual,
}

impl EpochLength {
    /// The default: 50 ms, as in the Montage paper's configuration.
    pub const DEFAULT: EpochLength = EpochLength::Every(Duration::from_millis(50));
}

/// Where a heap's bytes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A file, mapped shared.
    File(PathBuf),
    /// Anonymous memory owned by the process (volatile, or the simulator's volatile image).
    Memory,
}

/// How to create or open a heap.
///
/// ```
/// use montage_core::{BackendKind, HeapConfig};
/// let config = HeapConfig::new("/tmp/example.heap")
///     .size(64 << 20)
///     .backend(BackendKind::Journal);
/// assert_eq!(config.heap_size(), 64 << 20);
/// ```
#[derive(Debug, Clone)]
// Independent switches of a builder, each with its own setter.
#[allow(clippy::struct_excessive_bools)]
pub struct HeapConfig {
    pub(crate) location: Location,
    pub(crate) size: u64,
    pub(crate) max_size: Option<u64>,
    pub(crate) backend: BackendKind,
    pub(crate) thread_slots: usize,
    pub(crate) recovery_threads: usize,
    #[cfg(any(test, feature = "sim"))]
    pub(crate) sim_crash_at: Option<u64>,
    pub(crate) epoch_length: EpochLength,
    pub(crate) progress: Option<Progress>,
    pub(crate) write_back: WriteBack,
    pub(crate) journal_size: Option<u64>,
    pub(crate) quarantine: bool,
    pub(crate) verify_reads: bool,
    pub(crate) huge_pages: bool,
    pub(crate) read_only: bool,
    pub(crate) repair: bool,
}

/// How far recovery has come, for progress bars
/// ([`HeapConfig::on_recovery_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryProgress {
    /// Block headers read so far.
    pub read: u64,
    /// Block headers the recovery reads in all (it reads each header twice: once to choose
    /// what lives, once to keep or drop it).
    pub total: u64,
}

impl RecoveryProgress {
    /// `read` of `total` headers (for tests of what a callback does with them).
    pub fn new(read: u64, total: u64) -> RecoveryProgress {
        RecoveryProgress { read, total }
    }
}

/// A recovery progress callback (see [`HeapConfig::on_recovery_progress`]).
#[derive(Clone)]
pub(crate) struct Progress(pub(crate) Arc<dyn Fn(RecoveryProgress) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}

/// The smallest journal: its header page and a 64 KiB ring of records.
pub(crate) const MIN_JOURNAL_LEN: u64 = 0x1000 + (64 << 10);

/// The heap size used when none is given: 64 MiB.
pub const DEFAULT_HEAP_SIZE: u64 = 64 << 20;

impl HeapConfig {
    /// A heap in the file at `path`, with the default size and the [`BackendKind::DEFAULT`]
    /// backend.
    pub fn new(path: impl AsRef<Path>) -> Self {
        HeapConfig {
            location: Location::File(path.as_ref().to_path_buf()),
            size: DEFAULT_HEAP_SIZE,
            max_size: None,
            backend: BackendKind::DEFAULT,
            thread_slots: default_thread_slots(),
            recovery_threads: default_recovery_threads(),
            #[cfg(any(test, feature = "sim"))]
            sim_crash_at: None,
            epoch_length: EpochLength::DEFAULT,
            progress: None,
            write_back: WriteBack::Epoch,
            journal_size: None,
            quarantine: false,
            verify_reads: false,
            huge_pages: true,
            read_only: false,
            repair: false,
        }
    }

    /// A heap in anonymous memory, gone when the process ends. Its backend defaults to
    /// [`BackendKind::Volatile`]; choose the simulator (the `sim` feature) for crash tests.
    pub fn in_memory(size: u64) -> Self {
        HeapConfig {
            location: Location::Memory,
            size,
            max_size: None,
            backend: BackendKind::Volatile,
            thread_slots: default_thread_slots(),
            recovery_threads: default_recovery_threads(),
            #[cfg(any(test, feature = "sim"))]
            sim_crash_at: None,
            epoch_length: EpochLength::DEFAULT,
            progress: None,
            write_back: WriteBack::Epoch,
            journal_size: None,
            quarantine: false,
            verify_reads: false,
            huge_pages: true,
            read_only: false,
            repair: false,
        }
    }

    /// An in-memory heap on the power-failure simulator in `mode`. Its clock is manual (no
    /// background thread), so a test's persistence events are deterministic. With the `sim`
    /// feature only.
    #[cfg(any(test, feature = "sim"))]
    pub fn simulated(size: u64, mode: SimMode) -> Self {
        HeapConfig::in_memory(size)
            .backend(BackendKind::Simulated(mode))
            .epoch_length(EpochLength::Manual)
    }

    /// The size of a heap to create, in bytes (ignored when opening: the file records it).
    #[must_use]
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }

    /// The persistence backend.
    #[must_use]
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// How many thread slots the heap keeps (64 by default). The first threads to use any
    /// heap of the process (by a small id each thread keeps until it exits) each own a
    /// slot: their operations announce themselves, allocate from their own cache and log
    /// their writes for the advancer without taking a lock. More threads than slots still
    /// work correctly; they share a few slots under locks, which costs speed.
    #[must_use]
    pub fn thread_slots(mut self, slots: usize) -> Self {
        self.thread_slots = slots;
        self
    }

    /// What open does with damaged blocks (a header or a durable payload that fails its
    /// checksum). By default (`false`) open fails with [`Error::DamagedHeader`] or
    /// [`Error::DamagedPayload`] and changes nothing. With `true` it opens the heap without
    /// them: each damaged block, and every other version of the payload its header names, is
    /// left on the media as it is, neither kept nor reused, and listed in
    /// [`RecoveryReport::quarantined`] with the structure it belongs to. The structures then
    /// hold everything else; what they lost is listed there, by structure, and never
    /// returned as data. A quarantined block is found again at every open until the
    /// damaged bytes are rewritten.
    ///
    /// [`Error::DamagedHeader`]: crate::Error::DamagedHeader
    /// [`Error::DamagedPayload`]: crate::Error::DamagedPayload
    /// [`RecoveryReport::quarantined`]: crate::RecoveryReport::quarantined
    #[must_use]
    pub fn quarantine_damaged(mut self, quarantine: bool) -> Self {
        self.quarantine = quarantine;
        self
    }

    /// Whether every read of a payload checks it against its checksum (default `false`).
    /// With `true`, [`Heap::view`], [`Heap::read_payload`], [`OpGuard::view`],
    /// [`OpGuard::read`], typed reads (`get`, `get_<field>`) and the reads built on them (so
    /// every read of the collections) fail with [`Error::DamagedPayload`] rather than return
    /// a payload whose bytes changed on the media since they were written. A
    /// payload written in the last two epochs is not checked: one changed in place then
    /// gets its checksum when its epoch is written back. Recovery checks every durable
    /// payload at open either way; this catches damage that happens while the heap is
    /// open. It costs a second pass over each payload read (`docs/PERFORMANCE.md`).
    ///
    /// [`Heap::view`]: crate::Heap::view
    /// [`OpGuard::view`]: crate::OpGuard::view
    /// [`OpGuard::read`]: crate::OpGuard::read
    /// [`Heap::read_payload`]: crate::Heap::read_payload
    /// [`Error::DamagedPayload`]: crate::Error::DamagedPayload
    #[must_use]
    pub fn verify_reads(mut self, verify: bool) -> Self {
        self.verify_reads = verify;
        self
    }

    /// Maps the heap in huge pages where the system can give them (default `true`): a
    /// memory heap asks for transparent huge pages (`MADV_HUGEPAGE`); a heap file on tmpfs
    /// (such as `/dev/shm`) is mapped at a 2 MiB boundary, and a thread of the heap's, at
    /// the lowest scheduling priority, collapses the file's pages into huge pages
    /// (`MADV_COLLAPSE`, Linux 6.1) while the heap runs, as far as the heap has handed out
    /// blocks (the allocator fills it from the start): about 1.4 s of one core per GiB in
    /// use, once, since the file keeps them. A DAX file is mapped in huge pages by the
    /// kernel either way, and a file in a disk's page cache cannot be.
    ///
    /// With 4 KiB pages a random read of a large heap misses the TLB as well as the cache;
    /// at a million entries that cost the map's reads 15% to 20% of their throughput
    /// (`docs/PERFORMANCE.md`). `false` leaves the pages as the system gives them: for a
    /// short-lived process that fills a large, fresh tmpfs heap, which would spend more on
    /// the collapse than it gains.
    #[must_use]
    pub fn huge_pages(mut self, huge: bool) -> Self {
        self.huge_pages = huge;
        self
    }

    /// Opens the heap file without ever writing it or its journal (default `false`), for
    /// tools that inspect a heap and for readers of a heap no process has open.
    ///
    /// The file is locked shared, so it opens while other read-only opens have it and fails
    /// with [`Error::Locked`] while a writer has it (and a writer cannot open it meanwhile).
    /// It is mapped copy-on-write: the journal's records are replayed and recovery runs as
    /// at any open, but what they change stays in this process's memory. The heap does not
    /// grow, its clock writes nothing, and every call that would change a payload, the
    /// directory or the type registry fails with [`Error::ReadOnly`].
    /// [`Heap::create`](crate::Heap::create) refuses the setting.
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// Repairs a damaged heap as it opens (default `false`): keeps what its checksums prove
    /// intact and drops the rest, reporting each step in
    /// [`RecoveryReport::repairs`](crate::RecoveryReport::repairs) and each dropped block in
    /// [`RecoveryReport::dropped_damaged`](crate::RecoveryReport::dropped_damaged).
    ///
    /// * A superblock, directory or registry entry damaged in one byte is restored from its
    ///   checksum (the one single-byte change that makes the checksum hold). A directory
    ///   entry beyond that names its structure `recovered-<owner id>`; a registry entry
    ///   beyond that is cleared (its payloads stay; the type is registered again by the
    ///   next program that stores it); a superblock beyond that cannot be repaired.
    /// * A span table entry that fails its check is rebuilt from the headers of the blocks
    ///   in the span, and a span count word from the file's length.
    /// * A file shorter than its heap is extended with zeros (what the lost bytes held is
    ///   lost); an invalid clean-shutdown flag is cleared.
    /// * A journal that cannot be used (missing, damaged, another heap's) is set aside as
    ///   `<journal>.damaged` and the heap no longer names it: the heap file is taken as it
    ///   is, and what the journal held after its last checkpoint is lost.
    /// * Blocks whose header or durable payload fails its checksum, and the other versions
    ///   of their payloads, are dropped as recovery drops a torn block.
    ///
    /// A damaged epoch word, or a superblock damaged in more than one byte, cannot be
    /// repaired: the open fails as without the setting, having changed only what it had
    /// repaired before. Repair writes the heap: make a copy first (the `montage repair`
    /// tool works on a copy unless told otherwise). Not with [`read_only`](Self::read_only).
    #[must_use]
    pub fn repair(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// How many threads the recovery scan may use (default: all cores).
    #[must_use]
    pub fn recovery_threads(mut self, threads: usize) -> Self {
        self.recovery_threads = threads;
        self
    }

    /// For the simulator: the persistence event before which the new heap's simulator takes
    /// its crash snapshot (see [`Simulator::crash_at`](crate::sim::Simulator::crash_at)). Set
    /// it on the configuration passed to [`Heap::open_image`](crate::Heap::open_image) to
    /// crash *during* recovery. With the `sim` feature only.
    #[cfg(any(test, feature = "sim"))]
    #[must_use]
    pub fn sim_crash_at(mut self, step: u64) -> Self {
        self.sim_crash_at = Some(step);
        self
    }

    /// How the epoch clock advances: every so often in a background thread (default
    /// [`EpochLength::DEFAULT`], 50 ms), or only when asked ([`EpochLength::Manual`]).
    /// `sync` always advances the clock itself, so its latency does not depend on this.
    #[must_use]
    pub fn epoch_length(mut self, length: EpochLength) -> Self {
        self.epoch_length = length;
        self
    }

    /// When operations' writes are written back (default [`WriteBack::Epoch`]).
    #[must_use]
    pub fn write_back(mut self, write_back: WriteBack) -> Self {
        self.write_back = write_back;
        self
    }

    /// A callback that recovery calls from its worker threads now and then with how many
    /// block headers it has read and will read in all (each twice: the total is about twice
    /// the block positions in carved spans), for progress bars and log lines.
    #[must_use]
    pub fn on_recovery_progress(
        mut self,
        progress: impl Fn(RecoveryProgress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Progress(Arc::new(progress)));
        self
    }

    /// The size of the journal file a journal heap creates (default: half the heap, at
    /// least 1 MiB and at most 1 GiB). A checkpoint (an `fdatasync` of the heap file) starts
    /// when three quarters of it are in use: a larger journal means fewer checkpoints, each
    /// page of the heap file written back fewer times, and a longer replay after a crash.
    #[must_use]
    pub fn journal_size(mut self, bytes: u64) -> Self {
        self.journal_size = Some(bytes);
        self
    }

    /// The journal size a new journal gets.
    pub(crate) fn journal_len(&self) -> u64 {
        let len = self
            .journal_size
            .unwrap_or_else(|| (self.size / 2).clamp(1 << 20, 1 << 30));
        len.div_ceil(512) * 512
    }

    /// The largest the heap may grow to, in bytes (rounded down to whole spans). A heap
    /// that is full grows by a step that doubles it, up to 1 GiB a step, before an
    /// allocation fails with [`Error::OutOfSpace`]; its address stays the same, so nothing
    /// that points into it moves.
    ///
    /// Without it, a heap file grows as far as its file system has room: the limit is its
    /// length plus the file system's free space when it is opened (the address range
    /// reserved for it then). A heap in memory does not grow unless given one. A heap
    /// created by a build older than format 4 does not grow either.
    #[must_use]
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.max_size = Some(bytes);
        self
    }

    /// The configured heap size in bytes: the size a new heap is created with.
    pub fn heap_size(&self) -> u64 {
        self.size
    }

    /// The configured maximum size, if one was set.
    pub fn max_heap_size(&self) -> Option<u64> {
        self.max_size
    }

    /// The configured backend.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend
    }

    /// The heap file, if this heap lives in a file.
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::File(path) => Some(path),
            Location::Memory => None,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.thread_slots == 0 {
            return Err(Error::InvalidConfig {
                what: "thread_slots must be at least 1",
            });
        }
        if self.epoch_length == EpochLength::Every(std::time::Duration::ZERO) {
            return Err(Error::InvalidConfig {
                what: "an epoch length must be positive; use EpochLength::Manual for none",
            });
        }
        if self.recovery_threads == 0 {
            return Err(Error::InvalidConfig {
                what: "recovery_threads must be at least 1",
            });
        }
        if self.journal_size.is_some_and(|size| size < MIN_JOURNAL_LEN) {
            return Err(Error::InvalidConfig {
                what: "a journal must be at least 68 KiB",
            });
        }
        if self.read_only && self.repair {
            return Err(Error::InvalidConfig {
                what: "a heap opened read-only cannot be repaired",
            });
        }
        if self.read_only && self.location == Location::Memory {
            return Err(Error::InvalidConfig {
                what: "only a heap file can be opened read-only",
            });
        }
        match (&self.location, self.backend) {
            (Location::Memory, BackendKind::Journal) => Err(Error::InvalidConfig {
                what: "the journal backend needs a heap file",
            }),
            #[cfg(any(test, feature = "sim"))]
            (Location::File(_), BackendKind::Simulated(_)) => Err(Error::InvalidConfig {
                what: "the simulator runs on in-memory heaps only",
            }),
            _ => Ok(()),
        }
    }
}

fn default_thread_slots() -> usize {
    64
}

fn default_recovery_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
