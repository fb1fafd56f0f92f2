//! Shared set-up for the benchmarks: where heap files go.

use std::path::PathBuf;

/// The directory for benchmark heap files: `MONTAGE_BENCH_DIR`, else `/dev/shm` (so file
/// heaps measure the runtime rather than the disk), else the system temp directory.
pub(crate) fn bench_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MONTAGE_BENCH_DIR") {
        return PathBuf::from(dir);
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// A fresh heap file path in the bench directory, removed first if a previous run left it.
pub(crate) fn fresh_path(name: &str) -> PathBuf {
    let path = bench_dir().join(format!("montage-bench-{}-{name}.heap", std::process::id()));
    let _ = montage::Heap::remove(&path);
    path
}
