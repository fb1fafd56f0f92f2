//! The derive's field readers: a payload of arbitrary bytes (of any length) stored with the
//! type id of a `#[derive(Payload)]` struct, then read through its typed handle and every
//! generated getter. A value whose bytes are not valid (a `bool` that is not 0 or 1, a
//! payload of the wrong length) must be a typed error, never a panic or a wrong type.
//!
//! Input: the payload's bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage::raw::BlockSpec;
use montage::{Epoch, EpochLength, Heap, HeapConfig, Payload};

/// Every kind of field the derive reads: integers of each width, a `bool` (with invalid
/// bit patterns), an array, and an atomic field.
#[derive(Payload, Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Record {
    a: u64,
    b: u32,
    c: u16,
    d: u8,
    flag: bool,
    bytes: [u8; 8],
    e: i64,
    #[payload(atomic)]
    counter: u64,
}

fuzz_target!(|data: &[u8]| {
    let config = HeapConfig::in_memory(256 << 10).epoch_length(EpochLength::Manual);
    let heap = Heap::create(&config).expect("an in-memory heap");
    let owner = heap.register("records").expect("a name");
    for _ in 0..3 {
        heap.advance_epoch().expect("an advance");
    }
    let spec = BlockSpec::new(Epoch::FIRST, 1)
        .owner(owner)
        .type_id(Record::TYPE_ID);
    heap.raw()
        .alloc_bytes(spec, data)
        .expect("room for the payload");
    let Ok(found) = heap.payloads::<Record>(owner, 1) else {
        return;
    };
    for (handle, record) in found {
        assert_eq!(
            data.len(),
            size_of::<Record>(),
            "a payload of the wrong length was read"
        );
        let Ok(op) = heap.begin_op() else { return };
        if let Ok(read) = handle.get(&op) {
            assert_eq!(read, record);
        }
        let _ = (
            handle.get_a(&op),
            handle.get_b(&op),
            handle.get_c(&op),
            handle.get_d(&op),
            handle.get_flag(&op),
            handle.get_bytes(&op),
            handle.get_e(&op),
            handle.get_counter(&op),
        );
        let _ = handle.cas_counter(&op, record.counter, record.counter.wrapping_add(1));
    }
});
