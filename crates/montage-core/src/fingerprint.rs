//! A `const` 64-bit FNV-1a hash, from which the derive builds each payload type's id at
//! compile time. The id must be the same in every build of the same source, on every
//! compiler, so it hashes only strings and numbers the derive spells out, never anything
//! the compiler may choose (such as `core::any::type_name`).

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// A running FNV-1a hash. Strings are hashed with their length first, so that
/// `("ab", "c")` and `("a", "bc")` differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// The empty hash.
    #[must_use]
    pub const fn new() -> Fingerprint {
        Fingerprint(OFFSET_BASIS)
    }

    const fn byte(self, byte: u8) -> Fingerprint {
        Fingerprint((self.0 ^ byte as u64).wrapping_mul(PRIME))
    }

    /// Mixes in `bytes`, as they are (no length: a caller hashing several byte strings
    /// must delimit them).
    #[must_use]
    pub const fn bytes(self, bytes: &[u8]) -> Fingerprint {
        let mut hash = self;
        let mut i = 0;
        while i < bytes.len() {
            hash = hash.byte(bytes[i]);
            i += 1;
        }
        hash
    }

    /// Mixes in `value` (eight little-endian bytes).
    #[must_use]
    pub const fn u64(self, value: u64) -> Fingerprint {
        self.bytes(&value.to_le_bytes())
    }

    /// Mixes in `s`, preceded by its length.
    #[must_use]
    pub const fn str(self, s: &str) -> Fingerprint {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }

    /// The hash value.
    #[must_use]
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fingerprint {
    fn default() -> Fingerprint {
        Fingerprint::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_reference_fnv1a_and_separates_strings() {
        // FNV-1a of the empty input is the offset basis; of eight zero bytes, a known value
        // computed by the reference algorithm byte by byte.
        assert_eq!(Fingerprint::new().finish(), OFFSET_BASIS);
        let mut h = OFFSET_BASIS;
        for _ in 0..8 {
            h = h.wrapping_mul(PRIME);
        }
        assert_eq!(Fingerprint::new().u64(0).finish(), h);
        let ab_c = Fingerprint::new().str("ab").str("c").finish();
        let a_bc = Fingerprint::new().str("a").str("bc").finish();
        assert_ne!(ab_c, a_bc);
    }
}
