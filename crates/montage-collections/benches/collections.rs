//! The hot operations of each structure, one thread, on a pmem-backend heap file in
//! `MONTAGE_BENCH_DIR` (default `/dev/shm`) with the default 50 ms epochs:
//!
//! * the hash maps and the sorted map: `get` of a present key, `insert` replacing a value, and an
//!   `insert` + `remove` pair of a fresh key, on a map prefilled with 100,000 entries
//!   (`u64` keys, 8-byte values);
//! * both queues: a `push_back` + `pop_front` pair on a queue of 1,000 elements;
//! * graph: `add_edge` + `remove_edge` and `neighbours` on a ring of 10,000 vertices.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used)] // a benchmark stops loudly

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use montage_collections::{Graph, HashMap, NbHashMap, NbQueue, Queue, SortedMap};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, Heap, HeapConfig};

const PREFILL: u64 = 100_000;

fn heap(name: &str) -> (Heap, PathBuf) {
    let path = montage_testkit::fresh_bench_path(name);
    let config = HeapConfig::new(&path)
        .size(64 << 20)
        .max_size(1 << 30)
        .backend(BackendKind::Pmem);
    (Heap::create(&config).unwrap(), path)
}

/// A map-like structure, for the benchmarks both maps share.
trait Map: Sync {
    fn get(&self, key: u64) -> Option<u64>;
    fn insert(&self, key: u64, value: u64) -> Option<u64>;
    fn remove(&self, key: u64) -> Option<u64>;
}

impl Map for HashMap<u64, u64> {
    fn get(&self, key: u64) -> Option<u64> {
        HashMap::get(self, &key).unwrap()
    }
    fn insert(&self, key: u64, value: u64) -> Option<u64> {
        HashMap::insert(self, key, value).unwrap()
    }
    fn remove(&self, key: u64) -> Option<u64> {
        HashMap::remove(self, &key).unwrap()
    }
}

impl Map for NbHashMap<u64, u64> {
    fn get(&self, key: u64) -> Option<u64> {
        NbHashMap::get(self, &key).unwrap()
    }
    fn insert(&self, key: u64, value: u64) -> Option<u64> {
        NbHashMap::insert(self, key, value).unwrap()
    }
    fn remove(&self, key: u64) -> Option<u64> {
        NbHashMap::remove(self, &key).unwrap()
    }
}

impl Map for SortedMap<u64, u64> {
    fn get(&self, key: u64) -> Option<u64> {
        SortedMap::get(self, &key).unwrap()
    }
    fn insert(&self, key: u64, value: u64) -> Option<u64> {
        SortedMap::insert(self, key, value).unwrap()
    }
    fn remove(&self, key: u64) -> Option<u64> {
        SortedMap::remove(self, &key).unwrap()
    }
}

fn map_benches(c: &mut Criterion, name: &str, map: &dyn Map) {
    for k in 0..PREFILL {
        map.insert(k, k);
    }
    let mut group = c.benchmark_group(name);
    let mut rng = SplitMix64::new(1);
    group.bench_function("get", |b| {
        b.iter(|| black_box(map.get(rng.next_u64() % PREFILL)));
    });
    group.bench_function("insert_replace", |b| {
        b.iter(|| black_box(map.insert(rng.next_u64() % PREFILL, 7)));
    });
    let mut fresh = PREFILL;
    group.bench_function("insert_remove_fresh", |b| {
        b.iter(|| {
            fresh += 1;
            map.insert(fresh, 1);
            black_box(map.remove(fresh))
        });
    });
    group.finish();
}

fn maps(c: &mut Criterion) {
    let (heap, path) = heap("maps");
    let hash: HashMap<u64, u64> = HashMap::open(&heap, "hash").unwrap();
    map_benches(c, "hash_map", &hash);
    let nb: NbHashMap<u64, u64> = NbHashMap::open(&heap, "nb").unwrap();
    map_benches(c, "nb_hash_map", &nb);
    let sorted: SortedMap<u64, u64> = SortedMap::open(&heap, "sorted").unwrap();
    map_benches(c, "sorted_map", &sorted);
    drop((hash, nb, sorted));
    drop(heap);
    let _ = std::fs::remove_file(path);
}

fn queue(c: &mut Criterion) {
    let (heap, path) = heap("queue");
    let queue: Queue<u64> = Queue::open(&heap, "q").unwrap();
    for i in 0..1_000 {
        queue.push_back(i).unwrap();
    }
    c.bench_function("queue/push_pop", |b| {
        b.iter(|| {
            queue.push_back(5).unwrap();
            black_box(queue.pop_front().unwrap())
        });
    });
    let nb: NbQueue<u64> = NbQueue::open(&heap, "nb").unwrap();
    for i in 0..1_000 {
        nb.push_back(i).unwrap();
    }
    c.bench_function("nb_queue/push_pop", |b| {
        b.iter(|| {
            nb.push_back(5).unwrap();
            black_box(nb.pop_front().unwrap())
        });
    });
    drop((queue, nb));
    drop(heap);
    let _ = std::fs::remove_file(path);
}

fn graph(c: &mut Criterion) {
    const N: u64 = 10_000;
    let (heap, path) = heap("graph");
    let graph: Graph<u64, u64> = Graph::open(&heap, "g").unwrap();
    for id in 0..N {
        graph.add_vertex(id, &id).unwrap();
    }
    for id in 0..N {
        graph.add_edge(id, (id + 1) % N, &1).unwrap();
    }
    let mut rng = SplitMix64::new(2);
    let mut group = c.benchmark_group("graph");
    group.bench_function("add_remove_edge", |b| {
        b.iter(|| {
            let (s, d) = (rng.next_u64() % N, rng.next_u64() % N);
            graph.add_edge(s, d, &9).unwrap();
            black_box(graph.remove_edge(s, d).unwrap())
        });
    });
    group.bench_function("neighbours", |b| {
        b.iter(|| black_box(graph.neighbours(rng.next_u64() % N).unwrap()));
    });
    group.finish();
    drop(graph);
    drop(heap);
    let _ = std::fs::remove_file(path);
}

criterion_group!(benches, maps, queue, graph);
criterion_main!(benches);
