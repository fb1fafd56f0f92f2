//! Postcard's encoding, written by a serializer of this crate that copies a sequence of bytes
//! whole. Postcard's own serializer writes a `Vec<u8>` through serde's sequence interface,
//! one `serialize_u8` call per byte: a snapshot of a `BTreeMap<u64, Vec<u8>>` with 256-byte
//! values spent nine instructions a byte there, and a `Logged` structure's writers wait for
//! the whole snapshot. This one writes the same bytes (postcard's wire format, version 1,
//! checked against postcard itself by the tests below) and copies a slice of bytes
//! (`Vec<u8>`, `[u8]`, `Box<[u8]>`) with one `memcpy`: about eight times faster on such a map.
//! Reading is left to postcard.

use std::fmt::{self, Display, Write as _};

use serde::ser::{self, Serialize};

/// Appends the postcard encoding of `value` to `out`; on an error, `out` may hold a part of
/// it (the caller truncates).
pub(crate) fn write<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), Refused> {
    value.serialize(&mut Writer { out })
}

/// Why a value has no encoding: a length the sequence or map does not know in advance
/// (postcard writes it first), or the value's own `Serialize` refused (a `PathBuf` that is
/// no UTF-8).
#[derive(Debug)]
pub(crate) struct Refused(String);

impl Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl ser::Error for Refused {
    fn custom<T: Display>(msg: T) -> Self {
        Refused(msg.to_string())
    }
}

/// A sequence's or map's length, which postcard writes before the elements.
fn known_len(len: Option<usize>) -> Result<usize, Refused> {
    len.ok_or_else(|| {
        Refused("a sequence or map whose length is not known before its elements".to_owned())
    })
}

/// The serializer: everything goes to the end of `out`.
struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

/// An unsigned integer as postcard's varint: seven bits a byte, lowest first, the high bit
/// set on every byte but the last.
macro_rules! push_varint {
    ($out:expr, $value:expr) => {{
        let mut value = $value;
        while value >= 0x80 {
            $out.push((value as u8) | 0x80);
            value >>= 7;
        }
        $out.push(value as u8);
    }};
}

impl Writer<'_> {
    #[inline]
    fn varint(&mut self, value: u128) {
        push_varint!(self.out, value);
    }

    /// [`varint`](Self::varint) for the integers up to 64 bits, without 128-bit arithmetic.
    #[inline]
    fn varint64(&mut self, value: u64) {
        push_varint!(self.out, value);
    }

    #[inline]
    fn len(&mut self, len: usize) {
        self.varint64(len as u64);
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        self.len(bytes.len());
        self.out.extend_from_slice(bytes);
    }
}

/// A signed integer as postcard stores it: zigzag (0, -1, 1, -2, ... as 0, 1, 2, 3, ...),
/// then as a varint.
macro_rules! zigzag {
    ($value:expr, $bits:expr) => {
        (($value << 1) ^ ($value >> ($bits - 1))).cast_unsigned()
    };
}

type Done = Result<(), Refused>;

impl ser::Serializer for &mut Writer<'_> {
    type Ok = ();
    type Error = Refused;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn is_human_readable(&self) -> bool {
        false
    }

    #[inline]
    fn serialize_bool(self, v: bool) -> Done {
        self.out.push(u8::from(v));
        Ok(())
    }

    #[inline]
    fn serialize_i8(self, v: i8) -> Done {
        self.out.push(v.cast_unsigned());
        Ok(())
    }

    #[inline]
    fn serialize_i16(self, v: i16) -> Done {
        self.varint64(zigzag!(v, 16).into());
        Ok(())
    }

    #[inline]
    fn serialize_i32(self, v: i32) -> Done {
        self.varint64(zigzag!(v, 32).into());
        Ok(())
    }

    #[inline]
    fn serialize_i64(self, v: i64) -> Done {
        self.varint64(zigzag!(v, 64));
        Ok(())
    }

    #[inline]
    fn serialize_i128(self, v: i128) -> Done {
        self.varint(zigzag!(v, 128));
        Ok(())
    }

    #[inline]
    fn serialize_u8(self, v: u8) -> Done {
        self.out.push(v);
        Ok(())
    }

    #[inline]
    fn serialize_u16(self, v: u16) -> Done {
        self.varint64(v.into());
        Ok(())
    }

    #[inline]
    fn serialize_u32(self, v: u32) -> Done {
        self.varint64(v.into());
        Ok(())
    }

    #[inline]
    fn serialize_u64(self, v: u64) -> Done {
        self.varint64(v);
        Ok(())
    }

    #[inline]
    fn serialize_u128(self, v: u128) -> Done {
        self.varint(v);
        Ok(())
    }

    #[inline]
    fn serialize_f32(self, v: f32) -> Done {
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    #[inline]
    fn serialize_f64(self, v: f64) -> Done {
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }

    #[inline]
    fn serialize_char(self, v: char) -> Done {
        self.bytes(v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }

    #[inline]
    fn serialize_str(self, v: &str) -> Done {
        self.bytes(v.as_bytes());
        Ok(())
    }

    #[inline]
    fn serialize_bytes(self, v: &[u8]) -> Done {
        self.bytes(v);
        Ok(())
    }

    #[inline]
    fn serialize_none(self) -> Done {
        self.out.push(0);
        Ok(())
    }

    #[inline]
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Done {
        self.out.push(1);
        value.serialize(self)
    }

    #[inline]
    fn serialize_unit(self) -> Done {
        Ok(())
    }

    #[inline]
    fn serialize_unit_struct(self, _name: &'static str) -> Done {
        Ok(())
    }

    #[inline]
    fn serialize_unit_variant(self, _name: &'static str, index: u32, _: &'static str) -> Done {
        self.varint64(index.into());
        Ok(())
    }

    #[inline]
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Done {
        value.serialize(self)
    }

    #[inline]
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Done {
        self.varint64(index.into());
        value.serialize(self)
    }

    #[inline]
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, Refused> {
        self.len(known_len(len)?);
        Ok(self)
    }

    #[inline]
    fn serialize_tuple(self, _len: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    #[inline]
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    #[inline]
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Refused> {
        self.varint64(index.into());
        Ok(self)
    }

    #[inline]
    fn serialize_map(self, len: Option<usize>) -> Result<Self, Refused> {
        self.len(known_len(len)?);
        Ok(self)
    }

    #[inline]
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self, Refused> {
        Ok(self)
    }

    #[inline]
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Refused> {
        self.varint64(index.into());
        Ok(self)
    }

    /// The length, then the elements; a slice of bytes in one copy.
    #[inline]
    fn collect_seq<I>(self, iter: I) -> Done
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        let iter = iter.into_iter();
        if let Some(bytes) = as_bytes(&iter) {
            self.bytes(bytes);
            return Ok(());
        }
        // As serde's own `collect_seq`: a length only if the iterator is sure of it.
        let len = match iter.size_hint() {
            (low, Some(high)) if low == high => Some(low),
            _ => None,
        };
        self.len(known_len(len)?);
        for item in iter {
            item.serialize(&mut *self)?;
        }
        Ok(())
    }

    /// The text's length, then the text; formatted once, into a `String`.
    fn collect_str<T: ?Sized + Display>(self, value: &T) -> Done {
        let mut text = String::new();
        write!(text, "{value}").map_err(|_| Refused("a Display that failed".to_owned()))?;
        self.bytes(text.as_bytes());
        Ok(())
    }
}

/// The bytes still ahead of `iter` if it is a slice's iterator of bytes (what
/// `Serialize for [u8]` and `Vec<u8>` pass to `collect_seq`), else `None`.
#[inline]
fn as_bytes<'i, I: Iterator>(iter: &'i I) -> Option<&'i [u8]> {
    // `typeid::of` is `TypeId::of` with every lifetime erased: it is equal for `I` and for
    // `slice::Iter<'static, u8>` exactly when `I` is `slice::Iter<'s, u8>` for some `'s`.
    if typeid::of::<I>() != typeid::of::<std::slice::Iter<'static, u8>>() {
        return None;
    }
    // SAFETY: `I` is `slice::Iter<'s, u8>` (above), so the pointer cast reinterprets a
    // value as its own type, up to the lifetime. The result borrows `iter` for `'i`, within
    // `'s` (`I` is well-formed only while `'s` lasts, and `iter` is an `I`), so the bytes
    // are not used longer than `iter` could use them itself.
    let iter = unsafe { &*std::ptr::from_ref(iter).cast::<std::slice::Iter<'i, u8>>() };
    Some(iter.as_slice())
}

/// The elements of a compound value follow one another with nothing between or after them.
macro_rules! compound {
    ($trait:ident, $element:ident $(, $name:ty)?) => {
        impl ser::$trait for &mut Writer<'_> {
            type Ok = ();
            type Error = Refused;

            #[inline]
            fn $element<T: ?Sized + Serialize>(
                &mut self,
                $(_name: $name,)?
                value: &T,
            ) -> Done {
                value.serialize(&mut **self)
            }

            #[inline]
            fn end(self) -> Done {
                Ok(())
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);
compound!(SerializeStruct, serialize_field, &'static str);
compound!(SerializeStructVariant, serialize_field, &'static str);

impl ser::SerializeMap for &mut Writer<'_> {
    type Ok = ();
    type Error = Refused;

    #[inline]
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Done {
        key.serialize(&mut **self)
    }

    #[inline]
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Done {
        value.serialize(&mut **self)
    }

    #[inline]
    fn end(self) -> Done {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};
    use std::path::PathBuf;

    use proptest::prelude::*;
    use serde::Serialize;

    use super::*;

    /// Every shape of enum variant serde has.
    #[derive(Serialize, Debug, Clone)]
    enum Shape {
        Unit,
        Newtype(i64),
        Tuple(i8, u16),
        Struct { wide: i128, wider: u128 },
    }

    /// Bytes the value's `Serialize` hands over as one string (as `serde_bytes` does).
    #[derive(Debug, Clone)]
    struct Blob(Vec<u8>);

    impl Serialize for Blob {
        fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(&self.0)
        }
    }

    /// Every kind of value serde's data model has, byte strings in each form.
    #[derive(Serialize, Debug, Clone)]
    struct Everything {
        flag: bool,
        signed: (i8, i16, i32, i64, i128),
        unsigned: (u8, u16, u32, u64, u128),
        floats: (f32, f64),
        letter: char,
        text: String,
        bytes: Vec<u8>,
        boxed: Box<[u8]>,
        array: [u8; 5],
        deque: VecDeque<u8>,
        blob: Blob,
        signed_bytes: Vec<i8>,
        maybe: Option<Vec<u8>>,
        shapes: Vec<Shape>,
        map: BTreeMap<String, Vec<u8>>,
        nested: Vec<Vec<u8>>,
        unit: (),
        size: usize,
    }

    fn shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            Just(Shape::Unit),
            any::<i64>().prop_map(Shape::Newtype),
            any::<(i8, u16)>().prop_map(|(a, b)| Shape::Tuple(a, b)),
            any::<(i128, u128)>().prop_map(|(wide, wider)| Shape::Struct { wide, wider }),
        ]
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        // Lengths on both sides of a varint's one- and two-byte forms.
        prop::collection::vec(any::<u8>(), 0..300)
    }

    fn everything() -> impl Strategy<Value = Everything> {
        (
            (any::<bool>(), any::<(i8, i16, i32, i64, i128)>()),
            (any::<(u8, u16, u32, u64, u128)>(), any::<(f32, f64)>()),
            (
                any::<char>(),
                any::<String>(),
                bytes(),
                bytes(),
                any::<[u8; 5]>(),
            ),
            (bytes(), bytes(), prop::collection::vec(any::<i8>(), 0..40)),
            (
                prop::option::of(bytes()),
                prop::collection::vec(shape(), 0..6),
            ),
            prop::collection::btree_map(any::<String>(), bytes(), 0..4),
            (prop::collection::vec(bytes(), 0..4), any::<usize>()),
        )
            .prop_map(|(a, b, c, d, e, map, (nested, size))| Everything {
                flag: a.0,
                signed: a.1,
                unsigned: b.0,
                floats: b.1,
                letter: c.0,
                text: c.1,
                bytes: c.2,
                boxed: c.3.into(),
                array: c.4,
                deque: d.0.into(),
                blob: Blob(d.1),
                signed_bytes: d.2,
                maybe: e.0,
                shapes: e.1,
                map,
                nested,
                unit: (),
                size,
            })
    }

    fn ours<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Refused> {
        let mut out = Vec::new();
        write(value, &mut out).map(|()| out)
    }

    proptest! {
        #[test]
        fn it_writes_exactly_the_bytes_postcard_writes(value in everything()) {
            prop_assert_eq!(ours(&value).unwrap(), postcard::to_allocvec(&value).unwrap());
        }
    }

    #[test]
    fn integers_at_the_edges_of_their_range_and_of_a_varint_byte_match_postcard() {
        let edges = [
            0u128,
            1,
            0x7F,
            0x80,
            0x3FFF,
            0x4000,
            u64::MAX.into(),
            u128::MAX,
        ];
        for edge in edges {
            for value in [edge, edge.wrapping_sub(1)] {
                let unsigned = (value as u8, value as u16, value as u32, value as u64, value);
                let signed = unsigned_to_signed(unsigned);
                let expected = postcard::to_allocvec(&unsigned).unwrap();
                assert_eq!(ours(&unsigned).unwrap(), expected, "{value:#x}");
                let expected = postcard::to_allocvec(&signed).unwrap();
                assert_eq!(ours(&signed).unwrap(), expected, "{value:#x} as signed");
            }
        }
    }

    fn unsigned_to_signed(u: (u8, u16, u32, u64, u128)) -> (i8, i16, i32, i64, i128) {
        (
            u.0.cast_signed(),
            u.1.cast_signed(),
            u.2.cast_signed(),
            u.3.cast_signed(),
            u.4.cast_signed(),
        )
    }

    #[test]
    fn only_a_slices_iterator_of_bytes_is_copied_whole() {
        let bytes = [1u8, 2, 3];
        let mut iter = bytes.iter();
        iter.next();
        assert_eq!(as_bytes(&iter), Some(&bytes[1..]));
        assert_eq!(as_bytes(&[1i8, 2].iter()), None);
        assert_eq!(as_bytes(&vec![1u8].into_iter()), None);
        assert_eq!(as_bytes(&[[1u8]].iter()), None);
    }

    /// A sequence that does not say its length first.
    struct Unsized;

    impl Serialize for Unsized {
        fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_seq([1u8, 2, 3].iter().filter(|&&b| b > 1))
        }
    }

    #[test]
    fn what_postcard_refuses_is_refused_with_a_reason() {
        assert!(postcard::to_allocvec(&Unsized).is_err());
        assert!(
            ours(&Unsized)
                .unwrap_err()
                .to_string()
                .contains("length is not known")
        );
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(&[0x66, 0xFF]));
            assert!(postcard::to_allocvec(&path).is_err());
            assert!(ours(&path).unwrap_err().to_string().contains("UTF-8"));
        }
    }
}
