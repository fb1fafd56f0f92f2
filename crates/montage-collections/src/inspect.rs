//! Reading the collections' payloads without their Rust types, for tools (the `montage`
//! command-line tool's `dump` and `check`): which structure kind and which codecs a payload
//! type id stands for, and the decoded fields of a payload.
//!
//! Only the codecs of plain types are recognised: byte strings (`Vec<u8>`, `Box<[u8]>`),
//! `String`, the integers, `bool` and `()`. A structure of other keys or values (a
//! `Serde<T>`, a codec of the user's own) has a type id [`format_of`] does not know.
//!
//! ```
//! use montage_collections::inspect::{self, Value};
//! use montage_core::{Heap, HeapConfig, ScanFilter};
//!
//! let heap = Heap::create(&HeapConfig::in_memory(1 << 20))?;
//! let map = montage_collections::HashMap::<String, u64>::open(&heap, "hits")?;
//! map.insert("home".to_owned(), 3)?;
//! let owner = heap.lookup("hits").unwrap();
//! let block = heap.collect(ScanFilter::all().owner(owner).live())?[0];
//! let format = inspect::format_of(block.spec.type_id).unwrap();
//! assert_eq!(format.kind, "hash-map");
//! let fields = format.decode(&heap.read_payload(block.block)?).unwrap();
//! assert_eq!(fields, [("key", Value::Str("home".into())), ("value", Value::Unsigned(3))]);
//! # Ok::<(), montage_core::Error>(())
//! ```

use montage_core::Codec;

use crate::structure::type_id_of;

/// The codec of a plain type, as payloads name it by its codec id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Plain {
    /// `Vec<u8>` or `Box<[u8]>`: the bytes as they are.
    Bytes,
    /// `String`: UTF-8.
    Utf8,
    /// `u8`, little-endian.
    U8,
    /// `u16`, little-endian.
    U16,
    /// `u32`, little-endian.
    U32,
    /// `u64`, little-endian.
    U64,
    /// `u128`, little-endian.
    U128,
    /// `i8`, little-endian.
    I8,
    /// `i16`, little-endian.
    I16,
    /// `i32`, little-endian.
    I32,
    /// `i64`, little-endian.
    I64,
    /// `i128`, little-endian.
    I128,
    /// `bool`: one byte, 0 or 1.
    Bool,
    /// `()`: no bytes.
    Unit,
}

impl Plain {
    /// Every plain codec.
    pub const ALL: [Plain; 14] = [
        Plain::Bytes,
        Plain::Utf8,
        Plain::U8,
        Plain::U16,
        Plain::U32,
        Plain::U64,
        Plain::U128,
        Plain::I8,
        Plain::I16,
        Plain::I32,
        Plain::I64,
        Plain::I128,
        Plain::Bool,
        Plain::Unit,
    ];

    /// The codec id payload type ids are built from.
    pub fn codec_id(self) -> u64 {
        match self {
            Plain::Bytes => <Vec<u8>>::CODEC_ID,
            Plain::Utf8 => String::CODEC_ID,
            Plain::U8 => u8::CODEC_ID,
            Plain::U16 => u16::CODEC_ID,
            Plain::U32 => u32::CODEC_ID,
            Plain::U64 => u64::CODEC_ID,
            Plain::U128 => u128::CODEC_ID,
            Plain::I8 => i8::CODEC_ID,
            Plain::I16 => i16::CODEC_ID,
            Plain::I32 => i32::CODEC_ID,
            Plain::I64 => i64::CODEC_ID,
            Plain::I128 => i128::CODEC_ID,
            Plain::Bool => bool::CODEC_ID,
            Plain::Unit => <()>::CODEC_ID,
        }
    }

    /// The Rust type this codec encodes, as a user would write it.
    pub fn type_name(self) -> &'static str {
        match self {
            Plain::Bytes => "Vec<u8>",
            Plain::Utf8 => "String",
            Plain::U8 => "u8",
            Plain::U16 => "u16",
            Plain::U32 => "u32",
            Plain::U64 => "u64",
            Plain::U128 => "u128",
            Plain::I8 => "i8",
            Plain::I16 => "i16",
            Plain::I32 => "i32",
            Plain::I64 => "i64",
            Plain::I128 => "i128",
            Plain::Bool => "bool",
            Plain::Unit => "()",
        }
    }

    /// Decodes one value from exactly `bytes`; `None` if they are no encoding of it.
    pub fn decode(self, bytes: &[u8]) -> Option<Value> {
        fn unsigned<T: Codec + Into<u128>>(bytes: &[u8]) -> Option<Value> {
            T::decode(bytes).map(|v| Value::Unsigned(v.into()))
        }
        fn signed<T: Codec + Into<i128>>(bytes: &[u8]) -> Option<Value> {
            T::decode(bytes).map(|v| Value::Signed(v.into()))
        }
        match self {
            Plain::Bytes => <Vec<u8>>::decode(bytes).map(Value::Bytes),
            Plain::Utf8 => String::decode(bytes).map(Value::Str),
            Plain::U8 => unsigned::<u8>(bytes),
            Plain::U16 => unsigned::<u16>(bytes),
            Plain::U32 => unsigned::<u32>(bytes),
            Plain::U64 => unsigned::<u64>(bytes),
            Plain::U128 => unsigned::<u128>(bytes),
            Plain::I8 => signed::<i8>(bytes),
            Plain::I16 => signed::<i16>(bytes),
            Plain::I32 => signed::<i32>(bytes),
            Plain::I64 => signed::<i64>(bytes),
            Plain::I128 => signed::<i128>(bytes),
            Plain::Bool => bool::decode(bytes).map(Value::Bool),
            Plain::Unit => <()>::decode(bytes).map(|()| Value::Unit),
        }
    }
}

/// One decoded value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    /// A byte string.
    Bytes(Vec<u8>),
    /// A string.
    Str(String),
    /// An unsigned integer.
    Unsigned(u128),
    /// A signed integer.
    Signed(i128),
    /// A `bool`.
    Bool(bool),
    /// `()`.
    Unit,
}

/// How a structure kind lays its payloads out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// A map entry: the key's length (`u32`), the key, the value.
    Entry,
    /// A queue element: its sequence number (`u64`), the value.
    Element,
    /// A graph vertex: its id (`u64`), the value.
    Vertex,
    /// A graph edge: its source and destination vertex ids (`u64` each), the value.
    Edge,
}

/// What a payload type id stands for: a structure kind, its layout and its codecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Format {
    /// The kind of structure: `hash-map` ([`HashMap`](crate::HashMap) and
    /// [`NbHashMap`](crate::NbHashMap)), `sorted-map`, `queue` ([`Queue`](crate::Queue)
    /// and [`NbQueue`](crate::NbQueue)), `graph-vertex` or `graph-edge`.
    pub kind: &'static str,
    /// How its payloads are laid out.
    pub layout: Layout,
    /// The key's codec, for a map entry.
    pub key: Option<Plain>,
    /// The value's (or element's) codec.
    pub value: Plain,
}

/// The structure kinds and their layouts.
const KINDS: [(&str, Layout); 5] = [
    ("hash-map", Layout::Entry),
    ("sorted-map", Layout::Entry),
    ("queue", Layout::Element),
    ("graph-vertex", Layout::Vertex),
    ("graph-edge", Layout::Edge),
];

/// The format of payloads of type id `type_id`, if it is a collection's payload with plain
/// codecs. A lookup in a table of every such format, built at the first call (the tools call
/// this once per payload).
pub fn format_of(type_id: u64) -> Option<Format> {
    static FORMATS: std::sync::OnceLock<std::collections::HashMap<u64, Format>> =
        std::sync::OnceLock::new();
    FORMATS.get_or_init(every_format).get(&type_id).copied()
}

/// Every collection payload format with plain codecs, by type id.
fn every_format() -> std::collections::HashMap<u64, Format> {
    plain_formats().into_iter().collect()
}

/// Every collection payload format with plain codecs, with its type id: each kind with each
/// plain value codec, and, for the maps, each plain key codec.
fn plain_formats() -> Vec<(u64, Format)> {
    let mut formats = Vec::new();
    for (kind, layout) in KINDS {
        for value in Plain::ALL {
            let keys: Vec<Option<Plain>> = if layout == Layout::Entry {
                Plain::ALL.into_iter().map(Some).collect()
            } else {
                vec![None]
            };
            for key in keys {
                let codecs: Vec<u64> = key
                    .iter()
                    .map(|k| k.codec_id())
                    .chain([value.codec_id()])
                    .collect();
                let format = Format {
                    kind,
                    layout,
                    key,
                    value,
                };
                formats.push((type_id_of(kind, &codecs), format));
            }
        }
    }
    formats
}

impl Format {
    /// The fields of the payload `bytes`, named as the layout names them (`key` and `value`;
    /// `seq` and `value`; `id` and `value`; `from`, `to` and `value`); `None` if the bytes
    /// do not decode.
    pub fn decode(&self, bytes: &[u8]) -> Option<Vec<(&'static str, Value)>> {
        let word = |at: usize| -> Option<Value> {
            Some(Value::Unsigned(
                crate::structure::word_at(bytes, at)?.into(),
            ))
        };
        let value = |at: usize| self.value.decode(bytes.get(at..)?);
        Some(match self.layout {
            Layout::Entry => {
                let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
                let end = len.checked_add(4)?;
                let key = self.key?.decode(bytes.get(4..end)?)?;
                vec![("key", key), ("value", value(end)?)]
            }
            Layout::Element => vec![("seq", word(0)?), ("value", value(8)?)],
            Layout::Vertex => vec![("id", word(0)?), ("value", value(8)?)],
            Layout::Edge => vec![("from", word(0)?), ("to", word(8)?), ("value", value(16)?)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plain_format_is_recognised_by_its_type_id_and_no_other() {
        let mut seen = std::collections::HashSet::new();
        for (
            id,
            Format {
                kind, key, value, ..
            },
        ) in plain_formats()
        {
            assert!(seen.insert(id), "two formats share the type id {id:#x}");
            let format = format_of(id).unwrap();
            assert_eq!((format.kind, format.key, format.value), (kind, key, value));
        }
        assert_eq!(format_of(0), None);
    }

    #[test]
    fn payloads_that_do_not_decode_are_none() {
        let format = Format {
            kind: "hash-map",
            layout: Layout::Entry,
            key: Some(Plain::Utf8),
            value: Plain::U32,
        };
        let mut entry = 2u32.to_le_bytes().to_vec();
        entry.extend_from_slice(b"hi");
        entry.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(
            format.decode(&entry),
            Some(vec![
                ("key", Value::Str("hi".into())),
                ("value", Value::Unsigned(7))
            ])
        );
        assert_eq!(format.decode(&entry[..entry.len() - 1]), None);
        assert_eq!(format.decode(&entry[..3]), None);
        entry[0] = 200;
        assert_eq!(format.decode(&entry), None);
        entry[0] = 2;
        entry[4] = 0xff; // not UTF-8
        assert_eq!(format.decode(&entry), None);
    }
}
