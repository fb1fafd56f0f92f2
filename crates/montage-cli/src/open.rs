//! Opening a heap the tool's way: read-only, damaged blocks quarantined rather than fatal,
//! the clock stopped, and a progress bar while recovery scans a large heap.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use montage_core::{
    BlockInfo, BlockKind, EpochLength, Error, Heap, HeapConfig, RecoveryProgress, ScanFilter,
};

/// A progress bar on stderr for `what`, hidden with `quiet` or when stderr is no terminal.
pub(crate) fn progress_bar(quiet: bool, what: &'static str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template("{msg:>10} [{bar:40}] {percent:>3}% {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what);
    bar
}

/// Opens the heap at `path` read-only, as every subcommand does.
///
/// # Errors
///
/// What [`Heap::open`] returns: the heap cannot be read or its metadata is damaged.
pub(crate) fn open(path: &Path, quiet: bool) -> Result<Heap, Error> {
    if !path.exists() {
        // Said plainly, rather than as the error of an `open` call.
        return Err(Error::Io {
            op: "open",
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let config = HeapConfig::new(path)
        .read_only(true)
        .quarantine_damaged(true);
    open_showing(config, quiet, "recovery")
}

/// Opens the heap `config` describes, its clock stopped, with a progress bar for `what`
/// while recovery scans it.
///
/// # Errors
///
/// What [`Heap::open`] returns.
pub(crate) fn open_showing(
    config: HeapConfig,
    quiet: bool,
    what: &'static str,
) -> Result<Heap, Error> {
    let bar = progress_bar(quiet, what);
    let config = config
        .epoch_length(EpochLength::Manual)
        .on_recovery_progress(follow(&bar));
    let heap = Heap::open(&config);
    bar.finish_and_clear();
    heap
}

/// A progress callback that moves `bar`.
pub(crate) fn follow(bar: &ProgressBar) -> impl Fn(RecoveryProgress) + Send + Sync + 'static {
    let bar = bar.clone();
    move |progress| {
        bar.set_length(progress.total);
        bar.set_position(progress.read);
    }
}

/// Opens the heap at `path` as [`open`] does; when it is damaged, says so on stderr and
/// returns `None`.
///
/// # Errors
///
/// The heap cannot be read at all.
pub(crate) fn open_or_say(path: &Path, quiet: bool) -> Result<Option<Heap>, Error> {
    match open(path, quiet) {
        Ok(heap) => Ok(Some(heap)),
        Err(err) if is_damage(&err) => {
            eprintln!(
                "montage: {}: {err}; `montage check` says more",
                path.display()
            );
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// Takes the shared lock of the heap file at `path`, as a heap opened read-only holds it:
/// no writer has the heap while the returned file lives.
///
/// # Errors
///
/// The file cannot be opened, or a process has the heap open for writing.
pub(crate) fn lock_shared(path: &Path) -> Result<std::fs::File, Error> {
    let file = std::fs::File::open(path).map_err(|e| Error::Io {
        op: "open",
        path: path.to_path_buf(),
        source: e,
    })?;
    match file.try_lock_shared() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked {
            path: path.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::Io {
            op: "flock",
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Calls `visit` with the header and the bytes of every live payload `filter` selects (not
/// the anti-blocks of deletions), on `threads` threads (one: in heap order).
///
/// # Errors
///
/// What the scan or `visit` returns.
pub(crate) fn each_payload(
    heap: &Heap,
    filter: ScanFilter,
    threads: usize,
    visit: impl Fn(&BlockInfo, Vec<u8>) -> Result<(), Error> + Sync,
) -> Result<u64, Error> {
    heap.scan(filter.live(), threads, |view| {
        let info = view.info();
        if info.spec.kind == BlockKind::Delete {
            return Ok(());
        }
        let mut bytes = vec![0; info.len as usize];
        view.read(0, &mut bytes)?;
        visit(info, bytes)
    })
}

/// Whether `err`, from opening a heap, says the heap is damaged (rather than that it could
/// not be read at all: a missing file, a lock, an I/O error).
pub(crate) fn is_damage(err: &Error) -> bool {
    matches!(
        err,
        Error::BadMagic
            | Error::FormatVersion { .. }
            | Error::Truncated { .. }
            | Error::Corrupted { .. }
            | Error::Journal { .. }
            | Error::DamagedHeader { .. }
            | Error::DamagedPayload { .. }
    )
}
