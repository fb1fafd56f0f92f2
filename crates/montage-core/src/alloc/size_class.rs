//! Size classes: the block sizes spans are carved into. Pure arithmetic.

#![deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

use crate::base::layout::{HEADER_LEN, SPAN_SIZE, TRAILER_LEN};

/// Block sizes (header included), all multiples of the 64-byte cache line so that blocks
/// never share a line: 64 B to 1 KiB in 64-byte steps, then four steps per doubling to 16 KiB.
pub(crate) const CLASS_SIZES: [u64; 32] = [
    64, 128, 192, 256, 320, 384, 448, 512, 576, 640, 704, 768, 832, 896, 960, 1024, //
    1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, //
    5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384,
];

/// How many size classes there are.
pub(crate) const NUM_CLASSES: usize = CLASS_SIZES.len();

/// The largest block a size class holds; bigger blocks take whole spans.
pub(crate) const MAX_CLASS_SIZE: u64 = 16384;

const _: () = assert!(CLASS_SIZES[NUM_CLASSES - 1] == MAX_CLASS_SIZE);
const _: () = assert!(NUM_CLASSES < 256);

/// The smallest class whose blocks hold `total` bytes, or `None` if it needs a large block.
pub(crate) fn class_for(total: u64) -> Option<u8> {
    if total <= 1024 {
        let class = total.max(1).div_ceil(64).saturating_sub(1);
        return u8::try_from(class).ok();
    }
    CLASS_SIZES
        .iter()
        .position(|&size| size >= total)
        .and_then(|class| u8::try_from(class).ok())
}

/// Per class, `ceil(2^64 / m)` for blocks of `m` lines (0 for one line), so that a count of
/// lines `n < 2^32` is a multiple of `m` exactly when `n * c <= c - 1` in wrapping
/// arithmetic: one multiplication instead of a division (Lemire, Kaser and Kurz, "Faster
/// remainder by direct computation", 2019).
// Evaluated by the compiler: an index out of bounds fails the build.
#[allow(clippy::indexing_slicing)]
const LINE_MULTIPLES: [u64; NUM_CLASSES] = {
    let mut out = [0u64; NUM_CLASSES];
    let mut class = 0;
    while class < NUM_CLASSES {
        let lines = CLASS_SIZES[class] / LINE;
        out[class] = (u64::MAX / lines).wrapping_add(1);
        class += 1;
    }
    out
};

/// Bytes in a cache line, the unit every class size is a multiple of.
const LINE: u64 = 64;

// Evaluated by the compiler, as above.
#[allow(clippy::indexing_slicing)]
const _: () = {
    let mut class = 0;
    while class < NUM_CLASSES {
        assert!(CLASS_SIZES[class].is_multiple_of(LINE));
        class += 1;
    }
};

/// Whether `within`, an offset inside a span, is where a block of `class` starts in a span
/// carved for that class: a multiple of the class size whose block ends inside the span.
/// No division: the hot paths ask this for every block handle they are given.
#[inline]
pub(crate) fn is_block_start(class: u8, within: u64) -> bool {
    let Some(&multiple) = LINE_MULTIPLES.get(usize::from(class)) else {
        return false;
    };
    let size = class_size(class);
    if within & (LINE - 1) != 0 || within.checked_add(size).is_none_or(|end| end > SPAN_SIZE) {
        return false;
    }
    // A whole number of lines below the span size (64 KiB), so well under 2^32.
    let lines = within / LINE;
    lines.wrapping_mul(multiple) <= multiple.wrapping_sub(1)
}

/// The block size of `class`.
pub(crate) fn class_size(class: u8) -> u64 {
    CLASS_SIZES
        .get(usize::from(class))
        .copied()
        .unwrap_or(MAX_CLASS_SIZE)
}

/// How many blocks of `class` one span holds.
pub(crate) fn blocks_per_span(class: u8) -> u64 {
    SPAN_SIZE.checked_div(class_size(class)).unwrap_or(0)
}

/// How many spans a large block of `total` bytes covers.
pub(crate) fn spans_for(total: u64) -> u64 {
    total.div_ceil(SPAN_SIZE)
}

/// The bytes the block for a payload of `payload_len` bytes takes in the heap, its header and
/// trailer included: the block size of its size class, or whole spans for a payload larger
/// than the largest class.
///
/// Payloads whose blocks have the same size share spans, and a freed block holds only a
/// payload of its own size: a cache that must free room for a payload frees payloads of
/// the same block size (or whole spans).
#[must_use]
pub fn block_size(payload_len: u64) -> u64 {
    let total = payload_len.saturating_add(HEADER_LEN + TRAILER_LEN);
    match class_for(total) {
        Some(class) => class_size(class),
        None => spans_for(total).saturating_mul(SPAN_SIZE),
    }
}

#[cfg(test)]
#[allow(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_payload_takes_the_smallest_block_that_holds_it_with_its_header_and_trailer() {
        let overhead = HEADER_LEN + TRAILER_LEN;
        assert_eq!(block_size(0), 64);
        assert_eq!(block_size(64 - overhead), 64);
        assert_eq!(block_size(64 - overhead + 1), 128);
        assert_eq!(block_size(1024 - overhead + 1), 1280);
        assert_eq!(block_size(MAX_CLASS_SIZE - overhead), MAX_CLASS_SIZE);
        assert_eq!(block_size(MAX_CLASS_SIZE - overhead + 1), SPAN_SIZE);
        assert_eq!(block_size(SPAN_SIZE - overhead + 1), 2 * SPAN_SIZE);
        for len in 0..3 * SPAN_SIZE {
            let size = block_size(len);
            assert!(size >= len + overhead, "{len}");
            let smaller = CLASS_SIZES.iter().any(|&c| c >= len + overhead && c < size);
            assert!(!smaller, "{len}: a smaller class holds it");
        }
    }

    #[test]
    fn block_starts_are_exactly_the_multiples_of_the_class_size_inside_the_span() {
        for class in 0..u8::try_from(NUM_CLASSES).unwrap() {
            let size = class_size(class);
            for within in 0..SPAN_SIZE + 2 * MAX_CLASS_SIZE {
                let expected = within % size == 0 && within / size < blocks_per_span(class);
                assert_eq!(
                    is_block_start(class, within),
                    expected,
                    "class {class} ({size} B), offset {within}"
                );
            }
        }
        assert!(!is_block_start(u8::try_from(NUM_CLASSES).unwrap(), 0));
    }

    #[test]
    fn classes_are_sorted_line_multiples() {
        for pair in CLASS_SIZES.windows(2) {
            assert!(pair[0] < pair[1]);
        }
        assert!(CLASS_SIZES.iter().all(|s| s % 64 == 0));
        assert_eq!(class_for(1), Some(0));
        assert_eq!(class_for(64), Some(0));
        assert_eq!(class_for(65), Some(1));
        assert_eq!(class_for(1025), Some(16));
        assert_eq!(class_for(MAX_CLASS_SIZE), Some(31));
        assert_eq!(class_for(MAX_CLASS_SIZE + 1), None);
    }

    proptest! {
        #[test]
        fn class_for_picks_the_smallest_fitting_class(total in 1u64..=MAX_CLASS_SIZE) {
            let class = class_for(total).unwrap();
            prop_assert!(class_size(class) >= total);
            if class > 0 {
                prop_assert!(class_size(class - 1) < total);
            }
        }
    }
}
