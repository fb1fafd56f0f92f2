//! `Heap`: the handle of an open heap, and what ties the layers below together: the mapped
//! media, the allocator, the epoch clock, the directory of named structures and the type
//! registry. Opening is in `open.rs`, the directory in `directory.rs`, reads and scans in
//! `blocks.rs`, and the raw block layer in `raw.rs`.

mod attach;
pub(crate) mod blocks;
mod directory;
mod open;
pub mod raw;
mod repair;
mod usage;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::alloc::AllocStats;
use crate::base::epoch::Epoch;
use crate::base::layout::{CLEAN_SHUTDOWN_OFFSET, Geometry};
use crate::config::BackendKind;
use crate::config::EpochLength;
use crate::epoch::Runtime;
use crate::epoch::op::OpGuard;
use crate::error::{Error, Result};
#[cfg(any(test, feature = "sim"))]
use crate::persist::sim::Simulator;
use crate::recovery::RecoveryReport;

pub use blocks::ScanFilter;
pub use directory::Attached;
pub use usage::{ClassUsage, LargeUsage, StructureUsage, Usage};

/// A persistent heap: a mapped file (or, for tests, memory) holding payload blocks.
///
/// A `Heap` is a handle: cloning it is cheap (a reference count) and every clone names the
/// same open heap, as a `sled::Db` or an `Arc` does. Structures keep a clone, so they are
/// `'static` and can move into threads and tasks. A heap is `Send + Sync`. It holds an
/// exclusive `flock` on its file while open: a second open, from this process or another,
/// fails with [`Error::Locked`].
///
/// # Closing
///
/// [`close`](Self::close) waits for running operations, makes everything they did durable,
/// and marks the heap cleanly shut down. Handles that outlive it (clones, structures) stay
/// memory-safe: from then on every operation, `sync`, advance, registration and raw write
/// through them fails with [`Error::Closed`], while reads still see the closed heap's
/// contents. The file stays mapped and locked until the last handle is dropped. Dropping the
/// last handle without `close` closes the heap the same way, ignoring errors (a heap whose
/// close failed recovers like after a crash).
///
/// ```
/// use montage_core::{Heap, HeapConfig, ScanFilter};
/// # let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("doc.heap");
/// let heap = Heap::create(&HeapConfig::new(&path).size(4 << 20))?;
/// let owner = heap.register("greetings")?;
/// heap.run_op(|op| op.alloc(owner, 0, b"hello"))?;
/// heap.sync()?; // durable from here on
/// heap.close()?;
///
/// let heap = Heap::open(&HeapConfig::new(&path))?;
/// let owner = heap.lookup("greetings").unwrap();
/// let found = heap.collect(ScanFilter::all().owner(owner))?;
/// assert_eq!(found.len(), 1);
/// assert_eq!(heap.read_payload(found[0].block)?, b"hello");
/// # Ok::<(), montage_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Heap {
    inner: Arc<Inner>,
}

/// What every handle of one open heap shares. Dropping the last handle closes the heap if
/// [`Heap::close`] has not.
struct Inner {
    shared: Arc<Shared>,
    /// The background advancer, taken when the heap closes.
    advancer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The state of an open heap, shared with its background advancer.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The media, the allocator, the clock and the type registry: what operations run on.
    pub(crate) runtime: Runtime,
    pub(crate) geometry: Geometry,
    /// The owner ids of the structures attached now ([`Heap::attach`]), as a bit set.
    pub(crate) attached: Mutex<u128>,
    pub(crate) report: RecoveryReport,
    pub(crate) backend: BackendKind,
    /// Holds the `flock`; dropped after the runtime's media, so the file is unmapped before
    /// it unlocks.
    pub(crate) file: Option<(File, PathBuf)>,
}

impl Heap {
    /// What recovery found when this heap was opened (all zero for a new heap).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.shared().report
    }

    /// The heap file, for a file heap.
    pub fn path(&self) -> Option<&Path> {
        self.shared().file.as_ref().map(|(_, path)| path.as_path())
    }

    /// The heap's size in bytes now (it grows: see
    /// [`HeapConfig::max_size`](crate::HeapConfig::max_size)).
    pub fn size(&self) -> u64 {
        self.shared().runtime.alloc.geometry().len()
    }

    /// The most bytes the heap may grow to (see
    /// [`HeapConfig::max_size`](crate::HeapConfig::max_size), rounded down to whole spans):
    /// its [`size`](Self::size) when it does not grow.
    pub fn max_size(&self) -> u64 {
        let alloc = &self.shared().runtime.alloc;
        let geometry = alloc.geometry();
        geometry
            .len_with(alloc.stats().spans_limit)
            .unwrap_or_else(|| geometry.len())
    }

    /// The version of the on-media format the heap file has (see `docs/design.md`).
    pub fn format_version(&self) -> u32 {
        self.shared().geometry.version
    }

    /// Every payload type registered in the heap (by [`Heap::register_type`] and the typed
    /// allocations): its name as stored (at most 40 bytes of it) and its type id, the
    /// fingerprint of its layout, in registration order.
    pub fn registered_types(&self) -> Vec<(String, u64)> {
        self.shared().runtime.types.types()
    }

    /// Whether `self` and `other` are handles of the same open heap (clones of one
    /// [`Heap`], or handles the structures hold).
    pub fn same_heap(&self, other: &Heap) -> bool {
        std::ptr::eq(self.shared(), other.shared())
    }

    /// The random id chosen when the heap was created.
    pub fn creation_id(&self) -> u64 {
        self.shared().geometry.creation_id
    }

    /// The backend this heap was opened with.
    pub fn backend(&self) -> BackendKind {
        self.shared().backend
    }

    /// Whether the heap is mapped with `MAP_SYNC` on a DAX file system, so that cache-line
    /// write-back reaches the media without `msync`.
    pub fn is_dax(&self) -> bool {
        self.shared().runtime.media.region().mapping().is_dax()
    }

    #[cfg(any(test, feature = "sim"))]
    /// The power-failure simulator, if this heap runs on [`BackendKind::Simulated`].
    pub fn simulator(&self) -> Option<Arc<Simulator>> {
        self.shared().runtime.media.simulator().cloned()
    }

    /// Space statistics.
    pub fn stats(&self) -> AllocStats {
        self.shared().runtime.alloc.stats()
    }

    // ---- shutdown --------------------------------------------------------------------

    /// Closes the heap cleanly: running operations end, everything completed becomes durable,
    /// pending frees are made durable, and the clean-shutdown flag is set and written back.
    /// Other handles of this heap see [`Error::Closed`] from then on (see "Closing" above);
    /// the file lock is released when the last of them is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if another handle closed the heap already;
    /// [`Error::SyncInOperation`] if the calling thread has an operation open on this heap
    /// (the heap is then left open); any write-back failure, after which the heap is not
    /// marked clean and its next open runs a full recovery as after a crash.
    pub fn close(self) -> Result<()> {
        self.runtime_outside_op()?;
        self.inner.shutdown()
    }

    /// The runtime, for a call that waits for the clock (`sync`, an advance, `close`): it
    /// would wait for itself if the calling thread had an operation open on this heap.
    fn runtime_outside_op(&self) -> Result<&Runtime> {
        let runtime = &self.shared().runtime;
        if runtime.epochs.has_open_op() {
            return Err(Error::SyncInOperation);
        }
        Ok(runtime)
    }

    #[cfg(test)]
    pub(crate) fn media(&self) -> &crate::persist::Media {
        &self.shared().runtime.media
    }

    /// Wraps the shared state and starts the background advancer, if any.
    pub(crate) fn start(shared: Shared) -> Result<Heap> {
        // The mapping learns how far the heap is in use (for the collapse into huge pages)
        // once, here; the allocator tells it as the mark moves.
        shared.runtime.alloc.report_in_use(&shared.runtime.media);
        let shared = Arc::new(shared);
        let advancer = match shared.runtime.epochs.length {
            EpochLength::Manual => None,
            EpochLength::Every(length) => {
                let for_thread = Arc::clone(&shared);
                let handle = std::thread::Builder::new()
                    .name("montage-epoch".to_owned())
                    .spawn(move || crate::epoch::run_advancer(&for_thread.runtime, length))
                    .map_err(|e| Error::io("spawn the epoch advancer", Path::new("<thread>"), e))?;
                Some(handle)
            }
        };
        Ok(Heap {
            inner: Arc::new(Inner {
                shared,
                advancer: Mutex::new(advancer),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    // ---- epochs ----------------------------------------------------------------------

    /// The current epoch: the one new operations join, and the value of the stored epoch
    /// word.
    pub fn epoch(&self) -> Epoch {
        self.shared().runtime.epochs.current()
    }

    /// Makes everything that completed before this call durable: returns once the stored
    /// epoch is at least two past the epoch of every operation that ended before the call
    /// (at once when nothing is waiting to be written back; otherwise after advancing the clock
    /// two epochs past the call). Concurrent callers share the same advances (group commit).
    ///
    /// # Errors
    ///
    /// [`Error::SyncInOperation`] if called inside an operation on this heap (it would wait
    /// for itself); [`Error::ClockStopped`] if an advance failed, or the advance's own error.
    pub fn sync(&self) -> Result<()> {
        self.runtime_outside_op()?.sync()
    }

    /// Advances the clock by one epoch now (the background advancer does this every epoch
    /// length; with [`EpochLength::Manual`] only this and [`sync`](Self::sync) do).
    ///
    /// # Errors
    ///
    /// As [`sync`](Self::sync).
    pub fn advance_epoch(&self) -> Result<Epoch> {
        self.runtime_outside_op()?.advance()
    }

    /// Begins an operation in the current epoch. Dropping the guard ends it.
    ///
    /// # Errors
    ///
    /// [`Error::NestedOperation`] if this thread already has an operation open on this heap;
    /// [`Error::ClockStopped`] if an epoch advance failed; [`Error::Closed`] once the heap is
    /// closed.
    #[inline]
    pub fn begin_op(&self) -> Result<OpGuard<'_>> {
        OpGuard::begin(&self.shared().runtime)
    }

    /// The epoch of the last operation the calling thread committed on this heap, if any.
    ///
    /// A structure's methods run their own operations; this tells the caller which epoch
    /// the last one took effect in (for example to record what a later crash may keep, or
    /// to know that a `sync` returning after the clock passed that epoch plus two covers it).
    pub fn last_op_epoch(&self) -> Option<Epoch> {
        crate::epoch::op::last_commit(self.shared().runtime.epochs.instance())
    }

    /// Runs `op` in an operation until it commits: when it fails with [`Error::Aborted`], the
    /// attempt is rolled back and `op` runs again in a new operation. Any other error rolls
    /// the attempt back and is returned.
    ///
    /// # Errors
    ///
    /// The first error `op` returns other than `Aborted`, or an error from `begin_op`.
    ///
    /// An attempt that fails with [`Error::OutOfSpace`] while freed blocks still wait for
    /// reclamation is retried too, after the clock has been advanced until they are given
    /// back (a few epochs; a few rounds at most). So a delete, whose anti-block may need the
    /// space earlier deletes are about to return, and an insert right after deletes, fail
    /// for want of space only when the heap is full of live payloads.
    #[inline]
    pub fn run_op<T>(&self, mut op: impl FnMut(&OpGuard<'_>) -> Result<T>) -> Result<T> {
        let mut retry = Retry::default();
        loop {
            let guard = self.begin_op()?;
            match op(&guard) {
                Ok(value) => {
                    drop(guard);
                    return Ok(value);
                }
                Err(err) => {
                    guard.abort()?;
                    self.again(err, &mut retry)?;
                }
            }
        }
    }

    /// [`run_op`](Self::run_op) for a body that holds something past its return: `op`
    /// returns its result and what it holds (lock guards, and how to take back the DRAM
    /// changes it made), which is dropped only after the attempt's operation has ended,
    /// committed or rolled back, and before the next attempt begins.
    ///
    /// A structure that changes its DRAM state before its operation can still fail keeps
    /// its locks this way until the rollback has made the blocks it wrote unreachable and
    /// the ones it replaced live again, and only then takes its DRAM changes back (in the
    /// held value's `Drop`): no other operation sees its state name a block the rollback
    /// changed. The clock advances that a full heap's retry makes come after the drop, so
    /// no operation waiting for those locks holds the clock back meanwhile.
    ///
    /// # Errors
    ///
    /// As [`run_op`](Self::run_op).
    #[inline]
    pub fn run_op_holding<T, H>(
        &self,
        mut op: impl FnMut(&OpGuard<'_>) -> (Result<T>, H),
    ) -> Result<T> {
        let mut retry = Retry::default();
        loop {
            let guard = self.begin_op()?;
            let (result, held) = op(&guard);
            match result {
                Ok(value) => {
                    drop(guard);
                    drop(held);
                    return Ok(value);
                }
                Err(err) => {
                    let aborted = guard.abort();
                    drop(held);
                    aborted?;
                    self.again(err, &mut retry)?;
                }
            }
        }
    }

    /// After an attempt of [`run_op`](Self::run_op) failed with `err` and was rolled back:
    /// `Ok` to run it again (after yielding, or after reclaiming space), or the error to
    /// return.
    fn again(&self, err: Error, retry: &mut Retry) -> Result<()> {
        match err {
            Error::Aborted => {
                std::thread::yield_now();
                Ok(())
            }
            Error::OutOfSpace { .. } => {
                // Nothing waiting may also mean another thread's advances have just
                // given the blocks back: one more attempt tells.
                let waited = self.reclaim_all()?;
                if retry.reclaim_rounds == RECLAIM_ROUNDS || (!waited && retry.retried_idle) {
                    return Err(err);
                }
                retry.retried_idle |= !waited;
                retry.reclaim_rounds += 1;
                Ok(())
            }
            other => Err(other),
        }
    }

    /// Advances the clock until no freed block waits for reclamation (at most
    /// [`RECLAIM_ADVANCES`] times); returns whether anything was waiting.
    fn reclaim_all(&self) -> Result<bool> {
        let runtime = self.runtime_outside_op()?;
        if !runtime.epochs.reclamation_pending()? {
            return Ok(false);
        }
        for _ in 0..RECLAIM_ADVANCES {
            runtime.advance()?;
            if !runtime.epochs.reclamation_pending()? {
                break;
            }
        }
        Ok(true)
    }

    /// How many epoch advances this heap has made since it was opened.
    pub fn advances(&self) -> u64 {
        self.shared().runtime.epochs.advances()
    }
}

/// How many times [`Heap::run_op`] retries an operation that found no space while freed
/// blocks waited for reclamation.
const RECLAIM_ROUNDS: u32 = 4;

/// How far [`Heap::run_op`]'s retries after a full heap have gone.
#[derive(Debug, Default)]
struct Retry {
    reclaim_rounds: u32,
    retried_idle: bool,
}

/// The most advances one such round makes: a block retired in epoch `e` is invalidated at
/// the advance to `e + 3` and reused after the next, an anti-block one advance later.
const RECLAIM_ADVANCES: u32 = 8;

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("path", &self.path())
            .field("size", &self.size())
            .field("backend", &self.shared().backend)
            .field(
                "creation_id",
                &format_args!("{:#018x}", self.shared().geometry.creation_id),
            )
            .field("stats", &self.shared().runtime.alloc.stats())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Closes the heap once (see [`Heap::close`]); a second call fails with
    /// [`Error::Closed`].
    fn shutdown(&self) -> Result<()> {
        let shared = &*self.shared;
        // From here on no operation begins, and the ones running are waited for.
        if !shared.runtime.epochs.close() {
            return Err(Error::Closed);
        }
        shared.runtime.epochs.request_shutdown();
        let advancer = self
            .advancer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(advancer) = advancer {
            // A panicked advancer stopped the clock; the sync below reports it.
            let _ = advancer.join();
        }
        // A final sync: everything completed so far becomes durable.
        shared.runtime.sync_closing()?;
        shared
            .runtime
            .epochs
            .drain_pending_frees(&shared.runtime.media, &shared.runtime.alloc)?;
        shared.runtime.media.store(CLEAN_SHUTDOWN_OFFSET, 1)?;
        // PERSIST: the clean flag is the last thing written; everything before it is durable
        // by the drains above and by the callers' own persists.
        shared.runtime.media.persist(CLEAN_SHUTDOWN_OFFSET, 8)?;
        // A journal heap leaves its heap file complete, so the next open replays nothing.
        match shared.runtime.media.journal() {
            Some(journal) => journal.checkpoint(),
            None => Ok(()),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle is gone. Best effort, as a file's Drop: errors cannot be reported
        // from here (`close` reports them), and a heap closed already has nothing to do.
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::config::HeapConfig;
    use crate::raw::BlockSpec;

    /// Makes the heap's next flush of the journal or the heap file fail as a device error
    /// would.
    fn fail_next_write_back(heap: &Heap) {
        let journal = heap.media().journal().expect("a journal heap");
        journal.fail_next.store(true, Ordering::Relaxed);
    }

    /// Operations do not nest, and `sync` is refused inside one, whether the thread owns its
    /// slot or shares one: two threads at once in a heap of one slot, so at least one of them
    /// shares.
    #[test]
    fn nesting_and_sync_inside_an_operation_are_refused_in_owned_and_shared_slots() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20).thread_slots(1)).unwrap();
        let both = std::sync::Barrier::new(2);
        let owned: Vec<bool> = std::thread::scope(|s| {
            let check = || {
                let op = heap.begin_op().unwrap();
                // Both threads hold their ids (and so their slots) until both are here.
                both.wait();
                assert!(matches!(heap.begin_op(), Err(Error::NestedOperation)));
                assert!(matches!(heap.sync(), Err(Error::SyncInOperation)));
                let owned = op.in_owned_slot();
                drop(op);
                heap.sync().unwrap();
                heap.run_op(|_| Ok(())).unwrap();
                owned
            };
            let threads = [s.spawn(check), s.spawn(check)];
            threads.map(|t| t.join().unwrap()).to_vec()
        });
        assert!(
            owned.contains(&false),
            "neither thread ran in a shared slot"
        );
    }

    /// A heap file on tmpfs created far larger than what it holds collapses what it holds
    /// into huge pages, not its whole file: the allocator tells the mapping how far it has
    /// handed out spans.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_heap_on_tmpfs_collapses_what_it_holds_and_no_more() {
        use crate::base::mapping::tests::{can_collapse, huge_kib, wait_for_huge};
        let Some(shm) = can_collapse() else {
            eprintln!("skipped: no tmpfs at /dev/shm, or a kernel that cannot collapse its pages");
            return;
        };
        let dir = tempfile::tempdir_in(shm).unwrap();
        let size = 64 << 20;
        let config = HeapConfig::new(dir.path().join("large.heap"))
            .size(size)
            .max_size(size);
        let heap = Heap::create(&config).unwrap();
        let base = heap.shared().runtime.media.region().mapping().base();
        let owner = heap.register("t").unwrap();
        let payload = [7u8; 1000];
        for _ in 0..8 << 10 {
            heap.run_op(|op| op.alloc(owner, 1, &payload).map(drop))
                .unwrap();
        }
        // 8 MiB of payloads: their spans, and the heap's metadata before them.
        wait_for_huge(base, 8 << 20);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let huge = huge_kib(base) << 10;
        assert!(
            huge <= 16 << 20,
            "{huge} bytes of a {size}-byte heap holding 8 MiB collapsed"
        );
    }

    /// INV-HDR-2 on the journal: however long nobody syncs, the clock never runs
    /// `Epoch::JOURNAL_LEAD` records past the last durable one, so recovery's window of
    /// epochs a torn header can be from stays bounded.
    #[test]
    fn the_journal_clock_stays_within_its_lead_of_the_last_durable_record() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("lead.heap"))
            .size(1 << 20)
            .journal_size(64 << 20)
            .epoch_length(crate::EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let journal = heap.shared().runtime.media.journal().unwrap();
        let mut most = 0;
        for _ in 0..Epoch::JOURNAL_LEAD + 100 {
            heap.advance_epoch().unwrap();
            most = most.max(journal.uncommitted());
        }
        assert!(
            most >= Epoch::JOURNAL_LEAD / 2 - 1,
            "never near the bound: {most}"
        );
        assert!(
            most <= Epoch::JOURNAL_LEAD / 2,
            "{most} records uncommitted"
        );
    }

    #[test]
    fn a_failed_write_back_poisons_every_later_write_and_sync() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("poison.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::new(1), 1), b"before")
            .unwrap();
        fail_next_write_back(&heap);
        assert!(matches!(
            heap.raw().persist_block(block),
            Err(Error::WriteBack { .. })
        ));
        assert!(matches!(heap.raw().fence(), Err(Error::Poisoned)));
        assert!(matches!(
            heap.raw().write(block, 0, b"after"),
            Err(Error::Poisoned)
        ));
        assert!(matches!(
            heap.raw().alloc(BlockSpec::new(Epoch::new(1), 2), 8),
            Err(Error::Poisoned)
        ));
        assert!(matches!(heap.close(), Err(Error::Poisoned)));
        // The heap was not marked clean; reopening recovers it like after a crash.
        let heap = Heap::open(&config).unwrap();
        assert!(!heap.recovery_report().clean_shutdown);
    }

    #[test]
    fn a_failed_advance_stops_the_clock_and_sync_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("stopped.heap"))
            .size(1 << 20)
            .epoch_length(EpochLength::Manual);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        heap.run_op(|op| op.alloc(owner, 1, b"payload")).unwrap();
        fail_next_write_back(&heap);
        assert!(matches!(heap.sync(), Err(Error::WriteBack { .. })));
        // From now on nothing can be promised durable: every caller hears it, none hangs.
        assert!(matches!(heap.sync(), Err(Error::ClockStopped { .. })));
        assert!(matches!(heap.begin_op(), Err(Error::ClockStopped { .. })));
        assert!(matches!(
            heap.advance_epoch(),
            Err(Error::ClockStopped { .. })
        ));
    }

    #[test]
    fn recovery_reports_progress() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("progress.heap");
        let heap = Heap::create(&HeapConfig::new(&path).size(4 << 20)).unwrap();
        let owner = heap.register("kv").unwrap();
        for i in 0..3000u32 {
            heap.run_op(|op| op.alloc(owner, 1, &i.to_le_bytes()))
                .unwrap();
        }
        heap.close().unwrap();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&seen);
        let config = HeapConfig::new(&path)
            .recovery_threads(1)
            .on_recovery_progress(move |n| sink.lock().unwrap().push(n));
        let heap = Heap::open(&config).unwrap();
        assert_eq!(heap.recovery_report().blocks_kept, 3000);
        let seen = seen.lock().unwrap();
        assert!(
            seen.len() >= 2,
            "progress was reported {} times",
            seen.len()
        );
        assert!(
            seen.windows(2).all(|w| w[0].read <= w[1].read),
            "progress went backwards"
        );
        let total = 2 * heap.recovery_report().blocks_scanned;
        assert!(seen.iter().all(|p| p.total == total && p.read <= total));
        assert_eq!(seen.last().unwrap().read, total);
    }

    #[test]
    fn heap_is_send_and_sync_and_shared_by_reference() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Heap>();
        assert_send_sync::<HeapConfig>();
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let owner = heap.register("kv").unwrap();
        std::thread::scope(|s| {
            for i in 0..2u8 {
                let heap = &heap;
                s.spawn(move || heap.run_op(|op| op.alloc(owner, 1, &[i])).unwrap());
            }
        });
        assert_eq!(
            heap.collect(ScanFilter::all().owner(owner)).unwrap().len(),
            2
        );
    }

    #[test]
    fn closing_one_handle_refuses_writes_through_every_other() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("clones.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let block = heap.run_op(|op| op.alloc(owner, 1, b"kept")).unwrap();
        let other = heap.clone();
        heap.close().unwrap();
        assert!(matches!(other.begin_op(), Err(Error::Closed)));
        assert!(matches!(other.sync(), Err(Error::Closed)));
        assert!(matches!(other.advance_epoch(), Err(Error::Closed)));
        assert!(matches!(other.register("new"), Err(Error::Closed)));
        assert!(matches!(
            other.raw().alloc(BlockSpec::new(Epoch::new(1), 1), 8),
            Err(Error::Closed)
        ));
        assert!(matches!(
            other.raw().write(block, 0, b"x"),
            Err(Error::Closed)
        ));
        assert!(matches!(other.clone().close(), Err(Error::Closed)));
        // Reads still see the closed heap, and the file stays locked while a handle lives.
        assert_eq!(other.read_payload(block).unwrap(), b"kept");
        assert!(matches!(Heap::open(&config), Err(Error::Locked { .. })));
        drop(other);
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        let found = heap.collect(ScanFilter::all().owner(owner)).unwrap();
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn dropping_the_last_handle_closes_the_heap_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("last.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let other = heap.clone();
        drop(heap);
        other.run_op(|op| op.alloc(owner, 1, b"late")).unwrap();
        drop(other);
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        assert_eq!(
            heap.collect(ScanFilter::all().owner(owner)).unwrap().len(),
            1
        );
    }

    #[test]
    fn close_waits_for_a_running_operation_and_keeps_its_writes() {
        let dir = tempfile::tempdir().unwrap();
        let config = HeapConfig::new(dir.path().join("running.heap")).size(1 << 20);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let (started, wait_started) = std::sync::mpsc::channel();
        let worker = {
            let heap = heap.clone();
            std::thread::spawn(move || {
                let op = heap.begin_op().unwrap();
                op.alloc(owner, 1, b"first").unwrap();
                started.send(()).unwrap();
                // Close is called now; it must wait for this operation to end.
                std::thread::sleep(std::time::Duration::from_millis(100));
                op.alloc(owner, 1, b"second").unwrap();
                drop(op);
                assert!(matches!(heap.begin_op(), Err(Error::Closed)));
            })
        };
        wait_started.recv().unwrap();
        heap.close().unwrap();
        worker.join().unwrap();
        let heap = Heap::open(&config).unwrap();
        assert!(heap.recovery_report().clean_shutdown);
        let mut found: Vec<Vec<u8>> = heap
            .collect(ScanFilter::all().owner(owner))
            .unwrap()
            .into_iter()
            .map(|info| heap.read_payload(info.block).unwrap())
            .collect();
        found.sort();
        assert_eq!(found, [b"first".to_vec(), b"second".to_vec()]);
    }

    #[test]
    fn close_inside_an_operation_is_refused_and_leaves_the_heap_open() {
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        let op = heap.begin_op().unwrap();
        assert!(matches!(heap.clone().close(), Err(Error::SyncInOperation)));
        drop(op);
        heap.register("still-open").unwrap();
        heap.close().unwrap();
    }

    /// A length too long to schedule (no time lies that far ahead) leaves the advancer
    /// waiting without a deadline: `sync` still advances the clock itself, and close still
    /// wakes the advancer and stops it.
    #[test]
    fn a_clock_too_slow_to_schedule_still_syncs_and_closes() {
        let config = HeapConfig::in_memory(1 << 20)
            .backend(BackendKind::Pmem)
            .epoch_length(EpochLength::Every(std::time::Duration::MAX));
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        heap.run_op(|op| op.alloc(owner, 1, b"a")).unwrap();
        let before = heap.advances();
        heap.sync().unwrap();
        assert!(heap.advances() > before);
        heap.close().unwrap();
    }

    #[test]
    fn an_idle_heap_stops_advancing_and_an_idle_sync_is_free() {
        let config = HeapConfig::in_memory(1 << 20)
            .backend(BackendKind::Pmem)
            .epoch_length(EpochLength::Every(std::time::Duration::from_millis(1)));
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("kv").unwrap();
        let block = heap.run_op(|op| op.alloc(owner, 1, b"a")).unwrap();
        heap.run_op(|op| op.delete(block)).unwrap();
        // Let the clock write back and reclaim everything, then watch it stand still. Only
        // a window without an advance *and* nothing left to write back or reclaim is idle:
        // on a loaded machine the clock's thread can miss a window with work still pending,
        // and the sync below would then rightly advance.
        let mut previous = heap.advances();
        let settled = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let now = heap.advances();
            let pending = heap.shared().runtime.epochs.reclamation_pending().unwrap();
            let idle = now == previous && !pending;
            previous = now;
            idle
        });
        assert!(settled, "the clock kept advancing on an idle heap");
        let before = heap.advances();
        heap.sync().unwrap();
        assert_eq!(
            heap.advances(),
            before,
            "a sync with nothing to write advanced the clock"
        );
        // With something to write, sync advances.
        heap.run_op(|op| op.alloc(owner, 1, b"b")).unwrap();
        heap.sync().unwrap();
        assert!(heap.advances() > before);
    }
}
