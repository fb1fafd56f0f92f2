//! The collections' decoding of their entries: a payload of arbitrary bytes, with the owner
//! and type id of one of a heap's structures (so the structure takes it for one of its
//! own), is added to a valid heap, which is then opened and read through every structure.
//! Decoding must fail with a typed error, never panic.
//!
//! Input: a byte choosing the structure, a byte choosing the block's uid (fresh, or one a
//! live entry has), then the payload's bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage_core::raw::BlockSpec;
use montage_core::{BlockKind, ScanFilter};
use montage_fuzz::{Input, MAP, QUEUE, SORTED, bases, open, read_everything};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let (Some(which), Some(uid_choice)) = (input.byte(), input.byte()) else {
        return;
    };
    let Ok(heap) = open(bases()[0].clone()) else {
        panic!("the clean base heap does not open");
    };
    let name = [MAP, SORTED, QUEUE][usize::from(which) % 3];
    let owner = heap.lookup(name).expect("every structure is registered");
    let blocks = heap
        .collect(ScanFilter::all().owner(owner))
        .expect("a scan");
    let Some(model) = blocks.iter().find(|b| b.spec.kind != BlockKind::Delete) else {
        return;
    };
    let max_uid = blocks.iter().map(|b| b.spec.uid).max().unwrap_or(0);
    let uid = if uid_choice % 2 == 0 {
        max_uid + 1 + u64::from(uid_choice)
    } else {
        blocks[usize::from(uid_choice) % blocks.len()].spec.uid
    };
    let spec = BlockSpec::new(model.spec.epoch, uid)
        .owner(owner)
        .type_id(model.spec.type_id);
    if heap.raw().alloc_bytes(spec, input.0).is_ok() {
        read_everything(&heap);
    }
});
