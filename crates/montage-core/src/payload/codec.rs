//! [`Codec`]: how a ready structure stores a key or value of a user's type inside one of
//! its own payloads, beside other data (a hash-map entry holds a key and a value). Byte
//! strings have variable length; integers, and every `#[derive(Payload)]` type (the derive
//! implements `Codec` too), have a fixed one.

use crate::alloc::block::BlockView;
use crate::fingerprint::Fingerprint;

/// The longest encoding handled in a buffer on the stack rather than an allocation (by the
/// default [`Codec::decode_from`] and by [`fingerprint_payload`]).
const STACK_BUFFER: usize = 256;

/// A key or value that a structure can store in its payloads.
///
/// `CODEC_ID` names the encoding: structures mix it into the type ids of their payloads, so
/// that opening a structure with other key or value types than it was written with is an
/// error rather than a misreading.
pub trait Codec: Sized + Send + Sync + 'static {
    /// Names the encoding (for a payload type, its type id).
    const CODEC_ID: u64;

    /// Appends the encoding of `self` to `out`.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`](crate::Error::Encode) if the value has no encoding (a codec whose
    /// format cannot hold every value of its type, such as `Serde` (the `serde` feature)
    /// for a path that is no UTF-8); `out` is then as it was. The codecs of this crate for
    /// byte strings, strings, integers and payload types never fail.
    fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()>;

    /// The id of the encoding for the structures' type ids: [`CODEC_ID`](Self::CODEC_ID),
    /// unless the codec learns it from the type at run time (as `Serde`, with the `serde`
    /// feature, does from the type's serde data model). Structures call it when they open.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`](crate::Error::Encode) if the codec cannot store values of this type
    /// at all.
    fn codec_id() -> crate::error::Result<u64> {
        Ok(Self::CODEC_ID)
    }

    /// Decodes a value from exactly the bytes `encode` wrote; `None` if they are not one.
    fn decode(bytes: &[u8]) -> Option<Self>;

    /// `into` with the bytes [`encode`](Self::encode) writes added, where the type has them at
    /// hand without writing them out: a key's fingerprint, which `LoggedShards` (in
    /// `montage-collections`) routes by, without a copy. `None` (the default) where the bytes
    /// must be written first; the caller then encodes and adds them itself.
    ///
    /// Where it returns `Some`, it must equal `into.bytes(&encoded)` for the bytes `encode`
    /// appends; the impls of this crate (integers, byte strings, strings, `bool`, `()` and
    /// the integer pairs) give it, and so does `#[derive(Payload)]` for types of up to 256
    /// bytes.
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        let _ = into;
        None
    }

    /// The value as one word, for a type whose values fit one: a nonblocking index keeps
    /// such a key beside its value in its own table instead of in a node it must follow
    /// ([`VerifiedBucket`](crate::verified::VerifiedBucket)). `None` (the default) where the type has no such word.
    ///
    /// Where it returns `Some`, it must be injective and agree with equality (two values
    /// have the same word exactly when they are equal), and
    /// [`from_key_word`](Self::from_key_word) must return the value again.
    #[inline]
    fn key_word(&self) -> Option<u64> {
        None
    }

    /// The value whose [`key_word`](Self::key_word) is `word`; `None` if no value has it
    /// (and always, by default).
    #[inline]
    fn from_key_word(word: u64) -> Option<Self> {
        let _ = word;
        None
    }

    /// Decodes a value from its encoded bytes where a structure found them (in a block's
    /// payload, usually), as [`decode`](Self::decode) would from those bytes. Structures
    /// call it to decode straight from the heap.
    ///
    /// The default copies the bytes into a buffer on the stack (or, past 256 bytes, one
    /// allocation) and calls `decode`; byte strings copy them into their own allocation
    /// instead ([`Encoded::to_vec`]), so a value is copied out of the heap once.
    ///
    /// # Errors
    ///
    /// What reading the bytes returns (a heap error).
    fn decode_from(encoded: Encoded<'_>) -> crate::error::Result<Option<Self>> {
        let len = encoded.len();
        if len <= STACK_BUFFER {
            let mut buf = [0u8; STACK_BUFFER];
            let bytes = &mut buf[..len];
            encoded.read(bytes)?;
            Ok(Self::decode(bytes))
        } else {
            Ok(Self::decode(&encoded.to_vec()?))
        }
    }
}

/// The encoded bytes of one key or value, where a structure found them: a range of a
/// block's payload, or bytes in memory. [`Codec::decode_from`] copies them out once, into a
/// buffer of its own or, for byte strings, straight into the value ([`to_vec`]).
///
/// [`to_vec`]: Encoded::to_vec
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a>(Source<'a>);

#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    Payload {
        view: &'a BlockView<'a>,
        at: u64,
        len: usize,
    },
    Bytes(&'a [u8]),
}

impl<'a> Encoded<'a> {
    /// The `len` bytes of `view`'s payload from byte `at`.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`](crate::Error::OutOfBounds) if the range does not lie inside
    /// the payload.
    #[inline]
    pub fn in_payload(view: &'a BlockView<'a>, at: u64, len: usize) -> crate::error::Result<Self> {
        if at
            .checked_add(len as u64)
            .is_none_or(|end| end > u64::from(view.info().len))
        {
            return Err(crate::error::Error::OutOfBounds {
                offset: at,
                len: len as u64,
            });
        }
        Ok(Encoded(Source::Payload { view, at, len }))
    }

    /// Bytes already in memory.
    #[inline]
    pub fn from_bytes(bytes: &'a [u8]) -> Self {
        Encoded(Source::Bytes(bytes))
    }

    /// How many bytes there are.
    #[inline]
    pub fn len(&self) -> usize {
        match self.0 {
            Source::Payload { len, .. } => len,
            Source::Bytes(bytes) => bytes.len(),
        }
    }

    /// Whether there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `mid` bytes and the rest, each still where it was found: a codec of a
    /// fixed head and a byte string reads the head into a buffer of its own and the string
    /// straight into its allocation ([`to_vec`](Self::to_vec)), copying every byte once.
    /// `None` if there are fewer than `mid` bytes.
    #[inline]
    pub fn split_at(&self, mid: usize) -> Option<(Encoded<'a>, Encoded<'a>)> {
        match self.0 {
            Source::Payload { view, at, len } => {
                let rest = len.checked_sub(mid)?;
                let head = Source::Payload { view, at, len: mid };
                let tail = Source::Payload {
                    view,
                    at: at + mid as u64,
                    len: rest,
                };
                Some((Encoded(head), Encoded(tail)))
            }
            Source::Bytes(bytes) => {
                let (head, tail) = bytes.split_at_checked(mid)?;
                Some((Encoded(Source::Bytes(head)), Encoded(Source::Bytes(tail))))
            }
        }
    }

    /// Copies the bytes into `buf`, which must be exactly [`len`](Self::len) long.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfBounds`](crate::Error::OutOfBounds) if `buf` has another length; a
    /// heap error from reading the payload.
    #[inline]
    pub fn read(&self, buf: &mut [u8]) -> crate::error::Result<()> {
        if buf.len() != self.len() {
            return Err(crate::error::Error::OutOfBounds {
                offset: 0,
                len: buf.len() as u64,
            });
        }
        match self.0 {
            Source::Payload { view, at, .. } => view.read(at, buf),
            Source::Bytes(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// The bytes, copied once into a new vector (with nothing written to its memory first).
    ///
    /// # Errors
    ///
    /// A heap error from reading the payload.
    #[inline]
    pub fn to_vec(&self) -> crate::error::Result<Vec<u8>> {
        match self.0 {
            Source::Payload { view, at, len } => view.read_to_vec(at, len),
            Source::Bytes(bytes) => Ok(bytes.to_vec()),
        }
    }
}

/// A value a structure can store as the [`Codec`] type `C` without being a `C`: a borrowed
/// form whose encoding is exactly the one `C::encode` writes for the equal `C` (`[u8]` for
/// `Vec<u8>` and `Box<[u8]>`, `str` for `String`). Structures take one where they only copy
/// a value into the heap (`HashMap::put_ref`), so that the caller need not build an owned
/// `C` first. Every `Codec` type encodes as itself.
///
/// ```
/// use montage_core::payload::EncodeAs;
///
/// let mut owned = Vec::new();
/// let mut borrowed = Vec::new();
/// <Vec<u8> as EncodeAs<Vec<u8>>>::encode_as(&vec![1, 2, 3], &mut owned)?;
/// <[u8] as EncodeAs<Vec<u8>>>::encode_as(&[1, 2, 3][..], &mut borrowed)?;
/// assert_eq!(owned, borrowed);
/// # Ok::<(), montage_core::Error>(())
/// ```
pub trait EncodeAs<C: Codec> {
    /// Appends the encoding `C::encode` writes for the `C` equal to `self`.
    ///
    /// # Errors
    ///
    /// What `C::encode` returns for that `C`.
    fn encode_as(&self, out: &mut Vec<u8>) -> crate::error::Result<()>;
}

impl<C: Codec> EncodeAs<C> for C {
    #[inline]
    fn encode_as(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        self.encode(out)
    }
}

impl EncodeAs<Vec<u8>> for [u8] {
    #[inline]
    fn encode_as(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self);
        Ok(())
    }
}

impl EncodeAs<Box<[u8]>> for [u8] {
    #[inline]
    fn encode_as(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self);
        Ok(())
    }
}

impl EncodeAs<String> for str {
    #[inline]
    fn encode_as(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }
}

pub(crate) const fn id(name: &str) -> u64 {
    Fingerprint::new().str("codec").str(name).finish()
}

impl Codec for Vec<u8> {
    const CODEC_ID: u64 = id("bytes");
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self);
        Ok(())
    }
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        Some(into.bytes(self))
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
    #[inline]
    fn decode_from(encoded: Encoded<'_>) -> crate::error::Result<Option<Self>> {
        encoded.to_vec().map(Some)
    }
}

impl Codec for Box<[u8]> {
    const CODEC_ID: u64 = id("bytes");
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self);
        Ok(())
    }
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        Some(into.bytes(self))
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.into())
    }
    #[inline]
    fn decode_from(encoded: Encoded<'_>) -> crate::error::Result<Option<Self>> {
        encoded.to_vec().map(|bytes| Some(bytes.into_boxed_slice()))
    }
}

impl Codec for String {
    const CODEC_ID: u64 = id("utf-8");
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        Some(into.bytes(self.as_bytes()))
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
    #[inline]
    fn decode_from(encoded: Encoded<'_>) -> crate::error::Result<Option<Self>> {
        encoded.to_vec().map(|bytes| String::from_utf8(bytes).ok())
    }
}

impl<T: Codec + Ord + Clone> crate::verified::BucketKey for T {
    #[inline]
    fn key_word(&self) -> Option<u64> {
        Codec::key_word(self)
    }

    #[inline]
    fn from_key_word(word: u64) -> Option<Self> {
        <T as Codec>::from_key_word(word)
    }
}

/// Integers: their fixed little-endian bytes; those of up to 64 bits (given with their
/// unsigned twin) also their bits as a key word, the twin zero-extended, so that every value
/// has its own word.
macro_rules! integer_codecs {
    ($($t:ty $(=> $u:ty)?),*) => {$(
        impl Codec for $t {
            const CODEC_ID: u64 = id(stringify!($t));
            #[inline]
            fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
                out.extend_from_slice(&self.to_le_bytes());
                Ok(())
            }
            #[inline]
            fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
                Some(into.bytes(&self.to_le_bytes()))
            }
            fn decode(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
            }
            // Into an array of the integer's size: the default's buffer is 256 bytes, which
            // it zeroes first.
            #[inline]
            fn decode_from(encoded: Encoded<'_>) -> crate::error::Result<Option<Self>> {
                let mut bytes = [0u8; size_of::<$t>()];
                if encoded.len() != bytes.len() {
                    return Ok(None);
                }
                encoded.read(&mut bytes)?;
                Ok(Some(<$t>::from_le_bytes(bytes)))
            }
            $(
                #[inline]
                #[allow(clippy::cast_sign_loss)]
                fn key_word(&self) -> Option<u64> {
                    Some(u64::from(*self as $u))
                }
                #[inline]
                #[allow(clippy::cast_possible_wrap)]
                fn from_key_word(word: u64) -> Option<Self> {
                    <$u>::try_from(word).ok().map(|bits| bits as $t)
                }
            )?
        }
    )*};
}
integer_codecs!(
    u8 => u8, u16 => u16, u32 => u32, u64 => u64, u128,
    i8 => u8, i16 => u16, i32 => u32, i64 => u64, i128
);

/// A pair whose first part is an integer: its fixed little-endian bytes, then the second
/// part's encoding (so a key or an operation can be `(u64, String)`, `(i32, Vec<u8>)`, ...).
macro_rules! pair_codecs {
    ($($a:ty),*) => {$(
        impl<B: Codec> Codec for ($a, B) {
            const CODEC_ID: u64 = Fingerprint::new()
                .str("pair")
                .u64(<$a as Codec>::CODEC_ID)
                .u64(B::CODEC_ID)
                .finish();

            fn codec_id() -> crate::error::Result<u64> {
                Ok(Fingerprint::new()
                    .str("pair")
                    .u64(<$a as Codec>::codec_id()?)
                    .u64(B::codec_id()?)
                    .finish())
            }

            #[inline]
            fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
                self.0.encode(out)?;
                self.1.encode(out)
            }

            #[inline]
            fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
                self.1.fingerprint_encoding(self.0.fingerprint_encoding(into)?)
            }

            fn decode(bytes: &[u8]) -> Option<Self> {
                let (a, b) = bytes.split_at_checked(size_of::<$a>())?;
                Some((<$a>::decode(a)?, B::decode(b)?))
            }
        }
    )*};
}
pair_codecs!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

impl Codec for bool {
    const CODEC_ID: u64 = id("bool");
    #[inline]
    fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
        out.push(u8::from(*self));
        Ok(())
    }
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        Some(into.bytes(&[u8::from(*self)]))
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }
}

impl Codec for () {
    const CODEC_ID: u64 = id("unit");
    #[inline]
    fn encode(&self, _out: &mut Vec<u8>) -> crate::error::Result<()> {
        Ok(())
    }
    #[inline]
    fn fingerprint_encoding(&self, into: Fingerprint) -> Option<Fingerprint> {
        Some(into)
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        bytes.is_empty().then_some(())
    }
}

/// The `Codec` of a payload type (what the derive's `impl Codec` calls).
#[doc(hidden)]
pub fn encode_payload<T: crate::payload::PayloadField>(value: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + size_of::<T>(), 0);
    value.write_field(&mut out[start..]);
}

/// [`Codec::fingerprint_encoding`] of a payload type (what the derive's `impl Codec`
/// calls): its bytes as [`encode_payload`] writes them, into a buffer on the stack; `None`
/// for a type longer than the buffer.
#[doc(hidden)]
#[inline]
pub fn fingerprint_payload<T: crate::payload::PayloadField>(
    value: &T,
    into: Fingerprint,
) -> Option<Fingerprint> {
    let len = size_of::<T>();
    if len > STACK_BUFFER {
        return None;
    }
    // Zeroed first, as `encode_payload`'s bytes are, so that padding reads the same.
    let mut bytes = [0u8; STACK_BUFFER];
    value.write_field(&mut bytes[..len]);
    Some(into.bytes(&bytes[..len]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Codec + PartialEq + std::fmt::Debug + Clone>(value: T) {
        let mut bytes = Vec::new();
        value.encode(&mut bytes).unwrap();
        fingerprints_its_encoding(&value, &bytes);
        assert_eq!(T::decode(&bytes), Some(value.clone()));
        let decoded = T::decode_from(Encoded::from_bytes(&bytes));
        assert_eq!(decoded.unwrap(), Some(value));
    }

    /// A fixed-size value longer than the default `decode_from`'s stack buffer.
    #[derive(Debug, Clone, PartialEq)]
    struct Long([u8; 300]);

    impl Codec for Long {
        const CODEC_ID: u64 = id("long");
        #[inline]
        fn encode(&self, out: &mut Vec<u8>) -> crate::error::Result<()> {
            out.extend_from_slice(&self.0);
            Ok(())
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            Some(Long(bytes.try_into().ok()?))
        }
    }

    /// The encoding of `borrowed` as `C` and of the owned `C` equal to it.
    fn both<C: Codec, Q: EncodeAs<C> + ?Sized>(owned: &C, borrowed: &Q) -> (Vec<u8>, Vec<u8>) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        owned.encode(&mut a).unwrap();
        borrowed.encode_as(&mut b).unwrap();
        (a, b)
    }

    /// `key_word` of every value in `values`, checked to round-trip and to be distinct
    /// for distinct values.
    fn key_words<T: Codec + PartialEq + std::fmt::Debug + Copy>(values: &[T]) {
        let mut seen = std::collections::HashMap::new();
        for &v in values {
            let word = v
                .key_word()
                .expect("an integer of up to 64 bits has a key word");
            assert_eq!(T::from_key_word(word), Some(v), "{v:?}");
            if let Some(other) = seen.insert(word, v) {
                assert_eq!(other, v, "two values with the word {word:#x}");
            }
        }
    }

    /// Checks that `value`'s `fingerprint_encoding`, where it has one, is that of `encoded`,
    /// after a prefix (as a pair's second part is fingerprinted after its first).
    fn fingerprints_its_encoding<T: Codec>(value: &T, encoded: &[u8]) {
        let seed = Fingerprint::new().str("before");
        if let Some(direct) = value.fingerprint_encoding(seed) {
            assert_eq!(direct.finish(), seed.bytes(encoded).finish());
        }
    }

    /// Whether `value` gives the fingerprint of its encoding without writing it out (checked
    /// against the encoding, if so).
    fn has_direct_fingerprint<T: Codec>(value: &T) -> bool {
        let mut bytes = Vec::new();
        value.encode(&mut bytes).unwrap();
        fingerprints_its_encoding(value, &bytes);
        value.fingerprint_encoding(Fingerprint::new()).is_some()
    }

    proptest::proptest! {
        #[test]
        fn direct_fingerprints_are_those_of_the_encoding(
            word in proptest::prelude::any::<u64>(),
            wide in proptest::prelude::any::<i128>(),
            small in proptest::prelude::any::<i16>(),
            flag in proptest::prelude::any::<bool>(),
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            text in ".{0,12}",
        ) {
            proptest::prop_assert!(has_direct_fingerprint(&word));
            proptest::prop_assert!(has_direct_fingerprint(&wide));
            proptest::prop_assert!(has_direct_fingerprint(&small));
            proptest::prop_assert!(has_direct_fingerprint(&flag));
            proptest::prop_assert!(has_direct_fingerprint(&bytes));
            proptest::prop_assert!(has_direct_fingerprint(&bytes.clone().into_boxed_slice()));
            proptest::prop_assert!(has_direct_fingerprint(&text));
            proptest::prop_assert!(has_direct_fingerprint(&(word, text.clone())));
            proptest::prop_assert!(has_direct_fingerprint(&(small, (word, bytes.clone()))));
            proptest::prop_assert!(has_direct_fingerprint(&(wide, ())));
        }
    }

    #[test]
    fn a_codec_without_its_bytes_at_hand_has_no_direct_fingerprint() {
        assert!(!has_direct_fingerprint(&Long([1; 300])));
        assert!(!has_direct_fingerprint(&(1u8, Long([2; 300]))));
    }

    #[test]
    fn integers_have_distinct_key_words_that_round_trip() {
        key_words(&[0u8, 1, 127, 128, 255]);
        key_words(&[i8::MIN, -1, 0, 1, i8::MAX]);
        key_words(&[i16::MIN, -1, 0, 1, i16::MAX]);
        key_words(&[i32::MIN, -1, 0, 1, i32::MAX]);
        key_words(&[i64::MIN, -1, 0, 1, i64::MAX]);
        key_words(&[0u64, 1, u64::MAX - 1, u64::MAX]);
        // A word of a wider type is no value of a narrower one.
        assert_eq!(i8::from_key_word(0x1ff), None);
        assert_eq!(u32::from_key_word(1 << 40), None);
        // Types without a word.
        assert_eq!(1u128.key_word(), None);
        assert_eq!(String::from("k").key_word(), None);
        assert_eq!(Vec::<u8>::from_key_word(0), None);
    }

    #[test]
    fn borrowed_forms_encode_as_their_owned_types() {
        let (a, b) = both(&vec![1u8, 2, 250], &[1u8, 2, 250][..]);
        assert_eq!(a, b);
        let (a, b) = both(&vec![1u8, 2, 250].into_boxed_slice(), &[1u8, 2, 250][..]);
        assert_eq!(a, b);
        let (a, b) = both(&"gr\u{fc}\u{df}e".to_owned(), "gr\u{fc}\u{df}e");
        assert_eq!(a, b);
        let (a, b) = both(&77u64, &77u64);
        assert_eq!(a, b);
    }

    #[test]
    fn decode_from_reads_a_payload_range_once_and_checks_its_bounds() {
        use crate::alloc::block::BlockSpec;
        use crate::base::epoch::Epoch;
        use crate::config::HeapConfig;
        use crate::heap::Heap;

        round_trip(Long([9; 300]));
        round_trip(vec![3u8; 1000]);
        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        // A prefix of 4 bytes, then 300 bytes of value (past the default's stack buffer
        // and the vector copy's threshold), then a byte that is no UTF-8.
        let mut payload = vec![0u8; 4];
        payload.extend_from_slice(&[7u8; 300]);
        payload.push(0xff);
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::FIRST, 1), &payload)
            .unwrap();
        let view = heap.view(block).unwrap();
        let value = Encoded::in_payload(&view, 4, 300).unwrap();
        assert_eq!(value.len(), 300);
        assert_eq!(Vec::<u8>::decode_from(value).unwrap(), Some(vec![7u8; 300]));
        assert_eq!(Long::decode_from(value).unwrap(), Some(Long([7; 300])));
        assert_eq!(
            String::decode_from(Encoded::in_payload(&view, 304, 1).unwrap()).unwrap(),
            None,
            "bytes that are no UTF-8 are no String"
        );
        assert_eq!(
            u64::decode_from(Encoded::in_payload(&view, 0, 3).unwrap()).unwrap(),
            None
        );
        // Integers read exactly their own size, at any offset, as `decode` would.
        assert_eq!(
            u32::decode_from(Encoded::in_payload(&view, 3, 4).unwrap()).unwrap(),
            u32::decode(&payload[3..7])
        );
        assert_eq!(
            i16::decode_from(Encoded::in_payload(&view, 303, 2).unwrap()).unwrap(),
            Some(i16::from_le_bytes([7, 0xff]))
        );
        assert_eq!(
            u128::decode_from(Encoded::in_payload(&view, 4, 16).unwrap()).unwrap(),
            Some(u128::from_le_bytes([7; 16]))
        );
        assert!(matches!(
            Encoded::in_payload(&view, 4, 302),
            Err(crate::error::Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            value.read(&mut [0u8; 299]),
            Err(crate::error::Error::OutOfBounds { .. })
        ));
        // Split, each part reads its own range of the payload, as of bytes in memory.
        let whole = Encoded::in_payload(&view, 0, payload.len()).unwrap();
        for source in [whole, Encoded::from_bytes(&payload)] {
            let (prefix, rest) = source.split_at(4).unwrap();
            assert_eq!((prefix.len(), rest.len()), (4, 301));
            let mut first = [1u8; 4];
            prefix.read(&mut first).unwrap();
            assert_eq!(first, [0; 4]);
            assert_eq!(rest.to_vec().unwrap(), payload[4..]);
            let (all, none) = source.split_at(payload.len()).unwrap();
            assert_eq!((all.to_vec().unwrap(), none.len()), (payload.clone(), 0));
            assert!(source.split_at(payload.len() + 1).is_none());
        }
    }

    /// `read_u32_first` (one word load where the payload and trailer cover a word) gives
    /// what a read of the first four bytes gives, at every short length and a long one.
    #[test]
    fn a_payloads_first_four_bytes_read_as_one_word_match_a_read_of_them() {
        use crate::alloc::block::BlockSpec;
        use crate::base::epoch::Epoch;
        use crate::config::HeapConfig;
        use crate::heap::Heap;

        let heap = Heap::create(&HeapConfig::in_memory(1 << 20)).unwrap();
        for len in (0..=12).chain([300]) {
            let payload: Vec<u8> = (0..len).map(|i: usize| (i * 37 + 11) as u8).collect();
            let block = heap
                .raw()
                .alloc_bytes(BlockSpec::new(Epoch::FIRST, 1), &payload)
                .unwrap();
            let view = heap.view(block).unwrap();
            let mut first = [0u8; 4];
            let read = view.read(0, &mut first);
            assert_eq!(read.is_ok(), len >= 4, "{len} bytes");
            if read.is_ok() {
                assert_eq!(
                    view.read_u32_first().unwrap(),
                    u32::from_le_bytes(first),
                    "{len} bytes"
                );
            } else {
                assert!(
                    matches!(
                        view.read_u32_first(),
                        Err(crate::error::Error::OutOfBounds { .. })
                    ),
                    "{len} bytes"
                );
            }
        }
    }

    #[test]
    fn codecs_round_trip_and_reject_other_lengths() {
        round_trip(b"key".to_vec());
        round_trip(Box::<[u8]>::from(&b""[..]));
        round_trip("caf\u{e9}".to_owned());
        round_trip(u64::MAX);
        round_trip(-5i32);
        round_trip(true);
        round_trip(());
        assert_eq!(u64::decode(&[1, 2, 3]), None);
        assert_eq!(bool::decode(&[2]), None);
        assert_eq!(String::decode(&[0xff]), None);
        assert_ne!(<u64 as Codec>::CODEC_ID, <i64 as Codec>::CODEC_ID);
        assert_eq!(<Vec<u8> as Codec>::CODEC_ID, <Box<[u8]> as Codec>::CODEC_ID);
    }

    #[test]
    fn pairs_encode_their_integer_then_the_rest() {
        round_trip((7u64, "seven".to_owned()));
        round_trip((-1i32, (2u8, b"nested".to_vec())));
        round_trip((0u16, ()));
        let mut bytes = Vec::new();
        (1u32, 2u64).encode(&mut bytes).unwrap();
        assert_eq!(bytes, [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(<(u32, u64)>::decode(&bytes[..11]), None);
        assert_eq!(<(u32, ())>::decode(&[1, 0, 0]), None);
        assert_ne!(
            <(u64, i64) as Codec>::codec_id().unwrap(),
            <(i64, u64) as Codec>::codec_id().unwrap()
        );
        assert_eq!(
            <(u64, i64) as Codec>::codec_id().unwrap(),
            <(u64, i64) as Codec>::CODEC_ID
        );
    }
}
