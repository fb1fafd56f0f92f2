//! What logging costs a structure kept in DRAM: `Logged<Book>::apply` against the same
//! call on a `Mutex<Book>`, on a pmem-backend heap file in `MONTAGE_BENCH_DIR` (default
//! `/dev/shm`), one thread. `Book` is a small order book: a call places an order at a price
//! level of a `BTreeMap` and matches it against the opposite side, the kind of method the
//! semantic log is for. A second pair measures a call that does almost nothing (a counter),
//! where the log's own cost shows whole; a third, a call that works for about 2 us (the
//! kind of method the 0.9x target is about), with the default snapshot policy on its
//! thread. The first two take a snapshot every 100,000 calls (in the measured loop, so its
//! cost is counted), which keeps their logs short. A last pair makes a counter's call and a
//! `HashMap` update in one `together`, and apart.

#![forbid(unsafe_code)]
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
#![allow(clippy::unwrap_used)] // a benchmark stops loudly

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::sync::Mutex;

use criterion::{Criterion, criterion_group, criterion_main};
use montage_collections::{HashMap, Logged, Replay, together};
use montage_core::{BackendKind, Heap, HeapConfig};
use montage_testkit::fresh_bench_path;

/// Resting orders by price: (id, quantity) in arrival order; bids and asks.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Book {
    bids: BTreeMap<u64, VecDeque<(u64, u64)>>,
    asks: BTreeMap<u64, VecDeque<(u64, u64)>>,
    next_id: u64,
}

impl Book {
    /// Places an order (`price`, `quantity`, bid if `price` is even, else ask), matching it
    /// against the best opposite prices first; returns the quantity filled.
    fn place(&mut self, price: u64, quantity: u64) -> u64 {
        let bid = price.is_multiple_of(2);
        let mut left = quantity;
        let opposite = if bid { &mut self.asks } else { &mut self.bids };
        while left > 0 {
            let best = if bid {
                opposite.first_entry()
            } else {
                opposite.last_entry()
            };
            let Some(mut level) = best else { break };
            let crosses = if bid {
                *level.key() <= price
            } else {
                *level.key() >= price
            };
            if !crosses {
                break;
            }
            let orders = level.get_mut();
            while left > 0 {
                let Some(front) = orders.front_mut() else {
                    break;
                };
                let take = front.1.min(left);
                front.1 -= take;
                left -= take;
                if front.1 == 0 {
                    orders.pop_front();
                }
            }
            if orders.is_empty() {
                level.remove();
            }
        }
        if left > 0 {
            self.next_id += 1;
            let side = if bid { &mut self.bids } else { &mut self.asks };
            let level = side.entry(price).or_default();
            level.push_back((self.next_id, left));
            // Orders expire: a level keeps its newest 16, so the book stays small.
            if level.len() > 16 {
                level.pop_front();
            }
        }
        quantity - left
    }
}

impl Replay for Book {
    type Op = (u64, u64);
    type Output = u64;

    fn apply(&mut self, (price, quantity): (u64, u64)) -> u64 {
        self.place(price, quantity)
    }

    montage_collections::serde_snapshots!();
}

/// A counter: a call that does almost nothing.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Counter(u64);

impl Replay for Counter {
    type Op = u64;
    type Output = u64;

    fn apply(&mut self, by: u64) -> u64 {
        self.0 += by;
        self.0
    }

    montage_collections::serde_snapshots!();
}

/// A structure whose calls do real work, a few microseconds each: a table of 512 words, and
/// a call stirs it for a number of rounds from a seed (both passed in, as replay needs).
#[derive(serde::Serialize, serde::Deserialize)]
struct Table(Vec<u64>);

impl Default for Table {
    fn default() -> Table {
        Table((0..512).collect())
    }
}

impl Table {
    fn stir(&mut self, seed: u64, rounds: u64) -> u64 {
        let mut x = seed;
        for _ in 0..rounds {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % 512) as usize;
            self.0[at] = self.0[at].rotate_left(5) ^ x;
        }
        self.0[(x % 512) as usize]
    }
}

impl Replay for Table {
    type Op = (u64, u64);
    type Output = u64;

    fn apply(&mut self, (seed, rounds): (u64, u64)) -> u64 {
        self.stir(seed, rounds)
    }

    montage_collections::serde_snapshots!();
}

/// Rounds of `Table::stir` per call: about 2 us on the project's machine.
const STIR_ROUNDS: u64 = 1_000;

/// Calls between snapshots: the log a structure keeps stays this short, and the snapshots'
/// cost is part of what is measured.
const COMPACT_EVERY: u64 = 100_000;

/// Prices around 1,000 (so that orders cross and rest), quantities 1 to 16.
fn order(i: u64) -> (u64, u64) {
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (990 + (mixed >> 59), 1 + ((mixed >> 40) & 15))
}

fn logging(c: &mut Criterion) {
    let path = fresh_bench_path("logged");
    let config = HeapConfig::new(&path)
        .size(1 << 30)
        .max_size(1 << 30)
        .backend(BackendKind::Pmem);
    let heap = Heap::create(&config).unwrap();
    let mut group = c.benchmark_group("logged");
    let book = Logged::<Book>::open(&heap, "book").unwrap();
    let mut i = 0u64;
    group.bench_function("order_book_place_logged", |b| {
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(COMPACT_EVERY) {
                book.compact().unwrap();
            }
            black_box(book.apply(order(i)).unwrap())
        });
    });
    let plain = Mutex::new(Book::default());
    let mut i = 0u64;
    group.bench_function("order_book_place_dram", |b| {
        b.iter(|| {
            i += 1;
            let (price, quantity) = order(i);
            black_box(plain.lock().unwrap().place(price, quantity))
        });
    });
    let counter = Logged::<Counter>::open(&heap, "counter").unwrap();
    let mut i = 0u64;
    group.bench_function("counter_add_logged", |b| {
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(COMPACT_EVERY) {
                counter.compact().unwrap();
            }
            black_box(counter.apply(1).unwrap())
        });
    });
    let plain = Mutex::new(Counter::default());
    group.bench_function("counter_add_dram", |b| {
        b.iter(|| black_box(plain.lock().unwrap().apply(1)));
    });
    // The default snapshot policy, on its thread: its cost is part of what is measured.
    let table = Logged::<Table>::open(&heap, "table").unwrap();
    let mut i = 0u64;
    group.bench_function("table_stir_2us_logged", |b| {
        b.iter(|| {
            i += 1;
            black_box(table.apply((i, STIR_ROUNDS)).unwrap())
        });
    });
    let plain = Mutex::new(Table::default());
    let mut i = 0u64;
    group.bench_function("table_stir_2us_dram", |b| {
        b.iter(|| {
            i += 1;
            black_box(plain.lock().unwrap().stir(i, STIR_ROUNDS))
        });
    });
    // A logged call and a map update in one `together`, against the two made apart: what
    // failure atomicity across structures costs.
    let map: HashMap<u64, u64> = HashMap::open(&heap, "map").unwrap();
    let mut i = 0u64;
    group.bench_function("counter_add_and_map_put_together", |b| {
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(COMPACT_EVERY) {
                counter.compact().unwrap();
            }
            together(&heap, |tx| {
                tx.log(&counter, 1)?;
                tx.hash_map(&map, |m| m.put(i % 1024, i))
            })
            .unwrap()
        });
    });
    let mut i = 0u64;
    group.bench_function("counter_add_and_map_put_apart", |b| {
        b.iter(|| {
            i += 1;
            if i.is_multiple_of(COMPACT_EVERY) {
                counter.compact().unwrap();
            }
            black_box(counter.apply(1).unwrap());
            map.put(i % 1024, i).unwrap()
        });
    });
    group.finish();
    drop((book, counter, table, map));
    heap.close().unwrap();
    Heap::remove(&path).unwrap();
}

criterion_group!(benches, logging);
criterion_main!(benches);
