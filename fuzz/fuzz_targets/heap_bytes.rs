//! Heap open on arbitrary metadata: the input replaces the first bytes of a valid heap (the
//! superblock, the directory, the type registry and the span table live in its first
//! 32 KiB), which is then opened and read through every structure. Nothing may panic.
//!
//! Input: a byte choosing the base heap, then the bytes to write over its start.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage_fuzz::{Input, chosen_base, open, read_everything};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(mut image) = chosen_base(&mut input) else {
        return;
    };
    let head = input.0;
    let len = head.len().min(image.len());
    image[..len].copy_from_slice(&head[..len]);
    if let Ok(heap) = open(image) {
        read_everything(&heap);
    }
});
