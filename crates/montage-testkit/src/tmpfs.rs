//! A tmpfs mounted for huge pages, private to one thread, and a thread's lowest scheduling
//! priority: what a test needs to run a heap file where the kernel gives it huge pages and
//! collapses its pages while other threads store to them (`docs/PERFORMANCE.md`, "Found:
//! the collapse of unwritten pages loses stores").

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Runs `f` on a thread of its own with a tmpfs of at most `size` bytes mounted
/// `huge=within_size` at the directory it is given, in a mount namespace of that thread's
/// own: nothing outside sees the mount, and it goes when the thread ends. Threads `f`
/// starts share the namespace. Where this process may not make a mount namespace or mount
/// (it is not privileged), prints why and returns `false` without running `f`.
///
/// # Panics
///
/// If `f` panics, or the temporary directory cannot be made.
pub fn on_huge_tmpfs(size: u64, f: impl FnOnce(&Path) + Send) -> bool {
    let dir = tempfile::tempdir().expect("a temporary directory to mount on");
    let path = dir.path();
    let mounted = std::thread::scope(|scope| {
        let thread = scope.spawn(|| {
            mount_private_tmpfs(path, size)?;
            f(path);
            Ok::<(), io::Error>(())
        });
        match thread.join() {
            Ok(mounted) => mounted,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    });
    match mounted {
        Ok(()) => true,
        Err(why) => {
            eprintln!("skipped: cannot mount a tmpfs for huge pages here ({why})");
            false
        }
    }
}

/// Moves the calling thread to a new mount namespace, keeps its mounts from propagating
/// to the process's, and mounts the tmpfs on `path`.
fn mount_private_tmpfs(path: &Path, size: u64) -> io::Result<()> {
    let target = CString::new(path.as_os_str().as_bytes())?;
    let options = CString::new(format!("huge=within_size,size={size}"))?;
    let (tmpfs, root) = (c"tmpfs", c"/");
    let check = |status| {
        if status == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: `unshare` acts on the calling thread's own namespaces (after it, its mount
    // namespace is its own) and touches no memory of this process.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    // SAFETY: `mount` reads the NUL-terminated string `root`, alive until it returns; the
    // null pointers are the arguments a propagation change leaves out.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: as above, for the three strings and the options, all alive until it returns.
    check(unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            target.as_ptr(),
            tmpfs.as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    })
}

/// Gives the calling thread the lowest scheduling priority (nice 19), as the heap's
/// collapsing thread has: writers at that priority let it run beside them on a busy
/// machine instead of only after them.
pub fn lowest_priority() {
    // SAFETY: `gettid` reads the calling thread's id; `setpriority` on that id (on Linux a
    // thread id names one thread for `PRIO_PROCESS`) changes only its scheduling, and a
    // thread may always lower its own priority. Neither touches memory of this process.
    let tid = unsafe { libc::gettid() };
    // SAFETY: see above.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid.unsigned_abs(), 19) };
}
