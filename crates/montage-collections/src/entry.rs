//! The byte layout of a key-value entry payload, shared by the maps:
//!
//! ```text
//! 0x00  key length  u32 (little-endian)
//! 0x04  key bytes   (Codec encoding of the key)
//! ...   value bytes (Codec encoding of the value), to the end of the payload
//! ```

use montage_core::payload::{EncodeAs, Encoded};
use montage_core::{BlockView, Codec, Error, Heap, OpGuard, OwnerId, PBlock, Result};

/// The type id of an entry with keys `K` and values `V` under the structure kind `kind`.
///
/// # Errors
///
/// What the codecs' [`Codec::codec_id`] returns.
pub(crate) fn type_id<K: Codec, V: Codec>(kind: &str) -> Result<u64> {
    Ok(crate::structure::type_id_of(
        kind,
        &[K::codec_id()?, V::codec_id()?],
    ))
}

/// The entry's bytes.
///
/// # Errors
///
/// What the key's or the value's [`Codec::encode`] returns.
pub(crate) fn encode<K: Codec, V: Codec>(key: &K, value: &V) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(&mut out, key, value)?;
    Ok(out)
}

/// The entry's bytes, in `out` (cleared first), so that a caller with a buffer of its own
/// allocates nothing. The value may be any form that encodes as a `V` (see [`EncodeAs`]).
pub(crate) fn encode_into<K: Codec, V: Codec, Q: EncodeAs<V> + ?Sized>(
    out: &mut Vec<u8>,
    key: &K,
    value: &Q,
) -> Result<()> {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    key.encode(out)?;
    let key_len = u32::try_from(out.len() - 4).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&key_len.to_le_bytes());
    value.encode_as(out)
}

/// The length of an entry whose key and value encode to `key_bytes` and `value_bytes`
/// bytes.
pub(crate) fn len(key_bytes: usize, value_bytes: usize) -> u64 {
    let len = 4usize.saturating_add(key_bytes).saturating_add(value_bytes);
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// Runs `f` with the entry's bytes, encoded into this thread's encoding buffer (one buffer
/// per thread rather than an allocation per write; a nested call gets a buffer of its own).
///
/// # Errors
///
/// What encoding returns (see [`encode`]), or what `f` returns.
pub(crate) fn with_encoded<K: Codec, V: Codec, Q: EncodeAs<V> + ?Sized, R>(
    key: &K,
    value: &Q,
    f: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<R> {
    crate::structure::with_encode_buffer(|out| {
        encode_into::<K, V, Q>(out, key, value)?;
        f(out)
    })
}

/// Splits an entry into its key and value bytes.
fn split(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let key_end = 4usize.checked_add(len)?;
    Some((bytes.get(4..key_end)?, bytes.get(key_end..)?))
}

fn corrupted() -> Error {
    Error::Corrupted {
        offset: 0,
        what: "a map entry's bytes do not decode as its key and value types",
    }
}

/// The key and value of an entry.
pub(crate) fn decode<K: Codec, V: Codec>(bytes: &[u8]) -> Result<(K, V)> {
    let (key, value) = split(bytes).ok_or_else(corrupted)?;
    Ok((
        K::decode(key).ok_or_else(corrupted)?,
        V::decode(value).ok_or_else(corrupted)?,
    ))
}

/// The value of the entry `view` shows, copied out of the heap once: the key's length, then
/// the value's bytes straight into the value (see [`Codec::decode_from`]); the key is not
/// read.
#[inline]
pub(crate) fn view_value<V: Codec>(view: &BlockView<'_>) -> Result<V> {
    let key_len = view.read_u32_first().map_err(|_| corrupted())?;
    let at = u64::from(key_len) + 4;
    let value_len = u64::from(view.info().len)
        .checked_sub(at)
        .ok_or_else(corrupted)?;
    V::decode_from(Encoded::in_payload(view, at, value_len as usize)?)?.ok_or_else(corrupted)
}

/// The value of the entry in `block`, read in `op` (see [`view_value`]).
pub(crate) fn read_value<V: Codec>(op: &OpGuard<'_>, block: PBlock) -> Result<V> {
    view_value(&op.view(block)?)
}

/// The value of the entry in `block`, read outside any operation (see [`view_value`]), by a
/// caller whose lock keeps the block live and its bytes still while it reads
/// (`docs/design.md`, "Reads outside operations").
pub(crate) fn read_locked_value<V: Codec>(heap: &Heap, block: PBlock) -> Result<V> {
    view_value(&heap.view(block)?)
}

/// Rebuilds a map's index from its entries (scanned on every core): decodes each entry and
/// hands its key, value and block to `add`, which returns whether the key was new (and
/// counts it, if the map keeps a count). A key met twice is [`Error::Corrupted`] with
/// `duplicate` as its text.
pub(crate) fn rebuild_index<K: Codec, V: Codec>(
    heap: &Heap,
    owner: OwnerId,
    type_id: u64,
    type_name: &'static str,
    duplicate: &'static str,
    add: impl Fn(K, V, PBlock) -> Result<bool> + Sync,
) -> Result<()> {
    crate::structure::scan_payloads(heap, owner, &[type_id], type_name, |_, block, bytes| {
        let (key, value) = decode::<K, V>(bytes)?;
        if !add(key, value, block)? {
            return Err(Error::Corrupted {
                offset: block.offset(),
                what: duplicate,
            });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_an_error() {
        let bytes = encode(&b"key".to_vec(), &42u64).unwrap();
        assert_eq!(
            decode::<Vec<u8>, u64>(&bytes).unwrap(),
            (b"key".to_vec(), 42)
        );
        assert_eq!(u64::try_from(bytes.len()).unwrap(), len(3, 8));
        assert!(decode::<Vec<u8>, u64>(&bytes[..5]).is_err());
        assert!(decode::<Vec<u8>, u64>(&[9, 0, 0, 0, 1]).is_err());
        assert_ne!(
            type_id::<u64, u64>("hash").unwrap(),
            type_id::<u64, Vec<u8>>("hash").unwrap()
        );
    }

    #[test]
    fn values_are_read_from_the_heap_and_garbage_is_an_error() {
        let heap = Heap::create(&montage_core::HeapConfig::in_memory(1 << 20)).unwrap();
        let owner = heap.register("entries").unwrap();
        let alloc = |bytes: &[u8]| heap.run_op(|op| op.alloc(owner, 1, bytes)).unwrap();
        let long = vec![7u8; 1000];
        let good = alloc(&encode(&b"key".to_vec(), &long).unwrap());
        assert_eq!(
            view_value::<Vec<u8>>(&heap.view(good).unwrap()).unwrap(),
            long
        );
        let number = alloc(&encode(&5u64, &42u64).unwrap());
        let read = heap.run_op(|op| read_value::<u64>(op, number)).unwrap();
        assert_eq!(read, 42);
        // A key length past the payload, a payload shorter than a key length, and a value of
        // the wrong size for its type.
        for garbage in [
            &[9u8, 0, 0, 0, 1][..],
            &[1, 0],
            &encode(&5u64, &42u32).unwrap(),
        ] {
            let block = alloc(garbage);
            let err = view_value::<u64>(&heap.view(block).unwrap()).unwrap_err();
            assert!(matches!(err, Error::Corrupted { .. }), "{err:?}");
        }
    }
}
