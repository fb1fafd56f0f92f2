//! Heap open and recovery on damaged files: a valid heap (cleanly closed, or left by a
//! crash) damaged as the input says (bits flipped, words rewritten, the file cut short or
//! extended), then opened and read through every structure. Nothing may panic or hang.
//!
//! Input: a byte choosing the base heap, then damage records: a kind byte, a `u32` offset,
//! and for a rewritten word a `u64` value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage_fuzz::{Input, chosen_base, open, read_everything};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(mut image) = chosen_base(&mut input) else {
        return;
    };
    while let (Some(kind), Some(offset)) = (input.byte(), input.u32()) {
        let len = image.len().max(1);
        let at = offset as usize % len;
        match kind % 4 {
            // A flipped bit, anywhere.
            0 => {
                if let Some(byte) = image.get_mut(at) {
                    *byte ^= 1 << (offset >> 29);
                }
            }
            // A rewritten, aligned word: a torn or misdirected write.
            1 => {
                let Some(value) = input.u64() else { break };
                let at = at & !7;
                if let Some(word) = image.get_mut(at..at + 8) {
                    word.copy_from_slice(&value.to_le_bytes());
                }
            }
            // A zeroed cache line: a lost write-back.
            2 => {
                let at = at & !63;
                let end = (at + 64).min(image.len());
                image[at..end].fill(0);
            }
            // A file cut short or extended with zeros.
            _ => image.resize(offset as usize % (2 * len), 0),
        }
    }
    if let Ok(heap) = open(image) {
        read_everything(&heap);
    }
});
