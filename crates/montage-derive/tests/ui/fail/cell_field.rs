use montage::Payload;

use std::cell::Cell;

#[derive(Payload)]
#[repr(C)]
struct Counter {
    hits: Cell<u64>,
}

fn main() {}
