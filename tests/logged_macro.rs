//! `#[montage::logged]`: a structure's own methods become the logged operations of a
//! `Logged` handle, replayed when it is opened again, snapshotted with serde.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;

use montage::collections::{Logged, LoggedShards};
use montage::{Heap, HeapConfig};

/// Orders by id: (trader, quantity).
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Book {
    orders: BTreeMap<u64, (String, u32)>,
    next: u64,
}

#[montage::logged(snapshot)]
impl Book {
    /// Adds an order; returns its id.
    pub(crate) fn place(&mut self, trader: String, quantity: u32) -> u64 {
        self.next += 1;
        self.orders.insert(self.next, (trader, quantity));
        self.next
    }

    /// Removes an order; whether it was there.
    pub(crate) fn cancel(&mut self, id: u64) -> bool {
        self.orders.remove(&id).is_some()
    }

    /// Takes `by` off every order of `trader`, removing those that reach zero.
    #[allow(clippy::needless_pass_by_value)] // a logged argument is owned: it is stored
    pub(crate) fn reduce(&mut self, trader: String, by: u32) {
        self.orders.retain(|_, (who, quantity)| {
            if *who == trader {
                *quantity = quantity.saturating_sub(by);
            }
            *quantity > 0
        });
    }

    /// A read: not logged.
    pub(crate) fn open_orders(&self) -> usize {
        self.orders.len()
    }
}

#[test]
fn the_methods_of_a_logged_impl_are_logged_and_replayed() {
    use montage::Codec;

    let dir = tempfile::tempdir().unwrap();
    let config = HeapConfig::new(dir.path().join("book.heap"))
        .size(4 << 20)
        .max_size(4 << 20);
    let heap = Heap::create(&config).unwrap();
    let book = Logged::<Book>::open(&heap, "book").unwrap();
    assert_eq!(book.place("ann".into(), 5).unwrap(), 1);
    assert_eq!(book.place("bob".into(), 3).unwrap(), 2);
    assert_eq!(book.place("ann".into(), 1).unwrap(), 3);
    assert!(book.cancel(2).unwrap());
    assert!(!book.cancel(9).unwrap());
    book.reduce("ann".into(), 1).unwrap();
    assert_eq!(book.read(Book::open_orders).unwrap(), 1);
    assert_eq!(book.log_len(), 6);
    assert!(book.verify_replay().unwrap());
    let live = book.read(|b| (b.orders.clone(), b.next)).unwrap();
    drop(book);
    heap.close().unwrap();

    let heap = Heap::open(&config).unwrap();
    let book = Logged::<Book>::open(&heap, "book").unwrap();
    assert_eq!(book.read(|b| (b.orders.clone(), b.next)).unwrap(), live);
    // Dropping the handle closed it with a snapshot: the log is empty.
    assert_eq!((book.log_len(), book.calls()), (0, 6));
    assert_eq!(book.place("cy".into(), 2).unwrap(), 4);
    assert!(book.compact().unwrap());
    assert_eq!(book.place("dee".into(), 1).unwrap(), 5);
    assert_eq!(book.log_len(), 1);
    assert!(book.verify_replay().unwrap());
    drop(book);
    let book = Logged::<Book>::open(&heap, "book").unwrap();
    assert_eq!(
        book.read(|b| b.orders[&4].clone()).unwrap(),
        ("cy".to_owned(), 2)
    );
    assert_eq!((book.log_len(), book.calls()), (0, 8));
    drop(book);
    heap.close().unwrap();

    // The operations' encoding round-trips, and its id follows the methods' signatures.
    let mut bytes = Vec::new();
    BookOp::Place {
        trader: "dee".into(),
        quantity: 7,
    }
    .encode(&mut bytes)
    .unwrap();
    assert!(matches!(
        BookOp::decode(&bytes),
        Some(BookOp::Place { trader, quantity: 7 }) if trader == "dee"
    ));
    assert!(BookOp::decode(&bytes[..bytes.len() - 1]).is_none());
    assert_eq!(BookOp::codec_id().unwrap(), <BookOp as Codec>::CODEC_ID);
}

#[test]
fn the_generated_methods_work_on_each_shard_of_a_sharded_structure() {
    let heap = Heap::create(&HeapConfig::in_memory(8 << 20)).unwrap();
    let books = LoggedShards::<Book>::open(&heap, "books", 4).unwrap();
    let traders = ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal"].map(String::from);
    for (i, trader) in traders.iter().enumerate() {
        let book = books.shard(trader).unwrap();
        book.place(trader.clone(), 1 + i as u32).unwrap();
        book.place(trader.clone(), 2).unwrap();
        book.reduce(trader.clone(), 2).unwrap();
    }
    // Each trader's orders are in the shard its name goes to, and only there.
    for (i, trader) in traders.iter().enumerate() {
        let shard = books.shard_of(trader).unwrap();
        for other in 0..books.shards() {
            let theirs = books
                .shard_at(other)
                .unwrap()
                .read(|b| b.orders.values().filter(|(who, _)| who == trader).count())
                .unwrap();
            let expected = if other == shard {
                usize::from(i > 1)
            } else {
                0
            };
            assert_eq!(theirs, expected, "{trader} in shard {other}");
        }
    }
    let used: std::collections::BTreeSet<usize> =
        traders.iter().map(|t| books.shard_of(t).unwrap()).collect();
    assert!(
        used.len() > 1,
        "eight names spread over the shards: {used:?}"
    );
    assert_eq!(books.calls(), 24);
    assert!(books.verify_replay().unwrap());
    let orders = |books: &LoggedShards<Book>| -> Vec<_> {
        (0..books.shards())
            .map(|i| {
                books
                    .shard_at(i)
                    .unwrap()
                    .read(|b| b.orders.clone())
                    .unwrap()
            })
            .collect()
    };
    let live = orders(&books);
    drop(books);
    let books = LoggedShards::<Book>::open(&heap, "books", 4).unwrap();
    assert_eq!(orders(&books), live);
    assert_eq!(books.log_len(), 0, "closed with a snapshot of each shard");
}
