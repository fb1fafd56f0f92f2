//! YCSB's scrambled Zipfian: a Zipfian rank spread over the key range, so that the hot keys
//! are not neighbours. Shared by the harness's workloads and `montage-kv-load`.

/// Spreads Zipfian rank `rank` over keys `0..key_range` (an FNV-1a hash of the rank).
pub(crate) fn scramble(rank: u64, key_range: u64) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for byte in rank.to_le_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % key_range
}
