//! An order book, written as one would write it for DRAM (two `BTreeMap`s of price levels,
//! each a FIFO queue of orders, and a list of fills), made persistent by `Logged` with
//! `#[montage::logged]` on its own `impl` block: each `place` and `cancel` is logged, and
//! opening the heap again replays them (from the last snapshot).
//!
//! Two traders place orders from two threads; every order is acknowledged only after
//! `sync()`. Then the heap is closed (a last snapshot), opened again, and the recovered book
//! is checked against the one before: the same levels, the same fills.
//!
//! The book is deterministic, as replay needs: the time of an order is an argument of
//! `place` (log the decision, not the dice), never read inside it.
//!
//! `cargo run --release --example order_book [PATH]`

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, VecDeque};

use montage::collections::Logged;
use montage::{Heap, HeapConfig};

/// An order resting on the book.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
    trader: String,
    quantity: u64,
    at: u64,
}

/// A trade between a resting order and an incoming one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Fill {
    resting: u64,
    incoming: u64,
    price: u64,
    quantity: u64,
}

/// Bids and asks by price, oldest order first at each price; every fill so far.
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Book {
    bids: BTreeMap<u64, VecDeque<Order>>,
    asks: BTreeMap<u64, VecDeque<Order>>,
    fills: Vec<Fill>,
    next_id: u64,
}

#[montage::logged(snapshot)]
impl Book {
    /// Places an order to buy (or sell) `quantity` at `price` or better, at time `at`: it
    /// trades with the best resting orders of the other side while prices cross, and the
    /// rest rests on the book. Returns the order's id and its fills.
    pub(crate) fn place(
        &mut self,
        trader: String,
        buy: bool,
        price: u64,
        quantity: u64,
        at: u64,
    ) -> (u64, Vec<Fill>) {
        self.next_id += 1;
        let id = self.next_id;
        let mut left = quantity;
        let mut fills = Vec::new();
        let other = if buy { &mut self.asks } else { &mut self.bids };
        while left > 0 {
            // The best level of the other side, if its price crosses ours.
            let best = if buy {
                other.first_entry().filter(|level| *level.key() <= price)
            } else {
                other.last_entry().filter(|level| *level.key() >= price)
            };
            let Some(mut level) = best else { break };
            let level_price = *level.key();
            let queue = level.get_mut();
            while left > 0 {
                let Some(resting) = queue.front_mut() else {
                    break;
                };
                let matched = left.min(resting.quantity);
                fills.push(Fill {
                    resting: resting.id,
                    incoming: id,
                    price: level_price,
                    quantity: matched,
                });
                left -= matched;
                resting.quantity -= matched;
                if resting.quantity == 0 {
                    queue.pop_front();
                }
            }
            if queue.is_empty() {
                level.remove();
            }
        }
        if left > 0 {
            let side = if buy { &mut self.bids } else { &mut self.asks };
            side.entry(price).or_default().push_back(Order {
                id,
                trader,
                quantity: left,
                at,
            });
        }
        self.fills.extend(fills.iter().cloned());
        (id, fills)
    }

    /// Cancels a resting order; whether it was on the book.
    pub(crate) fn cancel(&mut self, id: u64) -> bool {
        for side in [&mut self.bids, &mut self.asks] {
            let found = side.iter_mut().find_map(|(&price, queue)| {
                queue.iter().position(|o| o.id == id).map(|at| (price, at))
            });
            if let Some((price, at)) = found {
                let queue = side.get_mut(&price).expect("the level just found");
                queue.remove(at);
                if queue.is_empty() {
                    side.remove(&price);
                }
                return true;
            }
        }
        false
    }

    /// The best bid and ask prices: a read, not logged.
    fn spread(&self) -> (Option<u64>, Option<u64>) {
        (
            self.bids.last_key_value().map(|(&p, _)| p),
            self.asks.first_key_value().map(|(&p, _)| p),
        )
    }
}

const ORDERS_PER_TRADER: u64 = 20_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = std::env::args_os()
        .nth(1)
        .map_or_else(|| dir.path().join("book.heap"), Into::into);
    let config = HeapConfig::new(&path).size(64 << 20).max_size(1 << 30);
    let heap = if path.exists() {
        Heap::open(&config)?
    } else {
        Heap::create(&config)?
    };
    let book: Logged<Book> = Logged::open(&heap, "book")?;
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for (trader, buy) in [("ann", true), ("bob", false)] {
            let (book, heap) = (&book, &heap);
            s.spawn(move || -> montage::Result<()> {
                for i in 0..ORDERS_PER_TRADER {
                    // Prices wander around 1,000; the time is passed in, not read inside.
                    let price = 990 + (i * 7 + u64::from(buy) * 3) % 21;
                    let (id, _fills) = book.place(trader.into(), buy, price, 1 + i % 5, i)?;
                    if i % 10 == 9 {
                        book.cancel(id - 5)?;
                    }
                    // A client is told its order is in only once it is durable.
                    if i % 1_000 == 999 {
                        heap.sync()?;
                    }
                }
                Ok(())
            });
        }
    });
    heap.sync()?;
    let took = start.elapsed();
    let orders = 2 * ORDERS_PER_TRADER;
    let before = book.read(|b| (b.bids.clone(), b.asks.clone(), b.fills.clone()))?;
    let (bid, ask) = book.read(Book::spread)?;
    println!(
        "{orders} orders in {:.0} ms ({} ns each): {} fills, best bid {bid:?}, best ask {ask:?}",
        took.as_secs_f64() * 1e3,
        took.as_nanos() / u128::from(orders),
        before.2.len(),
    );
    println!(
        "log: {} records since the last snapshot, {} calls in all",
        book.log_len(),
        book.calls()
    );
    assert!(book.verify_replay()?, "replay gives another book");

    // A restart: closing takes a last snapshot; opening loads it.
    book.close()?;
    heap.close()?;
    let heap = Heap::open(&config)?;
    let start = std::time::Instant::now();
    let book: Logged<Book> = Logged::open(&heap, "book")?;
    let after = book.read(|b| (b.bids.clone(), b.asks.clone(), b.fills.clone()))?;
    println!(
        "reopened in {:.1} ms: {} bid levels, {} ask levels, {} fills",
        start.elapsed().as_secs_f64() * 1e3,
        after.0.len(),
        after.1.len(),
        after.2.len()
    );
    assert_eq!(after, before, "the recovered book differs");
    println!("the recovered book is the book before the restart");
    book.close()?;
    heap.close()?;
    Ok(())
}
