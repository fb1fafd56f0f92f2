//! A tiny key/value structure on operations, shared by the epoch tests: 16-byte payloads
//! holding a key and a value, and the write step every test applies under a key's lock.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of it

use std::collections::BTreeMap;

use montage_core::Epoch;
use montage_core::{Heap, OpGuard, OwnerId, PBlock, Result, ScanFilter};

/// The payload type id of the key/value payloads.
pub const TYPE_KV: u64 = 0x4B56;

pub fn encode(key: u64, value: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&key.to_le_bytes());
    bytes[8..].copy_from_slice(&value.to_le_bytes());
    bytes
}

pub fn decode(bytes: &[u8]) -> (u64, u64) {
    let key = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let value = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    (key, value)
}

/// The key/value state a heap holds, with each key's block; a key found twice fails.
pub fn kv_state(heap: &Heap, owner: OwnerId) -> BTreeMap<u64, (u64, PBlock)> {
    let mut state = BTreeMap::new();
    for info in heap
        .collect(ScanFilter::all().owner(owner).type_id(TYPE_KV))
        .unwrap()
    {
        let (key, value) = decode(&heap.read_payload(info.block).unwrap());
        let previous = state.insert(key, (value, info.block));
        assert!(previous.is_none(), "key {key} recovered twice");
    }
    state
}

/// One key's DRAM state: its payload, and the epoch of the last operation that changed it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Key {
    pub block: Option<PBlock>,
    pub stamp: u64,
}

/// Inside `op`, with the key's lock held: sets `key` to `value` (insert or update) or deletes
/// it (`None`). Checks the key's epoch stamp first, so an operation never acts on the effect
/// of a newer epoch's operation, and stamps the key afterwards.
pub fn write_key(
    op: &OpGuard<'_>,
    owner: OwnerId,
    slot: &mut Key,
    key: u64,
    value: Option<u64>,
) -> Result<()> {
    op.check_epoch(Epoch::new(slot.stamp))?;
    slot.block = match (slot.block, value) {
        (Some(block), Some(v)) => Some(op.update(block, &encode(key, v))?),
        (None, Some(v)) => Some(op.alloc(owner, TYPE_KV, &encode(key, v))?),
        (Some(block), None) => {
            op.delete(block)?;
            None
        }
        (None, None) => None,
    };
    slot.stamp = op.epoch().get();
    Ok(())
}
