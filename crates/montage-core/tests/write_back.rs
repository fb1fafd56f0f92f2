//! `WriteBack::MeasureEachOp`: an operation's writes are durable when it ends, not only when its
//! epoch is written back; `WriteBack::Epoch` (the default) leaves them to the advance.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use montage_core::sim::SimMode;
use montage_core::{Heap, HeapConfig, PBlock, WriteBack};

/// Runs one operation that allocates a payload of distinctive bytes on a simulated heap with
/// `write_back`, and returns the heap, the block and the bytes.
fn one_op(write_back: WriteBack) -> (Heap, PBlock, Vec<u8>) {
    let config = HeapConfig::simulated(1 << 20, SimMode::Prefix).write_back(write_back);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("write-back").unwrap();
    let bytes: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
    let guard = heap.begin_op().unwrap();
    let block = guard.alloc(owner, 42, &bytes).unwrap();
    drop(guard);
    (heap, block, bytes)
}

fn durable_payload(heap: &Heap, block: PBlock, len: usize) -> Vec<u8> {
    let image = heap.simulator().unwrap().durable_image();
    let at = block.payload_offset() as usize;
    image[at..at + len].to_vec()
}

#[test]
fn each_op_write_back_makes_an_operation_durable_as_it_ends() {
    let (heap, block, bytes) = one_op(WriteBack::MeasureEachOp);
    assert_eq!(heap.advances(), 0);
    assert_eq!(durable_payload(&heap, block, bytes.len()), bytes);
}

/// Every operation of a run, not only the first (which finds the thread's cache empty and
/// takes the long way), is durable when it ends, with no advance.
#[test]
fn each_op_write_back_makes_every_operation_durable_as_it_ends() {
    let config =
        HeapConfig::simulated(1 << 20, SimMode::Prefix).write_back(WriteBack::MeasureEachOp);
    let heap = Heap::create(&config).unwrap();
    let owner = heap.register("write-back").unwrap();
    for round in 0..100u32 {
        let bytes: Vec<u8> = (0..64u32).map(|i| (i * 7 + round) as u8).collect();
        let guard = heap.begin_op().unwrap();
        // Two blocks: the second is logged in the operation's own log.
        let first = guard.alloc(owner, 42, &bytes).unwrap();
        let second = guard.alloc(owner, 42, &bytes[..32]).unwrap();
        drop(guard);
        assert_eq!(
            durable_payload(&heap, first, bytes.len()),
            bytes,
            "round {round}"
        );
        assert_eq!(
            durable_payload(&heap, second, 32),
            bytes[..32],
            "round {round}"
        );
    }
    assert_eq!(heap.advances(), 0);
}

#[test]
fn epoch_write_back_leaves_an_operation_to_the_advance() {
    let (heap, block, bytes) = one_op(WriteBack::Epoch);
    assert_ne!(durable_payload(&heap, block, bytes.len()), bytes);
    heap.advance_epoch().unwrap();
    heap.advance_epoch().unwrap();
    assert_eq!(durable_payload(&heap, block, bytes.len()), bytes);
}

#[test]
fn each_op_write_back_recovers_like_epoch_write_back() {
    let (heap, block, bytes) = one_op(WriteBack::MeasureEachOp);
    heap.sync().unwrap();
    let image = heap.simulator().unwrap().crash(7);
    drop(heap);
    let config =
        HeapConfig::simulated(1 << 20, SimMode::Prefix).write_back(WriteBack::MeasureEachOp);
    let heap = Heap::open_image(image, &config).unwrap();
    assert_eq!(heap.read_payload(block).unwrap(), bytes);
}
