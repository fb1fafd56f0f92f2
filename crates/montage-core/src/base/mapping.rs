//! Establishes and tears down the memory mappings a heap lives in: a shared file mapping
//! (`MAP_SYNC` first where persistent memory is wanted, plain `MAP_SHARED` otherwise), a
//! private copy-on-write one (a heap opened read-only) or anonymous memory; the shared and
//! anonymous ones ask for huge pages. This and `region.rs` are the only producers of
//! pointers into a heap.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the one place that maps

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

/// Allocates the file's blocks for `[offset, offset + len)`, lengthening the file if it is
/// shorter, so that stores through a mapping of them never meet a full disk (which would be
/// a `SIGBUS`): a full disk is this call's `ENOSPC` instead.
pub(crate) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let too_big = || io::Error::from(io::ErrorKind::InvalidInput);
    let offset = libc::off_t::try_from(offset).map_err(|_| too_big())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_big())?;
    // SAFETY: `posix_fallocate` reads only its integer arguments and acts on the open
    // descriptor `file` owns; it touches no memory of this process.
    let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) };
    if err == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(err))
    }
}

/// The bytes the file system holding `file` has free for an unprivileged writer; `None`
/// where it cannot say: `fstatvfs` fails, or the file system states no size at all (a tmpfs
/// mounted `size=0`, which has no limit, or a FUSE file system that does not answer
/// `statfs`, whose zeros mean nothing).
pub(crate) fn free_space(file: &File) -> Option<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `fstatvfs` writes one `statvfs` into the pointer it is given, which points to
    // uninitialised memory of exactly that type and size, owned by this frame.
    let err = unsafe { libc::fstatvfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if err != 0 {
        return None;
    }
    // SAFETY: `fstatvfs` returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    // The fields' C types are 64-bit here but not on every target.
    #[allow(clippy::useless_conversion)]
    let sized = u64::from(stat.f_blocks) > 0;
    #[allow(clippy::useless_conversion)]
    sized.then(|| u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// The size of a huge page on x86-64 (a PMD's reach).
const HUGE_PAGE: usize = 2 << 20;

/// One mapping of a heap's bytes. Dropping it unmaps them.
#[derive(Debug)]
pub(crate) struct Mapping {
    kind: Kind,
    /// For a tmpfs file: the thread turning its pages into huge ones.
    collapser: Option<Collapser>,
}

#[derive(Debug)]
enum Kind {
    /// A `memmap2` mapping (file or anonymous), accessed through raw pointers only.
    Raw(memmap2::MmapRaw),
    /// A mapping made with libc, for what memmap2 cannot ask for: `MAP_SHARED_VALIDATE |
    /// MAP_SYNC` on a DAX file (`dax`), or a tmpfs file placed at a huge-page boundary.
    Libc {
        ptr: NonNull<u8>,
        len: usize,
        dax: bool,
    },
}

impl Mapping {
    /// Maps `len` bytes of `file` shared. With `want_sync`, tries `MAP_SYNC` first (so CPU
    /// flushes reach the media without `msync`), falling back to a plain shared mapping when
    /// the file system is not DAX. With `huge`, asks for huge pages, and on tmpfs collapses
    /// the file's pages into them ([`Collapser`]).
    pub(crate) fn file(
        file: &File,
        len: usize,
        want_sync: bool,
        huge: bool,
    ) -> io::Result<Mapping> {
        if want_sync && let Some(mapping) = Self::try_map_sync(file, len)? {
            return Ok(mapping);
        }
        if huge && let Some(mapping) = Self::try_map_tmpfs(file, len)? {
            return Ok(mapping);
        }
        let raw = memmap2::MmapOptions::new().len(len).map_raw(file)?;
        let mapping = Mapping {
            kind: Kind::Raw(raw),
            collapser: None,
        };
        Ok(mapping.with_huge_pages(huge))
    }

    /// Maps `len` bytes of `file` private and copy-on-write: stores reach this process's
    /// memory only, never the file, which may be open for reading only.
    pub(crate) fn private(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: memmap2 marks file mappings unsafe because another process may change
        // the file under them; the mapping is turned into an `MmapRaw` at once and reached
        // only through `Region`'s bounds-checked atomic accesses, never as a Rust slice, and
        // the caller holds the file's shared lock, which every writer's exclusive lock
        // excludes.
        let copy = unsafe { memmap2::MmapOptions::new().len(len).map_copy(file)? };
        Ok(Mapping {
            kind: Kind::Raw(memmap2::MmapRaw::from(copy)),
            collapser: None,
        })
    }

    /// Maps `len` bytes of zeroed anonymous memory; with `huge`, asks for huge pages.
    pub(crate) fn anonymous(len: usize, huge: bool) -> io::Result<Mapping> {
        let anon = memmap2::MmapRaw::from(memmap2::MmapOptions::new().len(len).map_anon()?);
        let mapping = Mapping {
            kind: Kind::Raw(anon),
            collapser: None,
        };
        Ok(mapping.with_huge_pages(huge))
    }

    #[cfg(target_os = "linux")]
    fn try_map_sync(file: &File, len: usize) -> io::Result<Option<Mapping>> {
        // SAFETY:
        // - a null hint lets the kernel choose the address, so no existing mapping is replaced;
        // - `len` is the file's length, checked by the caller, and the fd is open read-write;
        // - the result is checked against MAP_FAILED before it is used.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            // EOPNOTSUPP: not a DAX file system; EINVAL: a kernel without MAP_SYNC.
            return match err.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::EINVAL) => Ok(None),
                _ => Err(err),
            };
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("null mapping"))?;
        Ok(Some(Mapping {
            kind: Kind::Libc {
                ptr,
                len,
                dax: true,
            },
            collapser: None,
        }))
    }

    #[cfg(not(target_os = "linux"))]
    fn try_map_sync(_file: &File, _len: usize) -> io::Result<Option<Mapping>> {
        Ok(None)
    }

    /// Maps `len` bytes of `file` shared at an address that is a multiple of 2 MiB, if the
    /// file is on tmpfs, and starts the thread that collapses its pages into huge pages
    /// ([`Collapser`]); `None` on another file system. A tmpfs mounted without `huge=` (as
    /// `/dev/shm` is) neither aligns a mapping nor gives it huge pages by itself, and a huge
    /// page can only back a range whose address and file offset are both aligned.
    #[cfg(target_os = "linux")]
    fn try_map_tmpfs(file: &File, len: usize) -> io::Result<Option<Mapping>> {
        if !on_tmpfs(file) {
            return Ok(None);
        }
        let span = len
            .checked_add(HUGE_PAGE)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a null hint lets the kernel choose the address, so no existing mapping is
        // replaced; the reservation is inaccessible (`PROT_NONE`) and holds no memory.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let reserved = reserved.cast::<u8>();
        let head = reserved.addr().next_multiple_of(HUGE_PAGE) - reserved.addr();
        let aligned = reserved.wrapping_add(head);
        // SAFETY: `[aligned, aligned + len)` lies inside the reservation made above (`head`
        // is under `HUGE_PAGE`, and the reservation is `len + HUGE_PAGE` long), which this
        // function owns and nothing else uses, so `MAP_FIXED` replaces only its own pages;
        // `len` and the descriptor are checked by the caller as for any file mapping.
        let ptr = unsafe {
            libc::mmap(
                aligned.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        let err = (ptr == libc::MAP_FAILED).then(io::Error::last_os_error);
        // Give back what the file's mapping does not cover: all of the reservation if the
        // mapping failed, else the pieces before and after it.
        let (keep_from, keep_len) = if err.is_some() { (0, 0) } else { (head, len) };
        for (from, to) in [(0, keep_from), (keep_from + keep_len, span)] {
            if to > from {
                // SAFETY: `[reserved + from, reserved + to)` is part of the reservation made
                // above and outside the file's mapping; nothing points into it.
                unsafe { libc::munmap(reserved.wrapping_add(from).cast(), to - from) };
            }
        }
        if let Some(err) = err {
            return Err(err);
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("null mapping"))?;
        let mapping = Mapping {
            kind: Kind::Libc {
                ptr,
                len,
                dax: false,
            },
            collapser: Collapser::start(ptr),
        };
        Ok(Some(mapping.with_huge_pages(true)))
    }

    #[cfg(not(target_os = "linux"))]
    fn try_map_tmpfs(_file: &File, _len: usize) -> io::Result<Option<Mapping>> {
        Ok(None)
    }

    /// Tells the mapping that its first `len` bytes are backed by the file, so that the
    /// collapsing thread, if it has one, may work on them once they are in use.
    pub(crate) fn backed(&self, len: usize) {
        if let Some(collapser) = &self.collapser {
            collapser.extend(len.min(self.len()));
        }
    }

    /// Tells the mapping that bytes up to `end` are in use (the heap has handed out blocks
    /// that far), so that the collapsing thread, if it has one, collapses them; what lies
    /// past the last block handed out stays in small pages until then.
    pub(crate) fn in_use(&self, end: usize) {
        if let Some(collapser) = &self.collapser {
            collapser.use_up_to(end.min(self.len()));
        }
    }

    /// With `huge`, asks the kernel to back the mapping with transparent huge pages (2 MiB on
    /// x86-64) where it can: anonymous memory when THP is `madvise` or `always`, a tmpfs file
    /// when the mount says `huge=advise` (or more). A DAX mapping needs no asking (the kernel
    /// maps it in 2 MiB pages wherever the file's extents allow) and a page-cache file cannot
    /// have them, so there the advice changes nothing.
    ///
    /// Reads of a large heap are random: with 4 KiB pages nearly every one misses the TLB as
    /// well as the cache, and the page walk is a dependent miss of its own (at a million
    /// entries it cost the map's reads 15% to 20% of their throughput; `docs/PERFORMANCE.md`,
    /// sixth round). Advice only: a kernel without THP refuses it, and the heap works the same.
    fn with_huge_pages(self, huge: bool) -> Mapping {
        #[cfg(target_os = "linux")]
        if huge {
            // SAFETY: `[base, base + len)` is this mapping, which `self` owns; the advice
            // changes how its pages are backed, never what they hold.
            unsafe { libc::madvise(self.base().as_ptr().cast(), self.len(), libc::MADV_HUGEPAGE) };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = huge;
        self
    }

    /// The first byte of the mapping.
    pub(crate) fn base(&self) -> NonNull<u8> {
        match &self.kind {
            Kind::Raw(raw) => NonNull::new(raw.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            Kind::Libc { ptr, .. } => *ptr,
        }
    }

    /// The mapping's length in bytes.
    pub(crate) fn len(&self) -> usize {
        match &self.kind {
            Kind::Raw(raw) => raw.len(),
            Kind::Libc { len, .. } => *len,
        }
    }

    /// Whether CPU cache flushes reach the media directly (`MAP_SYNC` on a DAX file).
    pub(crate) fn is_dax(&self) -> bool {
        matches!(self.kind, Kind::Libc { dax: true, .. })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // First: the thread may be in a call on the mapping's addresses.
        drop(self.collapser.take());
        if let Kind::Libc { ptr, len, .. } = self.kind {
            // SAFETY: `ptr`/`len` are exactly what mmap returned; after drop no pointer into
            // the mapping is used, because `Region` (its only user) owns this `Mapping`, and
            // the collapsing thread has been joined above.
            let _ = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
    }
}

/// Whether `file` is on tmpfs.
#[cfg(target_os = "linux")]
fn on_tmpfs(file: &File) -> bool {
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fstatfs` writes one `statfs` into the pointer it is given, which points to
    // uninitialised memory of exactly that type and size, owned by this frame.
    if unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: `fstatfs` returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    stat.f_type == libc::TMPFS_MAGIC
}

/// Collapses a tmpfs mapping's pages into huge pages (`MADV_COLLAPSE`, Linux 6.1), 2 MiB at
/// a time, on a thread of its own at the lowest scheduling priority, as far as the file is
/// backed ([`Mapping::backed`]) and the heap is in use ([`Mapping::in_use`]: the allocator
/// hands out its spans lowest first, so a heap created far larger than what it holds
/// collapses what it holds, not its whole file). `MADV_COLLAPSE` gives a tmpfs file huge
/// pages whatever the mount says (short of the administrator's `shmem_enabled=deny`) and
/// changes how the pages are backed, never what they hold, while other threads store to
/// them (the kernel's own `khugepaged` does the same to running processes), with one
/// exception the thread steps around. On Linux 6.18, collapsing a range that holds pages
/// the file has allocated (`fallocate`) but nothing has written yet, on a tmpfs mounted
/// `huge=within_size`, loses stores made through the mapping while the collapse runs:
/// about half the rounds of 128 MiB written by two threads found huge pages zero past
/// their first 64 KiB, where with the collapses off, or each range faulted in for writing
/// first, none of 24 did (`stores_racing_with_the_collapse_of_unwritten_pages_are_kept`
/// fails within two rounds without the fault-in). So the thread faults every page of a
/// range in for writing (`MADV_POPULATE_WRITE`, which stores nothing) before it collapses
/// the range; the kernel's `khugepaged`, which collapses the same file in its own time,
/// lost nothing in the same runs. The file keeps its huge pages after the heap closes, so
/// a heap reopened later has them at once. It costs about 1.4 s of a core per GiB in use,
/// once; a kernel that refuses it stops the thread, and the heap works the same on small
/// pages.
#[derive(Debug)]
struct Collapser {
    state: std::sync::Arc<CollapseState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct CollapseState {
    /// How many bytes from the start of the mapping the file backs.
    backed: std::sync::atomic::AtomicUsize,
    /// How many bytes from the start of the mapping are in use ([`Mapping::in_use`]).
    in_use: std::sync::atomic::AtomicUsize,
    stop: std::sync::atomic::AtomicBool,
}

/// The mapping's base, for the collapsing thread, which hands it to `madvise` and never
/// reads or writes through it.
struct Base(NonNull<u8>);

// SAFETY: the thread only passes the address to `madvise`, which neither reads nor writes the
// memory for this process; the mapping outlives the thread (`Mapping::drop` joins it first).
unsafe impl Send for Base {}

impl Collapser {
    #[cfg(target_os = "linux")]
    fn start(base: NonNull<u8>) -> Option<Collapser> {
        let state = std::sync::Arc::new(CollapseState::default());
        let shared = std::sync::Arc::clone(&state);
        let base = Base(base);
        let thread = std::thread::Builder::new()
            .name("montage-huge-pages".into())
            .spawn(move || collapse(&base, &shared))
            .ok()?;
        Some(Collapser {
            state,
            thread: Some(thread),
        })
    }

    fn extend(&self, backed: usize) {
        // ORDERING: the file's bytes were allocated before this call (a system call the
        // kernel orders); the thread needs no more than the number.
        let before = self.state.backed.fetch_max(backed, Ordering::Relaxed);
        if before < backed {
            self.wake();
        }
    }

    fn use_up_to(&self, end: usize) {
        // ORDERING: a number for the thread, which reads no memory of the heap.
        let before = self.state.in_use.fetch_max(end, Ordering::Relaxed);
        if before < end {
            self.wake();
        }
    }

    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }
}

impl Drop for Collapser {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// How often a range the kernel could not collapse now is tried again, and how long
/// after: its pages may have been busy (`EAGAIN`), or no huge page was free (`ENOMEM`).
const COLLAPSE_TRIES: u32 = 4;
/// See [`COLLAPSE_TRIES`].
const COLLAPSE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// The collapsing thread's loop (see [`Collapser`]).
#[cfg(target_os = "linux")]
fn collapse(base: &Base, state: &CollapseState) {
    // SAFETY: `gettid` reads this thread's id and touches no memory.
    let tid = unsafe { libc::gettid() };
    // SAFETY: on this thread's own id (on Linux a thread id names one thread for
    // `PRIO_PROCESS`), `setpriority` changes only its scheduling.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid.unsigned_abs(), 19) };
    let (mut done, mut tries) = (0, 0);
    // ORDERING: `stop` and `backed` are plain flags; `unpark` and `join` order the rest.
    while !state.stop.load(Ordering::Relaxed) {
        let backed = state.backed.load(Ordering::Relaxed) / HUGE_PAGE * HUGE_PAGE;
        // The huge page holding the last byte in use is collapsed too, if the file backs it.
        let in_use = state.in_use.load(Ordering::Relaxed).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        if done >= backed.min(in_use) {
            std::thread::park();
            continue;
        }
        let range = base.0.as_ptr().wrapping_add(done).cast();
        // Every page of the range is written (or faulted in for writing) before the range
        // is collapsed, never after: see [`Collapser`] for the stores a collapse loses
        // otherwise.
        let advise = |advice| {
            // SAFETY: `[base + done, base + done + HUGE_PAGE)` lies inside the mapping
            // (`done + HUGE_PAGE <= backed <= its length`), which stays mapped until this
            // thread is joined; `MADV_POPULATE_WRITE` faults its pages in as a store would,
            // without storing, and `MADV_COLLAPSE` of pages all faulted in changes how they
            // are backed, never their contents.
            unsafe { libc::madvise(range, HUGE_PAGE, advice) == 0 }
        };
        let failed = !(advise(libc::MADV_POPULATE_WRITE) && advise(libc::MADV_COLLAPSE));
        if failed {
            // EINVAL: a kernel without MADV_POPULATE_WRITE (Linux 5.14) or MADV_COLLAPSE,
            // or huge pages denied to this file.
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                return;
            }
            // Otherwise not now: again a little later, and after a few tries the range
            // stays in small pages.
            tries += 1;
            if tries < COLLAPSE_TRIES {
                std::thread::park_timeout(COLLAPSE_AGAIN_AFTER);
                continue;
            }
        }
        tries = 0;
        done += HUGE_PAGE;
    }
}

#[cfg(all(test, target_os = "linux"))]
pub(crate) mod tests {
    use super::*;

    /// The value of `field` (`"VmFlags:"`, `"Rss:"`, ...) in what `/proc/self/smaps` gives
    /// for the mapping that holds `base` (the kernel may have merged the mapping with a
    /// neighbour whose flags are the same, so it need not start there).
    fn smaps_field(base: NonNull<u8>, field: &str) -> String {
        let at = base.as_ptr().addr();
        let holds = |line: &str| {
            let range = line.split_whitespace().next().unwrap_or_default();
            let Some((start, end)) = range.split_once('-') else {
                return false;
            };
            let parse = |hex| usize::from_str_radix(hex, 16).ok();
            matches!((parse(start), parse(end)), (Some(s), Some(e)) if s <= at && at < e)
        };
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|l| !holds(l));
        assert!(lines.next().is_some(), "no mapping holds {at:x}");
        // The mapping's fields end with its `VmFlags` line.
        let mut fields = lines.scan(false, |ended, line| {
            let this = (!*ended).then_some(line);
            *ended = line.starts_with("VmFlags:");
            this
        });
        fields
            .find_map(|l| l.strip_prefix(field))
            .unwrap_or_else(|| panic!("no {field} for the mapping at {at:x}"))
            .trim()
            .to_owned()
    }

    fn vm_flags(base: NonNull<u8>) -> String {
        smaps_field(base, "VmFlags:")
    }

    /// `hg` is the flag `MADV_HUGEPAGE` sets on a mapping; a kernel built without
    /// transparent huge pages refuses the advice, and then there is nothing to check.
    fn advised(base: NonNull<u8>) -> bool {
        vm_flags(base).split_whitespace().any(|flag| flag == "hg")
    }

    fn thp_available() -> bool {
        std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    }

    /// The kilobytes of the mapping at `base` that are in huge pages (`ShmemPmdMapped`).
    pub(crate) fn huge_kib(base: NonNull<u8>) -> u64 {
        let value = smaps_field(base, "ShmemPmdMapped:");
        value.trim_end_matches("kB").trim().parse().unwrap()
    }

    /// Whether this kernel can collapse a tmpfs file's pages (`MADV_COLLAPSE`, Linux 6.1,
    /// unless huge pages are denied to shared memory), and `/dev/shm` is a tmpfs to try it on.
    pub(crate) fn can_collapse() -> Option<std::path::PathBuf> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
        let mut version = release
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (version.next()?, version.next()?);
        let shmem =
            std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
        let shm = std::path::PathBuf::from("/dev/shm");
        let file = tempfile::tempfile_in(&shm).ok()?;
        ((major, minor) >= (6, 1) && !shmem.contains("[deny]") && on_tmpfs(&file)).then_some(shm)
    }

    /// Waits until `len` bytes of the mapping at `base` are in huge pages: the collapsing
    /// thread works in the background; at most a minute.
    pub(crate) fn wait_for_huge(base: NonNull<u8>, len: usize) {
        until_huge(base, len, || {
            std::thread::sleep(std::time::Duration::from_millis(10));
        });
    }

    /// Runs `step` until `len` bytes of the mapping at `base` are in huge pages, at most a
    /// minute.
    fn until_huge(base: NonNull<u8>, len: usize, mut step: impl FnMut()) {
        let started = std::time::Instant::now();
        while huge_kib(base) < (len >> 10) as u64 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "{} of {} KiB in huge pages after a minute",
                huge_kib(base),
                len >> 10
            );
            step();
        }
    }

    #[test]
    fn a_heap_file_on_tmpfs_is_placed_for_huge_pages_and_collapsed_into_them() {
        let Some(shm) = can_collapse() else {
            eprintln!("skipped: no tmpfs at /dev/shm, or a kernel that cannot collapse its pages");
            return;
        };
        let len = 8 << 20;
        let file = tempfile::tempfile_in(shm).unwrap();
        allocate(&file, 0, len as u64).unwrap();
        let mapping = Mapping::file(&file, len, false, true).unwrap();
        assert_eq!(mapping.base().as_ptr().addr() % HUGE_PAGE, 0);
        assert!(advised(mapping.base()));
        let base = mapping.base();
        let region = crate::base::region::Region::with_len(mapping, len);
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        region.write(0, &bytes).unwrap();
        // Only what is in use is collapsed: here the first huge page and the one holding the
        // byte past it.
        region.in_use(HUGE_PAGE as u64 + 1);
        wait_for_huge(base, 2 * HUGE_PAGE);
        // The thread, done, waits for more to be in use (a collapse of 2 MiB takes a few
        // milliseconds).
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            huge_kib(base),
            ((2 * HUGE_PAGE) >> 10) as u64,
            "collapsed past what is in use"
        );
        region.in_use(len as u64);
        wait_for_huge(base, len);
        let mut read = vec![0; len];
        region.read(0, &mut read).unwrap();
        assert!(read == bytes, "the collapse changed the bytes");
        // Without huge pages asked for, no thread and no advice.
        let plain = Mapping::file(&file, len, false, false).unwrap();
        assert!(plain.collapser.is_none());
        assert!(!advised(plain.base()));
        // Dropping joins the thread and unmaps.
        drop(region);
    }

    /// Stores racing with the collapse of their pages are all kept: a writer sweeps a
    /// tmpfs mapping again and again while the mark of what is in use moves on ahead of it
    /// and the thread collapses behind the mark.
    #[test]
    fn stores_racing_with_the_collapse_are_kept() {
        let Some(shm) = can_collapse() else {
            eprintln!("skipped: no tmpfs at /dev/shm, or a kernel that cannot collapse its pages");
            return;
        };
        let len = 32 << 20;
        let file = tempfile::tempfile_in(shm).unwrap();
        allocate(&file, 0, len as u64).unwrap();
        let mapping = Mapping::file(&file, len, false, true).unwrap();
        let base = mapping.base();
        let region = crate::base::region::Region::with_len(mapping, len);
        let step = 1 << 20;
        let passes = std::cell::Cell::new(0u64);
        let sweep = || {
            let pass = passes.get() + 1;
            passes.set(pass);
            for chunk in (0..len).step_by(step) {
                if pass == 1 {
                    region.in_use((chunk + step) as u64);
                }
                for at in (chunk..chunk + step).step_by(8) {
                    let word = region.word(at as u64).unwrap();
                    word.store((pass << 40) | at as u64, Ordering::Relaxed);
                }
            }
        };
        // Sweeps until the whole mapping is collapsed, so that every collapse raced with
        // stores, and at least three times.
        sweep();
        until_huge(base, len, sweep);
        while passes.get() < 3 {
            sweep();
        }
        let passes = passes.get();
        for at in (0..len).step_by(8) {
            let word = region.word(at as u64).unwrap().load(Ordering::Relaxed);
            assert_eq!(word, (passes << 40) | at as u64, "the word at {at:#x}");
        }
    }

    /// Stores into pages the file has allocated but nothing has written are all kept while
    /// the thread collapses them (see [`Collapser`]): two writers take 64 KiB chunks of a
    /// fresh file in turn, as the allocator hands out spans, mark them in use and fill them
    /// with 320-byte records, and the thread collapses behind the mark. Without the fault-in
    /// before each collapse about half the rounds lost some records on Linux 6.18.
    #[test]
    fn stores_racing_with_the_collapse_of_unwritten_pages_are_kept() {
        const LEN: usize = 192 << 20;
        const WRITTEN: usize = 128 << 20;
        const CHUNK: usize = 64 << 10;
        const RECORD: usize = 320;
        const ROUNDS: u64 = 10;
        let records = |chunk: usize| (chunk..=chunk + CHUNK - RECORD).step_by(RECORD);
        let word = |round: u64, at: usize, i: usize| (round << 56) | ((at + i) as u64);
        if can_collapse().is_none() {
            eprintln!("skipped: a kernel that cannot collapse a tmpfs file's pages");
            return;
        }
        montage_testkit::on_huge_tmpfs(2 * LEN as u64, |dir| {
            for round in 1..=ROUNDS {
                let file = tempfile::tempfile_in(dir).unwrap();
                allocate(&file, 0, LEN as u64).unwrap();
                let mapping = Mapping::file(&file, LEN, false, true).unwrap();
                let region = crate::base::region::Region::with_len(mapping, LEN);
                let next = std::sync::atomic::AtomicUsize::new(0);
                let write = || {
                    montage_testkit::lowest_priority();
                    loop {
                        let chunk = next.fetch_add(CHUNK, Ordering::Relaxed);
                        if chunk >= WRITTEN {
                            return;
                        }
                        region.in_use((chunk + CHUNK) as u64);
                        for at in records(chunk) {
                            for i in (0..RECORD).step_by(8) {
                                let store = region.word((at + i) as u64).unwrap();
                                store.store(word(round, at, i), Ordering::Relaxed);
                            }
                        }
                    }
                };
                std::thread::scope(|scope| {
                    scope.spawn(write);
                    write();
                });
                let mut lost = (0..WRITTEN).step_by(CHUNK).flat_map(records).filter(|&at| {
                    (0..RECORD).step_by(8).any(|i| {
                        let read = region
                            .word((at + i) as u64)
                            .unwrap()
                            .load(Ordering::Relaxed);
                        read != word(round, at, i)
                    })
                });
                if let Some(first) = lost.next() {
                    panic!(
                        "round {round}: {} records lost, the first at {first:#x}",
                        1 + lost.count()
                    );
                }
            }
        });
    }

    #[test]
    fn heap_mappings_ask_for_huge_pages() {
        if !thp_available() {
            eprintln!("skipped: this kernel has no transparent huge pages");
            return;
        }
        let anonymous = Mapping::anonymous(8 << 20, true).unwrap();
        assert!(advised(anonymous.base()), "{}", vm_flags(anonymous.base()));
        let plain = Mapping::anonymous(8 << 20, false).unwrap();
        assert!(!advised(plain.base()), "{}", vm_flags(plain.base()));

        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("heap"))
            .unwrap();
        allocate(&file, 0, 8 << 20).unwrap();
        let shared = Mapping::file(&file, 8 << 20, false, true).unwrap();
        assert!(advised(shared.base()), "{}", vm_flags(shared.base()));
        let plain = Mapping::file(&file, 8 << 20, false, false).unwrap();
        assert!(!advised(plain.base()), "{}", vm_flags(plain.base()));

        // A read-only copy is for inspection, which reads a heap once: no advice.
        let private = Mapping::private(&file, 8 << 20).unwrap();
        assert!(!advised(private.base()), "{}", vm_flags(private.base()));
    }
}
