//! What a request costs the server apart from its socket: parsing it and running it on the
//! store, one thread, on a pmem-backend heap file in `MONTAGE_BENCH_DIR` (default `/dev/shm`)
//! prefilled with 100,000 items of 256 bytes (keys as `montage-kv-load` sends them):
//!
//! * `mg <key> v` of a present key, and the text protocol's `get` of one;
//! * `ms <key> 256` replacing an item (the reply is not held for a sync here: that is the
//!   server's, not the request's, cost);
//! * `mg` of an absent key.
//!
//! Keys are drawn in a scrambled order over the whole set, so a request pays the cache misses
//! a server's does.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used)] // a benchmark stops loudly

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, Heap, HeapConfig};
use montage_kv::meta::{self, Tally};
use montage_kv::protocol::{self, Limits, Parsed, Request};
use montage_kv::store::{Lookup, Store, SystemClock};

const ITEMS: u64 = 100_000;

/// A request for the key numbered by its argument.
type MakeRequest = fn(u64) -> String;
const VALUE: usize = 256;

fn key(i: u64) -> String {
    format!("key:{i:020}")
}

/// Parses `request` and runs it, appending the reply to `out`.
fn run(store: &Store, request: &[u8], out: &mut Vec<u8>) {
    let limits = Limits::default();
    let Parsed::Request(request, _) = protocol::parse(request, &limits) else {
        panic!("the benchmark's request does not parse");
    };
    match request {
        Request::Meta(meta) => {
            meta::execute(store, &meta, out, &mut |_: Tally| {}).unwrap();
        }
        Request::Get { keys, .. } => {
            for key in keys {
                if let Lookup::Hit(item) = store.lookup(key).unwrap() {
                    out.extend_from_slice(b"VALUE ");
                    out.extend_from_slice(key);
                    out.extend_from_slice(
                        format!(" {} {}\r\n", item.flags, item.data.len()).as_bytes(),
                    );
                    out.extend_from_slice(&item.data);
                    out.extend_from_slice(b"\r\n");
                }
            }
            out.extend_from_slice(b"END\r\n");
        }
        _ => unreachable!("the benchmark sends mg, ms and get"),
    }
}

fn requests(c: &mut Criterion) {
    let path = montage_testkit::fresh_bench_path("kv-request");
    let config = HeapConfig::new(&path)
        .size(256 << 20)
        .max_size(4 << 30)
        .backend(BackendKind::Pmem);
    let heap = Heap::create(&config).unwrap();
    let store = Store::open(&heap, "bench", SystemClock).unwrap();
    let value = vec![b'v'; VALUE];
    for i in 0..ITEMS {
        store
            .store(
                protocol::StoreMode::Set,
                key(i).as_bytes(),
                0,
                0,
                &value,
                None,
            )
            .unwrap();
    }
    let mut rng = SplitMix64::new(7);
    let mut next = move || rng.next_u64() % ITEMS;
    let mut out = Vec::with_capacity(4096);
    let mut group = c.benchmark_group("kv_request");
    let reads: [(&str, MakeRequest); 3] = [
        ("mg_hit", |i| format!("mg {} v\r\n", key(i))),
        ("get_hit", |i| format!("get {}\r\n", key(i))),
        ("mg_miss", |i| format!("mg {} v\r\n", key(ITEMS + i))),
    ];
    for (name, request) in reads {
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                run(&store, request(next()).as_bytes(), &mut out);
                black_box(&out);
            });
        });
    }
    let mut set = Vec::new();
    group.bench_function("ms_replace", |b| {
        b.iter(|| {
            out.clear();
            set.clear();
            set.extend_from_slice(format!("ms {} {VALUE}\r\n", key(next())).as_bytes());
            set.extend_from_slice(&value);
            set.extend_from_slice(b"\r\n");
            run(&store, &set, &mut out);
            black_box(&out);
        });
    });
    group.finish();
    drop(store);
    drop(heap);
    let _ = Heap::remove(&path);
}

criterion_group!(benches, requests);
criterion_main!(benches);
