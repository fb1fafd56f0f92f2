//! `#[montage::logged]`: a structure's own methods become the logged operations of a
//! `Logged` handle, replayed when it is opened again, snapshotted with serde.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::collections::BTreeMap;

use montage::collections::Logged;
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
    assert!(book.compact().unwrap());
    assert_eq!(book.place("cy".into(), 2).unwrap(), 4);
    drop(book);
    let book = Logged::<Book>::open(&heap, "book").unwrap();
    assert_eq!(
        book.read(|b| b.orders[&4].clone()).unwrap(),
        ("cy".to_owned(), 2)
    );
    assert_eq!(book.log_len(), 1);
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
