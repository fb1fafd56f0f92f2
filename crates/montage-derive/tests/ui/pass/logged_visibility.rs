//! The items `#[montage::logged]` generates take the visibility of the most visible logged
//! method: `pub(crate)` methods returning a crate-private type compile without a
//! `private_interfaces` warning, and the handle trait works on the handle.

#![deny(warnings)]

use montage::collections::Logged;
use montage::{Heap, HeapConfig};

/// Crate-private, as the methods that return it.
#[derive(Debug, PartialEq)]
struct Receipt(u64);

#[derive(Default)]
struct Counter(u64);

#[montage::logged]
impl Counter {
    pub(crate) fn add(&mut self, by: u64) -> Receipt {
        self.0 += by;
        Receipt(self.0)
    }
}

fn main() -> montage::Result<()> {
    let heap = Heap::create(&HeapConfig::in_memory(1 << 20))?;
    let counter: Logged<Counter> = Logged::open(&heap, "counter")?;
    assert_eq!(counter.add(2)?, Receipt(2));
    assert_eq!(counter.add(3)?, Receipt(5));
    Ok(())
}
