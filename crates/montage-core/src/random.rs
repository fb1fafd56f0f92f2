//! Random ids (a heap's creation id, a journal's id and session): std's randomly keyed
//! hasher over the time and the process id, which is all the randomness they need (distinct
//! across heaps, journals and opens), without a dependency.

use std::hash::{BuildHasher, Hasher};

/// A fresh random 64-bit value.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
