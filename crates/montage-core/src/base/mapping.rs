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

/// The bytes the file system holding `file` has free for an unprivileged writer.
pub(crate) fn free_space(file: &File) -> io::Result<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `fstatvfs` writes one `statvfs` into the pointer it is given, which points to
    // uninitialised memory of exactly that type and size, owned by this frame.
    let err = unsafe { libc::fstatvfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if err != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fstatvfs` returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    // The fields' C types are 64-bit here but not on every target.
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// Asks the kernel to back `mapping` with transparent huge pages (2 MiB on x86-64) where it
/// can: anonymous memory when THP is `madvise` or `always`, a tmpfs file when the mount says
/// `huge=advise` (or more). A DAX mapping needs no asking (the kernel maps it in 2 MiB pages
/// wherever the file's extents allow) and a page-cache file cannot have them, so there the
/// advice changes nothing.
///
/// Reads of a large heap are random: with 4 KiB pages nearly every one misses the TLB as
/// well as the cache, and the page walk is a dependent miss of its own (at a million entries
/// it cost the map's reads 15% to 20% of their throughput; `docs/PERFORMANCE.md`, sixth
/// round). Advice only: a kernel without THP refuses it, and the heap works the same.
fn prefer_huge_pages(mapping: &memmap2::MmapRaw) {
    #[cfg(target_os = "linux")]
    let _ = mapping.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = mapping;
}

/// One mapping of a heap's bytes. Dropping it unmaps them.
#[derive(Debug)]
pub(crate) struct Mapping {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A `memmap2` mapping (file or anonymous), accessed through raw pointers only.
    Raw(memmap2::MmapRaw),
    /// A `MAP_SHARED_VALIDATE | MAP_SYNC` mapping of a DAX file, made with libc because
    /// memmap2 has no flag for it.
    Sync { ptr: NonNull<u8>, len: usize },
}

impl Mapping {
    /// Maps `len` bytes of `file` shared. With `want_sync`, tries `MAP_SYNC` first (so CPU
    /// flushes reach the media without `msync`), falling back to a plain shared mapping when
    /// the file system is not DAX.
    pub(crate) fn file(file: &File, len: usize, want_sync: bool) -> io::Result<Mapping> {
        if want_sync && let Some(mapping) = Self::try_map_sync(file, len)? {
            return Ok(mapping);
        }
        let raw = memmap2::MmapOptions::new().len(len).map_raw(file)?;
        prefer_huge_pages(&raw);
        Ok(Mapping {
            kind: Kind::Raw(raw),
        })
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
        })
    }

    /// Maps `len` bytes of zeroed anonymous memory.
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        let anon = memmap2::MmapRaw::from(memmap2::MmapOptions::new().len(len).map_anon()?);
        prefer_huge_pages(&anon);
        Ok(Mapping {
            kind: Kind::Raw(anon),
        })
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
            kind: Kind::Sync { ptr, len },
        }))
    }

    #[cfg(not(target_os = "linux"))]
    fn try_map_sync(_file: &File, _len: usize) -> io::Result<Option<Mapping>> {
        Ok(None)
    }

    /// The first byte of the mapping.
    pub(crate) fn base(&self) -> NonNull<u8> {
        match &self.kind {
            Kind::Raw(raw) => NonNull::new(raw.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            Kind::Sync { ptr, .. } => *ptr,
        }
    }

    /// The mapping's length in bytes.
    pub(crate) fn len(&self) -> usize {
        match &self.kind {
            Kind::Raw(raw) => raw.len(),
            Kind::Sync { len, .. } => *len,
        }
    }

    /// Whether CPU cache flushes reach the media directly (`MAP_SYNC` on a DAX file).
    pub(crate) fn is_dax(&self) -> bool {
        matches!(self.kind, Kind::Sync { .. })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Kind::Sync { ptr, len } = self.kind {
            // SAFETY: `ptr`/`len` are exactly what mmap returned; after drop no pointer into
            // the mapping is used, because `Region` (its only user) owns this `Mapping`.
            let _ = unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The `VmFlags` line `/proc/self/smaps` gives for the mapping that starts at `base`.
    fn vm_flags(base: NonNull<u8>) -> String {
        let start = format!("{:x}-", base.as_ptr().addr());
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        assert!(lines.next().is_some(), "no mapping starts at {start}");
        lines
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .unwrap()
            .to_owned()
    }

    /// `hg` is the flag `MADV_HUGEPAGE` sets on a mapping; a kernel built without
    /// transparent huge pages refuses the advice, and then there is nothing to check.
    fn advised(base: NonNull<u8>) -> bool {
        vm_flags(base).split_whitespace().any(|flag| flag == "hg")
    }

    fn thp_available() -> bool {
        std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    }

    #[test]
    fn heap_mappings_ask_for_huge_pages() {
        if !thp_available() {
            eprintln!("skipped: this kernel has no transparent huge pages");
            return;
        }
        let anonymous = Mapping::anonymous(8 << 20).unwrap();
        assert!(advised(anonymous.base()), "{}", vm_flags(anonymous.base()));

        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("heap"))
            .unwrap();
        allocate(&file, 0, 8 << 20).unwrap();
        let shared = Mapping::file(&file, 8 << 20, false).unwrap();
        assert!(advised(shared.base()), "{}", vm_flags(shared.base()));

        // A read-only copy is for inspection, which reads a heap once: no advice.
        let private = Mapping::private(&file, 8 << 20).unwrap();
        assert!(!advised(private.base()), "{}", vm_flags(private.base()));
    }
}
