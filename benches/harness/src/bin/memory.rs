//! Memory per entry, measured: the DRAM bytes each map's index holds per entry (counted by an
//! instrumented global allocator: live bytes after a rebuild from the heap minus before) and
//! the persistent bytes each entry takes (its block, header included, as the allocator sized
//! it; and the spans the heap carved, per entry).
//!
//! `cargo run --release -p montage-bench --bin montage-memory -- [ENTRIES] [VALUE_SIZE...]`
//! (defaults: 1,000,000 entries; 8- and 256-byte values). Heaps go in `/dev/shm` (or
//! `MONTAGE_BENCH_PMEM_DIR`).

#![allow(clippy::print_stdout, clippy::print_stderr)]
// Rates and ratios: counts become floating point, far inside f64's exact range.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::alloc::System;
use std::path::PathBuf;

use montage_collections::{HashMap, NbHashMap};
use montage_core::limits::{HEADER_LEN, SPAN_SIZE};
use montage_core::{BackendKind, Heap, HeapConfig, ScanFilter};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Live heap-allocated bytes (as requested: the system allocator's own rounding and headers
/// are not counted) `f` leaves behind (allocated minus freed while it ran), and
/// what it returned.
fn retained<R>(f: impl FnOnce() -> R) -> (i64, R) {
    let region = Region::new(GLOBAL);
    let value = f();
    let change = region.change();
    // Reallocations are already counted in both (as growth or shrinkage).
    let live = change.bytes_allocated as i64 - change.bytes_deallocated as i64;
    (live, value)
}

/// The value stored under `key`: `size` bytes starting with the key.
fn value(key: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let tag = key.to_le_bytes();
    let n = tag.len().min(size);
    v[..n].copy_from_slice(&tag[..n]);
    v
}

/// One row: the structure, DRAM index bytes per entry, persistent bytes per entry (blocks,
/// then carved spans).
struct Row {
    name: &'static str,
    dram: f64,
    blocks: Option<f64>,
    spans: Option<f64>,
}

/// Fills `name` on a fresh heap, closes it, reopens it and measures the rebuild.
fn montage_row(
    dir: &std::path::Path,
    name: &'static str,
    entries: u64,
    size: usize,
) -> Result<Row> {
    let path = dir.join(format!("{name}-{size}.heap"));
    let bytes = (entries * ((size as u64 + 8 + 64).next_power_of_two()) * 2).max(256 << 20);
    let config = HeapConfig::new(&path)
        .size(bytes)
        .backend(BackendKind::Pmem);
    {
        let heap = Heap::create(&config)?;
        let fill = |insert: &(dyn Fn(u64) -> montage_core::Result<()> + Sync)| {
            std::thread::scope(|s| {
                let workers: Vec<_> = (0..2)
                    .map(|t| s.spawn(move || (t..entries).step_by(2).try_for_each(insert)))
                    .collect();
                workers.into_iter().try_for_each(|w| -> Result {
                    w.join().map_err(|_| "a fill thread panicked")??;
                    Ok(())
                })
            })
        };
        if name == "montage-nb-hashmap" {
            let map = NbHashMap::<u64, Vec<u8>>::open(&heap, "m")?;
            fill(&|k| map.insert(k, value(k, size)).map(drop))?;
        } else {
            let map = HashMap::<u64, Vec<u8>>::open(&heap, "m")?;
            fill(&|k| map.insert(k, value(k, size)).map(drop))?;
        }
        heap.sync()?;
        heap.close()?;
    }
    let heap = Heap::open(&config)?;
    let (dram, len) = if name == "montage-nb-hashmap" {
        let (live, map) = retained(|| NbHashMap::<u64, Vec<u8>>::open(&heap, "m"));
        let map = map?;
        let len = map.len();
        drop(map);
        (live, len)
    } else {
        let (live, map) = retained(|| HashMap::<u64, Vec<u8>>::open(&heap, "m"));
        let map = map?;
        let len = map.len();
        drop(map);
        (live, len)
    };
    if len as u64 != entries {
        return Err(format!("{name}: recovered {len} entries of {entries}").into());
    }
    let owner = heap.lookup("m").ok_or("the map is missing")?;
    let blocks: u64 = heap
        .collect(ScanFilter::all().owner(owner))?
        .iter()
        .map(|b| HEADER_LEN + b.capacity)
        .sum();
    let stats = heap.stats();
    let spans = (stats.spans - stats.free_spans) * SPAN_SIZE;
    heap.close()?;
    std::fs::remove_file(&path)?;
    let n = entries as f64;
    Ok(Row {
        name,
        dram: dram as f64 / n,
        blocks: Some(blocks as f64 / n),
        spans: Some(spans as f64 / n),
    })
}

fn transient_rows(entries: u64, size: usize) -> Vec<Row> {
    let (std_live, map) = retained(|| {
        (0..entries)
            .map(|k| (k, value(k, size)))
            .collect::<std::collections::HashMap<u64, Vec<u8>>>()
    });
    drop(map);
    let (dash_live, dash) = retained(|| {
        let d = dashmap::DashMap::new();
        for k in 0..entries {
            d.insert(k, value(k, size));
        }
        d
    });
    drop(dash);
    let n = entries as f64;
    vec![
        Row {
            name: "std HashMap<u64, Vec<u8>> (values in DRAM)",
            dram: std_live as f64 / n,
            blocks: None,
            spans: None,
        },
        Row {
            name: "dashmap (values in DRAM)",
            dram: dash_live as f64 / n,
            blocks: None,
            spans: None,
        },
    ]
}

fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let entries: u64 = args.first().map_or(Ok(1_000_000), |a| a.parse())?;
    let sizes: Vec<usize> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|a| a.parse())
            .collect::<std::result::Result<_, _>>()?
    } else {
        vec![8, 256]
    };
    let base = std::env::var_os("MONTAGE_BENCH_PMEM_DIR")
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
    let dir = tempfile::Builder::new()
        .prefix("montage-memory-")
        .tempdir_in(base)?;
    println!(
        "| structure | value size | DRAM bytes/entry | persistent bytes/entry (blocks) | persistent bytes/entry (spans carved) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let show = |o: Option<f64>| o.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    for &size in &sizes {
        let mut rows = vec![
            montage_row(dir.path(), "montage-hashmap", entries, size)?,
            montage_row(dir.path(), "montage-nb-hashmap", entries, size)?,
        ];
        rows.extend(transient_rows(entries, size));
        for row in rows {
            println!(
                "| {} | {size} | {:.1} | {} | {} |",
                row.name,
                row.dram,
                show(row.blocks),
                show(row.spans)
            );
        }
    }
    eprintln!("{entries} entries per structure");
    Ok(())
}
