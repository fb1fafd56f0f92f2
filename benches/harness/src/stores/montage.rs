//! montage's structures on a fresh heap of the chosen backend.

use montage_collections::{HashMap, NbHashMap, NbQueue, Queue};
use montage_core::{BackendKind, Heap, HeapConfig, WriteBack};

use super::{Backend, Contender, Dirs, MapStore, QueueStore, Result, Sizing};

/// A fresh heap for `contender` on `backend`, sized by `sizing`, in a temporary directory
/// that `f` outlives; `f` runs on it and the heap is closed (and its file removed) after.
pub(super) fn with_heap<R>(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: impl FnOnce(&Heap) -> Result<R>,
) -> Result<R> {
    let size = sizing.heap_bytes();
    let (config, dir) = match backend {
        Backend::Volatile => (HeapConfig::in_memory(size), None),
        Backend::Pmem | Backend::Journal => {
            let (parent, kind) = match backend {
                Backend::Pmem => (&dirs.pmem, BackendKind::Pmem),
                _ => (&dirs.disk, BackendKind::Journal),
            };
            let dir = super::scratch_dir(parent, "heap")?;
            // The grown contender's heap starts small, and the prefill grows it.
            let initial = if contender == Contender::MontageHashMapGrown {
                size.min(1 << 20)
            } else {
                size
            };
            let config = HeapConfig::new(dir.path().join("bench.heap"))
                .size(initial)
                .max_size(size)
                .backend(kind);
            (config, Some(dir))
        }
        Backend::None => return Err(format!("{} needs a montage backend", contender.name()).into()),
    };
    let write_back = if contender == Contender::StrictDurableHashMap {
        WriteBack::MeasureEachOp
    } else {
        WriteBack::Epoch
    };
    let verify = contender == Contender::MontageHashMapVerified;
    let heap = Heap::create(&config.write_back(write_back).verify_reads(verify))?;
    let result = f(&heap);
    if let Some(dir) = &dir
        && let Some((resident, huge)) = huge_pages(&dir.path().join("bench.heap"))
    {
        // The page size decides how often a random read also misses the TLB, so a figure
        // should say which it had (docs/PERFORMANCE.md, "Sixth round").
        eprintln!(
            "{}: {} MiB of the heap resident, {:.0}% of it in huge pages",
            super::label(contender, backend),
            resident >> 20,
            100.0 * huge as f64 / resident.max(1) as f64
        );
    }
    heap.close()?;
    if let Some(dir) = dir
        && result.is_err()
        && dirs.keep_failed
    {
        let kept = super::keep_scratch(dir);
        eprintln!(
            "{}: the failed run's heap is kept in {}",
            super::label(contender, backend),
            kept.display()
        );
    }
    result
}

pub(crate) fn with_map(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn MapStore) -> Result,
) -> Result {
    with_heap(contender, backend, dirs, sizing, |heap| match contender {
        // A fixed table: sized, as a user would size it, for the keys it will hold.
        Contender::MontageNbHashMap => f(&NbHashMap::<u64, Vec<u8>>::with_buckets(
            heap,
            "bench",
            usize::try_from(sizing.key_range)?,
        )?),
        _ => f(&HashMap::<u64, Vec<u8>>::open(heap, "bench")?),
    })
}

pub(crate) fn with_queue(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn QueueStore) -> Result,
) -> Result {
    with_heap(contender, backend, dirs, sizing, |heap| match contender {
        Contender::MontageNbQueue => f(&NbQueue::<Vec<u8>>::open(heap, "bench")?),
        _ => f(&Queue::<Vec<u8>>::open(heap, "bench")?),
    })
}

/// What a map's failed `what` of `key` reports: the call, the key and the error, so that a
/// failed run says what failed, not only why.
fn failed(what: &str, key: u64, error: &montage_core::Error) -> String {
    format!("{what} of key {key}: {error}")
}

/// One impl for both maps: they share their API.
macro_rules! map_store {
    ($map:ident) => {
        impl MapStore for $map<u64, Vec<u8>> {
            fn get(&self, key: u64) -> Result<Option<usize>> {
                let found = $map::get(self, &key).map_err(|e| failed("get", key, &e))?;
                Ok(found.map(|v| v.len()))
            }

            // `put_ref` and `delete`: like every other contender's, the write does not read the
            // value it replaces; and it copies the caller's bytes into the heap, with no owned
            // value built first.
            fn insert(&self, key: u64, value: &[u8]) -> Result {
                $map::put_ref(self, key, value).map_err(|e| failed("put", key, &e))?;
                Ok(())
            }

            fn remove(&self, key: u64) -> Result {
                $map::delete(self, &key).map_err(|e| failed("delete", key, &e))?;
                Ok(())
            }

            fn sync(&self) -> Result {
                Ok(self.heap().sync()?)
            }
        }
    };
}

map_store!(HashMap);
map_store!(NbHashMap);

macro_rules! queue_store {
    ($queue:ident) => {
        impl QueueStore for $queue<Vec<u8>> {
            // `push_back_ref`: as a map's `put_ref`, it copies the caller's bytes into the
            // heap with no owned value built first (the DRAM queue needs one: it keeps it).
            fn push(&self, value: &[u8]) -> Result {
                Ok(self.push_back_ref(value)?)
            }

            fn pop(&self) -> Result<Option<usize>> {
                Ok(self.pop_front()?.map(|v| v.len()))
            }
        }
    };
}

queue_store!(Queue);
queue_store!(NbQueue);

/// How many bytes of the mappings of `path` in this process are resident, and how many of
/// those are in huge pages (`/proc/self/smaps`: `ShmemPmdMapped` on tmpfs, `FilePmdMapped`
/// on a DAX file system). `None` where the file is not mapped or `/proc` cannot say.
fn huge_pages(path: &std::path::Path) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let path = path.to_str()?;
    let (mut resident, mut huge, mut found, mut inside) = (0, 0, false, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(first), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !first.ends_with(':') {
            // A mapping's first line: its range, permissions, offset, device, inode, path.
            inside = line.ends_with(path);
            found |= inside;
            continue;
        }
        let kib = || value.parse::<u64>().unwrap_or(0) << 10;
        match first {
            "Rss:" if inside => resident += kib(),
            "ShmemPmdMapped:" | "FilePmdMapped:" if inside => huge += kib(),
            _ => {}
        }
    }
    found.then_some((resident, huge))
}
