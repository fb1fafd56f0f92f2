//! crc32c (Castagnoli), exactly as the `crc32c` crate computes it, with the SSE 4.2
//! instruction inlined for the short inputs the hot paths checksum: a block header's seven
//! words, the two words before a payload, a small payload. The crate's general routine
//! splits its input and dispatches to interleaved loops, which pays off only on longer
//! inputs; those still go to it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Inputs at least this long go to the crate, whose three-way interleaving beats one chain
/// of dependent instructions there.
pub(crate) const INLINE_MAX: usize = 256;

/// The crc32c of `crc`'s input followed by the little-endian bytes of `words` (as
/// `crc32c::crc32c_append(crc, bytes of words)`).
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn append_words<const N: usize>(crc: u32, words: &[u64; N]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2 (checked just above), the only feature `hw::words`
        // is compiled for.
        return !(unsafe { hw::words(u64::from(!crc), words) } as u32);
    }
    words.iter().fold(crc, |crc, word| {
        crc32c::crc32c_append(crc, &word.to_le_bytes())
    })
}

/// The crc32c of `crc`'s input followed by `bytes` (as `crc32c::crc32c_append`).
#[inline]
pub(crate) fn append(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() < INLINE_MAX && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: as in `append_words`.
        return !(unsafe { hw::bytes(u64::from(!crc), bytes) } as u32);
    }
    crc32c::crc32c_append(crc, bytes)
}

/// The crc32c of the little-endian bytes of `words` followed by `bytes` (as
/// `append(append_words(0, words), bytes)`), with one feature check and one call for the two.
#[inline]
pub(crate) fn words_then_bytes<const N: usize>(words: &[u64; N], bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() < INLINE_MAX && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: as in `append_words`.
        let crc = unsafe { hw::words(u64::from(!0u32), words) };
        // SAFETY: as in `append_words`.
        return !(unsafe { hw::bytes(crc, bytes) } as u32);
    }
    append(append_words(0, words), bytes)
}

/// [`words_then_bytes`] for a caller that copies `bytes` as it checksums them: each whole
/// 8-byte word of `bytes` is stored (Relaxed, in native byte order, so that the destination
/// holds the same bytes) into the next word of `dest`, then each byte after the last whole
/// word goes to `byte`, with its index in `bytes`, in one pass over them (a short payload
/// is loaded once, for its checksum and its store). One chain of dependent instructions: for
/// inputs under [`INLINE_MAX`], where the caller chooses it. `dest` holds at least
/// `bytes.len() / 8` words; words past those are not touched.
#[inline]
pub(crate) fn words_then_bytes_copying<const N: usize>(
    words: &[u64; N],
    bytes: &[u8],
    dest: &[AtomicU64],
    mut byte: impl FnMut(usize, u8),
) -> u32 {
    debug_assert!(dest.len() >= bytes.len() / 8);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: as in `append_words`.
        let crc = unsafe { hw::words(u64::from(!0u32), words) };
        // SAFETY: as in `append_words`.
        return !(unsafe { hw::bytes_copying(crc, bytes, dest, byte) } as u32);
    }
    let (chunks, rest) = bytes.as_chunks::<8>();
    for (chunk, to) in chunks.iter().zip(dest) {
        // ORDERING: Relaxed; the caller publishes the copy with a later Release store.
        to.store(u64::from_ne_bytes(*chunk), Ordering::Relaxed);
    }
    let rest_at = chunks.len() * 8;
    for (j, &b) in rest.iter().enumerate() {
        byte(rest_at + j, b);
    }
    words_then_bytes(words, bytes)
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The raw crc32c register after `words` (no pre- or post-inversion); a loop the
    /// compiler unrolls, the count being a constant.
    #[target_feature(enable = "sse4.2")]
    pub(super) fn words<const N: usize>(mut crc: u64, words: &[u64; N]) -> u64 {
        for &word in words {
            crc = _mm_crc32_u64(crc, word);
        }
        crc
    }

    /// The raw crc32c register after `bytes`, eight at a time, then one at a time.
    #[target_feature(enable = "sse4.2")]
    pub(super) fn bytes(mut crc: u64, bytes: &[u8]) -> u64 {
        let (chunks, rest) = bytes.as_chunks::<8>();
        for chunk in chunks {
            crc = _mm_crc32_u64(crc, u64::from_le_bytes(*chunk));
        }
        for &byte in rest {
            crc = u64::from(_mm_crc32_u8(crc as u32, byte));
        }
        crc
    }

    /// [`bytes`], storing each whole word into the next of `dest` and handing each last
    /// byte to `byte` as it goes (see `words_then_bytes_copying`).
    #[target_feature(enable = "sse4.2")]
    pub(super) fn bytes_copying(
        mut crc: u64,
        bytes: &[u8],
        dest: &[AtomicU64],
        mut byte: impl FnMut(usize, u8),
    ) -> u64 {
        let (chunks, rest) = bytes.as_chunks::<8>();
        for (chunk, to) in chunks.iter().zip(dest) {
            crc = _mm_crc32_u64(crc, u64::from_le_bytes(*chunk));
            // ORDERING: Relaxed, as in `words_then_bytes_copying`.
            to.store(u64::from_ne_bytes(*chunk), Ordering::Relaxed);
        }
        let rest_at = chunks.len() * 8;
        for (j, &b) in rest.iter().enumerate() {
            crc = u64::from(_mm_crc32_u8(crc as u32, b));
            byte(rest_at + j, b);
        }
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn words_match_the_crate(crc in any::<u32>(), words in any::<[u64; 7]>()) {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            prop_assert_eq!(append_words(crc, &words), crc32c::crc32c_append(crc, &bytes));
            prop_assert_eq!(append_words(crc, &[words[0]]), crc32c::crc32c_append(crc, &bytes[..8]));
            prop_assert_eq!(append_words(crc, &[words[0], words[1]]), crc32c::crc32c_append(crc, &bytes[..16]));
        }

        #[test]
        fn bytes_match_the_crate(crc in any::<u32>(), bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(append(crc, &bytes), crc32c::crc32c_append(crc, &bytes));
        }
    }

    proptest! {
        #[test]
        fn words_then_bytes_checksums_the_concatenation(words in any::<[u64; 3]>(), bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let mut all: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            all.extend_from_slice(&bytes);
            prop_assert_eq!(words_then_bytes(&words, &bytes), crc32c::crc32c(&all));
            // The two words before a payload.
            let mut two: Vec<u8> = words[..2].iter().flat_map(|w| w.to_le_bytes()).collect();
            two.extend_from_slice(&bytes);
            prop_assert_eq!(words_then_bytes(&[words[0], words[1]], &bytes), crc32c::crc32c(&two));
        }
    }

    proptest! {
        #[test]
        fn copying_checksums_as_words_then_bytes_and_copies_every_byte_once(words in any::<[u64; 2]>(), bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            // One word more than the whole words of `bytes`: it must stay untouched.
            let dest: Vec<AtomicU64> = (0..=bytes.len() / 8).map(|_| AtomicU64::new(!0)).collect();
            let tail = std::cell::RefCell::new(vec![None; bytes.len() % 8]);
            let whole = bytes.len() / 8 * 8;
            let crc = words_then_bytes_copying(&words, &bytes, &dest, |j, b| {
                assert!(tail.borrow_mut()[j - whole].replace(b).is_none());
            });
            prop_assert_eq!(crc, words_then_bytes(&words, &bytes));
            let mut seen: Vec<u8> = dest[..bytes.len() / 8]
                .iter()
                .flat_map(|w| w.load(Ordering::Relaxed).to_ne_bytes())
                .collect();
            seen.extend(tail.into_inner().into_iter().map(Option::unwrap));
            prop_assert_eq!(seen, bytes);
            prop_assert_eq!(dest[dest.len() - 1].load(Ordering::Relaxed), !0);
        }
    }

    #[test]
    fn chained_calls_checksum_the_concatenation() {
        let words = [1u64, 2, 3];
        let tail = b"payload bytes";
        let mut all: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        all.extend_from_slice(tail);
        assert_eq!(append(append_words(0, &words), tail), crc32c::crc32c(&all));
    }
}
