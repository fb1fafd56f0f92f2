//! Recovery time of a `HashMap` against its size: fills a map with `u64` keys and 8-byte
//! values on a heap file, syncs, closes, then times `Heap::open` (the heap's recovery scan)
//! with one and with two recovery threads, and `HashMap::open` (the index rebuild, a scan
//! on as many threads as the machine has).
//! Not a criterion benchmark: each point is a single large run, repeated three times.
//!
//! `cargo bench -p montage-collections --bench recovery -- [ENTRIES...]`
//! (default 1000000; the heap file goes to `MONTAGE_BENCH_DIR`, default `/dev/shm`).

#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark reports and stops loudly

use std::path::PathBuf;
use std::time::{Duration, Instant};

use montage_collections::HashMap;
use montage_core::{BackendKind, Heap, HeapConfig};

const REPEATS: usize = 3;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let sizes: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000_000]
    } else {
        sizes
    };
    let dir = std::env::var_os("MONTAGE_BENCH_DIR")
        .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from);
    for entries in sizes {
        let path = dir.join(format!(
            "montage-bench-{}-recovery.heap",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        // About 128 bytes of heap per entry (a 64-byte block holds it), plus slack.
        let size = (entries * 160).max(64 << 20).next_multiple_of(1 << 20);
        let config = HeapConfig::new(&path).size(size).backend(BackendKind::Pmem);
        let heap = Heap::create(&config).unwrap();
        let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
        let fill = Instant::now();
        std::thread::scope(|s| {
            for t in 0..2 {
                let map = &map;
                s.spawn(move || {
                    for k in (t..entries).step_by(2) {
                        map.insert(k, k).unwrap();
                    }
                });
            }
        });
        let fill = fill.elapsed();
        drop(map);
        heap.close().unwrap();
        let rebuild_threads = std::thread::available_parallelism().map_or(1, usize::from);
        for threads in [1usize, 2] {
            let mut opens = Vec::new();
            let mut rebuilds = Vec::new();
            for _ in 0..REPEATS {
                let start = Instant::now();
                let heap = Heap::open(&config.clone().recovery_threads(threads)).unwrap();
                let opened = start.elapsed();
                let map: HashMap<u64, u64> = HashMap::open(&heap, "m").unwrap();
                let rebuilt = start.elapsed().saturating_sub(opened);
                assert_eq!(map.len() as u64, entries);
                opens.push(opened);
                rebuilds.push(rebuilt);
                drop(map);
                heap.close().unwrap();
            }
            let (open, rebuild) = (median(opens), median(rebuilds));
            println!(
                "{entries} entries ({} MiB heap, filled in {fill:.2?} by 2 threads): heap open \
                 on {threads} recovery thread(s) {open:.2?} + index rebuild on {rebuild_threads} \
                 {rebuild:.2?} = {:.2?} (median of {REPEATS})",
                size >> 20,
                open + rebuild
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}
