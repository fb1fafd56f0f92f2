//! Heap open and recovery on damaged files: a valid heap (cleanly closed, or left by a
//! crash) damaged as the input says (bits flipped, words rewritten, the file cut short or
//! extended), then opened and read through every structure. Nothing may panic or hang, and
//! bit flips alone in the cleanly closed heap, its clean-shutdown flag left as it was, must
//! end in its exact contents or in an error: never in wrong data. (A rewritten word or a
//! zeroed line may zero a meta word, which is how a free block looks, and a cleared flag
//! makes a header whose epoch bits were flipped look torn, so those may lose entries
//! silently: the format's limits, `docs/design.md` INV-HDR-2.)
//!
//! Input: a byte choosing the base heap, then damage records: a kind byte, a `u32` offset,
//! and for a rewritten word a `u64` value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage_fuzz::{Input, chosen, clean_contents, contents, open, read_everything};

/// The clean-shutdown flag's place in the superblock.
const CLEAN_FLAG: usize = 0x80;

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some((clean, mut image)) = chosen(&mut input) else {
        return;
    };
    let mut only_flips = true;
    while let (Some(kind), Some(offset)) = (input.byte(), input.u32()) {
        let len = image.len().max(1);
        let at = offset as usize % len;
        only_flips &= kind % 4 == 0;
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
    let flag_intact = image.get(CLEAN_FLAG..CLEAN_FLAG + 8) == Some(&1u64.to_le_bytes()[..]);
    if let Ok(heap) = open(image) {
        if clean
            && only_flips
            && flag_intact
            && let Ok(got) = contents(&heap)
        {
            assert!(
                got == *clean_contents(),
                "bit flips in a cleanly closed heap gave wrong data without an error"
            );
        }
        read_everything(&heap);
    }
});
