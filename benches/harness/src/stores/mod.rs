//! The contenders: one [`MapStore`] (or [`QueueStore`]) interface over montage's structures,
//! the transient baselines and the embedded stores a user would pick instead.

pub(crate) mod baseline;
pub(crate) mod device;
pub(crate) mod logged;
pub(crate) mod montage;
#[cfg(feature = "peers")]
pub(crate) mod peers;

use std::path::{Path, PathBuf};

/// An error from any store.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The harness's result type.
pub(crate) type Result<T = ()> = std::result::Result<T, BoxError>;

/// A key-value store as the workloads use it: `u64` keys, byte-string values.
pub(crate) trait MapStore: Sync {
    /// Reads `key`, copying its value out; returns the value's length.
    fn get(&self, key: u64) -> Result<Option<usize>>;
    /// Inserts or replaces `key`, in the store's fastest crash-consistent mode.
    fn insert(&self, key: u64, value: &[u8]) -> Result;
    /// Removes `key` if present.
    fn remove(&self, key: u64) -> Result;
    /// Makes every write this thread made so far durable.
    fn sync(&self) -> Result;
    /// Inserts or replaces `key` and makes the write durable before returning: the store's
    /// synchronous mode (by default an insert then a sync; a store with a cheaper durable
    /// commit overrides it).
    fn insert_durable(&self, key: u64, value: &[u8]) -> Result {
        self.insert(key, value)?;
        self.sync()
    }
    /// Inserts many keys at once, each with a `value_size`-byte value, for prefilling (stores
    /// with transactions override it to use one per batch).
    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        let mut value = vec![0; value_size];
        for &key in keys {
            crate::workload::fill_value(&mut value, key);
            self.insert(key, &value)?;
        }
        Ok(())
    }
}

/// A FIFO queue of byte strings.
pub(crate) trait QueueStore: Sync {
    /// Appends `value`.
    fn push(&self, value: &[u8]) -> Result;
    /// Takes the oldest value, returning its length.
    fn pop(&self) -> Result<Option<usize>>;
}

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Contender {
    MontageHashMap,
    /// `HashMap` on a heap that checks every payload it reads against its checksum.
    MontageHashMapVerified,
    /// `HashMap` on a heap created at 1 MiB that grows to the size the others are made at.
    MontageHashMapGrown,
    MontageNbHashMap,
    TransientHashMap,
    DashMap,
    StrictDurableHashMap,
    Redb,
    Sled,
    Fjall,
    Heed,
    Rocksdb,
    MontageQueue,
    MontageNbQueue,
    TransientQueue,
    Device,
    /// A `BTreeMap` made persistent by `Logged`.
    LoggedBTreeMap,
    /// `LoggedShards` of `logged::SHARDS` `BTreeMap`s.
    LoggedBTreeMapSharded,
    /// The `Logged` `BTreeMap` taking no snapshot while it runs (`SnapshotPolicy::manual`),
    /// beside `LoggedBTreeMap`: what the default policy costs.
    LoggedBTreeMapUnsnapped,
    /// A `BTreeMap` in DRAM under a reader-writer lock.
    LockedBTreeMap,
    /// `logged::SHARDS` of them, a key going to one by a hash.
    LockedBTreeMapSharded,
    /// A `VecDeque` made persistent by `Logged`.
    LoggedVecDeque,
}

impl Contender {
    /// The name used in results and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Contender::MontageHashMap => "montage-hashmap",
            Contender::MontageHashMapVerified => "montage-hashmap-verified",
            Contender::MontageHashMapGrown => "montage-hashmap-grown",
            Contender::MontageNbHashMap => "montage-nb-hashmap",
            Contender::TransientHashMap => "transient-hashmap",
            Contender::DashMap => "dashmap",
            Contender::StrictDurableHashMap => "strict-durable-hashmap",
            Contender::Redb => "redb",
            Contender::Sled => "sled",
            Contender::Fjall => "fjall",
            Contender::Heed => "heed",
            Contender::Rocksdb => "rocksdb",
            Contender::MontageQueue => "montage-queue",
            Contender::MontageNbQueue => "montage-nb-queue",
            Contender::TransientQueue => "transient-queue",
            Contender::Device => "device",
            Contender::LoggedBTreeMap => "logged-btreemap",
            Contender::LoggedBTreeMapSharded => "logged-btreemap-sharded",
            Contender::LoggedBTreeMapUnsnapped => "logged-btreemap-unsnapped",
            Contender::LockedBTreeMap => "locked-btreemap",
            Contender::LockedBTreeMapSharded => "locked-btreemap-sharded",
            Contender::LoggedVecDeque => "logged-vecdeque",
        }
    }

    /// Whether this is one of the embedded stores (built only with the `peers` feature).
    pub(crate) fn is_peer(self) -> bool {
        matches!(
            self,
            Contender::Redb
                | Contender::Sled
                | Contender::Fjall
                | Contender::Heed
                | Contender::Rocksdb
        )
    }

    /// Whether `sync` makes anything durable (the sync-heavy workloads run only on these).
    pub(crate) fn is_durable(self, backend: Backend) -> bool {
        self.is_peer()
            || self == Contender::Device
            || matches!(backend, Backend::Pmem | Backend::Journal)
    }

    /// Whether it runs only when named with `--contenders` (the logged structures and their
    /// DRAM baselines, which `montage-bench --contenders logged-btreemap,...` measures).
    pub(crate) fn on_request(self) -> bool {
        matches!(
            self,
            Contender::LoggedBTreeMap
                | Contender::LoggedBTreeMapSharded
                | Contender::LoggedBTreeMapUnsnapped
                | Contender::LockedBTreeMap
                | Contender::LockedBTreeMapSharded
                | Contender::LoggedVecDeque
        )
    }

    /// Whether it only runs the sync workloads (the device floor has no index).
    pub(crate) fn sync_only(self) -> bool {
        self == Contender::Device
    }
}

/// Where montage's heap lives and how it is written back; `None` for everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Backend {
    Volatile,
    Pmem,
    Journal,
    None,
}

impl Backend {
    /// The name used in results and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Volatile => "volatile",
            Backend::Pmem => "pmem",
            Backend::Journal => "journal",
            Backend::None => "none",
        }
    }
}

/// How messages name `contender` on `backend`: `montage-hashmap (pmem)`.
pub(crate) fn label(contender: Contender, backend: Backend) -> String {
    format!("{} ({})", contender.name(), backend.name())
}

/// Where stores keep their files.
#[derive(Debug, Clone)]
pub(crate) struct Dirs {
    /// For the `pmem` backend: a memory file system (tmpfs or DAX).
    pub(crate) pmem: PathBuf,
    /// For the file backends, the embedded stores and the device floor: a file system on a
    /// disk.
    pub(crate) disk: PathBuf,
    /// Keep a montage heap whose run failed (`--keep-failed`).
    pub(crate) keep_failed: bool,
}

/// How every scratch directory's name starts: `montage-bench-<pid>-<kind>-` (see
/// [`scratch_dir`]).
const SCRATCH: &str = "montage-bench-";

/// A scratch directory in `parent` for one store (`kind`: `heap`, `peer`, `device`), removed
/// when dropped; its name carries this process's id, so that a later run can remove it if this
/// one is killed first ([`remove_stale`]).
pub(crate) fn scratch_dir(parent: &Path, kind: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{SCRATCH}{}-{kind}-", std::process::id()))
        .tempdir_in(parent)
}

/// How a scratch directory kept for a look afterwards is renamed: `montage-failed-<name>`.
const KEPT: &str = "montage-failed-";

/// Keeps `dir` after all, renamed out of the scratch pattern so that no later run removes
/// it; returns where it is.
pub(crate) fn keep_scratch(dir: tempfile::TempDir) -> PathBuf {
    let scratch = dir.keep();
    let name = scratch
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let kept = scratch.with_file_name(format!("{KEPT}{name}"));
    if std::fs::rename(&scratch, &kept).is_ok() {
        kept
    } else {
        scratch
    }
}

/// Removes the scratch directories in `parent` of processes that no longer run: a run killed
/// before it could remove its stores leaves them behind, and on a tmpfs they hold memory
/// until someone does. A directory kept by `--keep-failed` is renamed out of the pattern and
/// stays.
pub(crate) fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => eprintln!(
                "removed {}, left by process {pid}, which no longer runs",
                path.display()
            ),
            Err(e) => eprintln!(
                "cannot remove {} (left by process {pid}): {e}",
                path.display()
            ),
        }
    }
}

/// How big a store is asked to get.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizing {
    pub(crate) key_range: u64,
    pub(crate) value_size: usize,
}

impl Sizing {
    /// A heap that holds every key of the range at once, three times over (old versions wait
    /// two epochs to be reclaimed), with room for the allocator's rounding.
    pub(crate) fn heap_bytes(self) -> u64 {
        let entry = (self.value_size as u64 + 8 + 64).next_power_of_two();
        (self.key_range * entry * 3).max(256 << 20)
    }
}

/// Opens a fresh `contender` map on `backend` and runs `f` on it; the files go when it
/// returns.
pub(crate) fn with_map(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn MapStore) -> Result,
) -> Result {
    match contender {
        Contender::MontageHashMap
        | Contender::MontageHashMapVerified
        | Contender::MontageHashMapGrown
        | Contender::MontageNbHashMap
        | Contender::StrictDurableHashMap => montage::with_map(contender, backend, dirs, sizing, f),
        Contender::TransientHashMap => f(&baseline::TransientMap::new()),
        Contender::LoggedBTreeMap
        | Contender::LoggedBTreeMapSharded
        | Contender::LoggedBTreeMapUnsnapped => {
            logged::with_map(contender, backend, dirs, sizing, f)
        }
        Contender::LockedBTreeMap => f(&baseline::LockedTrees::new(1)),
        Contender::LockedBTreeMapSharded => f(&baseline::LockedTrees::new(logged::SHARDS)),
        Contender::DashMap => f(&baseline::Dash::default()),
        Contender::Device => {
            let dir = scratch_dir(&dirs.disk, "device")?;
            f(&device::Device::create(&dir.path().join("device"))?)
        }
        #[cfg(feature = "peers")]
        _ if contender.is_peer() => peers::with_map(contender, dirs, sizing, f),
        _ => Err(format!(
            "{} is not available in this build (build with `--features peers`)",
            contender.name()
        )
        .into()),
    }
}

/// Opens a fresh `contender` queue on `backend` and runs `f` on it.
pub(crate) fn with_queue(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn QueueStore) -> Result,
) -> Result {
    match contender {
        Contender::TransientQueue => f(&baseline::TransientQueue::default()),
        Contender::LoggedVecDeque => logged::with_queue(contender, backend, dirs, sizing, f),
        _ => montage::with_queue(contender, backend, dirs, sizing, f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_scratch_directories_of_gone_processes_are_removed() {
        let parent = tempfile::tempdir().unwrap();
        // No process has this id (Linux's pid_max is at most 2^22).
        let gone = u32::MAX;
        let mine = scratch_dir(parent.path(), "heap").unwrap();
        let names = [
            format!("{SCRATCH}{gone}-heap-a1"),
            format!("{KEPT}{SCRATCH}{gone}-heap-b2"),
            format!("{SCRATCH}peer-c3"),
            "unrelated".to_owned(),
        ];
        for name in &names {
            std::fs::create_dir(parent.path().join(name)).unwrap();
            std::fs::write(parent.path().join(name).join("bench.heap"), b"x").unwrap();
        }
        remove_stale(parent.path());
        assert!(!parent.path().join(&names[0]).exists());
        for name in &names[1..] {
            assert!(parent.path().join(name).exists(), "{name} removed");
        }
        assert!(mine.path().exists());
    }
}
