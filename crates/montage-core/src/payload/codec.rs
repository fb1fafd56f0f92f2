//! [`Codec`]: how a ready structure stores a key or value of a user's type inside one of
//! its own payloads, beside other data (a hash-map entry holds a key and a value). Byte
//! strings have variable length; integers, and every `#[derive(Payload)]` type (the derive
//! implements `Codec` too), have a fixed one.

/// A key or value that a structure can store in its payloads.
///
/// `CODEC_ID` names the encoding: structures mix it into the type ids of their payloads, so
/// that opening a structure with other key or value types than it was written with is an
/// error rather than a misreading.
pub trait Codec: Sized + Send + Sync + 'static {
    /// Names the encoding (for a payload type, its type id).
    const CODEC_ID: u64;

    /// Appends the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);

    /// Decodes a value from exactly the bytes `encode` wrote; `None` if they are not one.
    fn decode(bytes: &[u8]) -> Option<Self>;

    /// Decodes a value of `len` encoded bytes that `read` copies into the buffer it is
    /// given (of exactly `len` bytes), as [`decode`](Self::decode) would from those bytes.
    /// Structures call it to decode straight from the heap.
    ///
    /// The default reads into a buffer on the stack (or, past 256 bytes, one allocation)
    /// and calls `decode`; byte strings read into their own allocation instead, so a value
    /// is copied out of the heap once.
    ///
    /// # Errors
    ///
    /// Whatever `read` returns.
    fn decode_from(
        len: usize,
        read: impl FnOnce(&mut [u8]) -> crate::error::Result<()>,
    ) -> crate::error::Result<Option<Self>> {
        const STACK: usize = 256;
        if len <= STACK {
            let mut buf = [0u8; STACK];
            let bytes = &mut buf[..len];
            read(bytes)?;
            Ok(Self::decode(bytes))
        } else {
            let mut buf = vec![0u8; len];
            read(&mut buf)?;
            Ok(Self::decode(&buf))
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
/// <Vec<u8> as EncodeAs<Vec<u8>>>::encode_as(&vec![1, 2, 3], &mut owned);
/// <[u8] as EncodeAs<Vec<u8>>>::encode_as(&[1, 2, 3][..], &mut borrowed);
/// assert_eq!(owned, borrowed);
/// ```
pub trait EncodeAs<C: Codec> {
    /// Appends the encoding `C::encode` writes for the `C` equal to `self`.
    fn encode_as(&self, out: &mut Vec<u8>);
}

impl<C: Codec> EncodeAs<C> for C {
    fn encode_as(&self, out: &mut Vec<u8>) {
        self.encode(out);
    }
}

impl EncodeAs<Vec<u8>> for [u8] {
    fn encode_as(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl EncodeAs<Box<[u8]>> for [u8] {
    fn encode_as(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl EncodeAs<String> for str {
    fn encode_as(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

/// A byte string of `len` bytes read by `read` into its own allocation.
fn read_bytes(
    len: usize,
    read: impl FnOnce(&mut [u8]) -> crate::error::Result<()>,
) -> crate::error::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    read(&mut buf)?;
    Ok(buf)
}

const fn id(name: &str) -> u64 {
    crate::fingerprint::Fingerprint::new()
        .str("codec")
        .str(name)
        .finish()
}

impl Codec for Vec<u8> {
    const CODEC_ID: u64 = id("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
    fn decode_from(
        len: usize,
        read: impl FnOnce(&mut [u8]) -> crate::error::Result<()>,
    ) -> crate::error::Result<Option<Self>> {
        read_bytes(len, read).map(Some)
    }
}

impl Codec for Box<[u8]> {
    const CODEC_ID: u64 = id("bytes");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.into())
    }
    fn decode_from(
        len: usize,
        read: impl FnOnce(&mut [u8]) -> crate::error::Result<()>,
    ) -> crate::error::Result<Option<Self>> {
        read_bytes(len, read).map(|bytes| Some(bytes.into_boxed_slice()))
    }
}

impl Codec for String {
    const CODEC_ID: u64 = id("utf-8");
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
    fn decode_from(
        len: usize,
        read: impl FnOnce(&mut [u8]) -> crate::error::Result<()>,
    ) -> crate::error::Result<Option<Self>> {
        read_bytes(len, read).map(|bytes| String::from_utf8(bytes).ok())
    }
}

macro_rules! integer_codecs {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            const CODEC_ID: u64 = id(stringify!($t));
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
            }
        }
    )*};
}
integer_codecs!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

impl Codec for bool {
    const CODEC_ID: u64 = id("bool");
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
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
    fn encode(&self, _out: &mut Vec<u8>) {}
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

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Codec + PartialEq + std::fmt::Debug + Clone>(value: T) {
        let mut bytes = Vec::new();
        value.encode(&mut bytes);
        assert_eq!(T::decode(&bytes), Some(value.clone()));
        let decoded = T::decode_from(bytes.len(), |buf| {
            buf.copy_from_slice(&bytes);
            Ok(())
        });
        assert_eq!(decoded.unwrap(), Some(value));
    }

    /// A fixed-size value longer than the default `decode_from`'s stack buffer.
    #[derive(Debug, Clone, PartialEq)]
    struct Long([u8; 300]);

    impl Codec for Long {
        const CODEC_ID: u64 = id("long");
        fn encode(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0);
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            Some(Long(bytes.try_into().ok()?))
        }
    }

    /// The encoding of `borrowed` as `C` and of the owned `C` equal to it.
    fn both<C: Codec, Q: EncodeAs<C> + ?Sized>(owned: &C, borrowed: &Q) -> (Vec<u8>, Vec<u8>) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        owned.encode(&mut a);
        borrowed.encode_as(&mut b);
        (a, b)
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
    fn decode_from_reads_once_and_passes_errors_on() {
        round_trip(Long([9; 300]));
        round_trip(vec![3u8; 1000]);
        assert_eq!(
            String::decode_from(1, |buf| {
                buf[0] = 0xff;
                Ok(())
            })
            .unwrap(),
            None
        );
        assert_eq!(u64::decode_from(3, |_| Ok(())).unwrap(), None);
        let failed = Long::decode_from(300, |_| Err(crate::error::Error::Poisoned));
        assert!(matches!(failed, Err(crate::error::Error::Poisoned)));
        let failed = Vec::<u8>::decode_from(8, |_| Err(crate::error::Error::Poisoned));
        assert!(matches!(failed, Err(crate::error::Error::Poisoned)));
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
}
