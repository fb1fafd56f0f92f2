//! [`Serde`]: a key or value of any type that implements serde's `Serialize` and
//! `Deserialize`, stored in postcard's compact format, with a codec id taken from the type's
//! serde data model so that a changed type is a [`LayoutMismatch`](crate::Error::LayoutMismatch)
//! rather than a misreading.
//!
//! The id comes from tracing the type's `Deserialize` implementation (serde-reflection): the
//! names and formats of its fields, the names and order of its enum variants, down through
//! every container it holds. The trace is walked into a [`Fingerprint`] by
//! [`schema_fingerprint`] below, an encoding this crate defines, so the id depends on the type
//! and not on the tracer's own data structures.

use std::any::{TypeId, type_name};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_reflection::{ContainerFormat, Format, Named, Registry, Tracer, TracerConfig};

use super::codec::{Codec, id};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

/// A key or value of a serde type, for the ready structures: `HashMap<String, Serde<Config>>`
/// stores each `Config` with [postcard](https://docs.rs/postcard) (compact, no field names).
/// Needs the `serde` feature.
///
/// The structures' type ids include an id of `T`'s serde data model: its container names,
/// field names and formats, and enum variants. A structure written with one `T` and opened
/// with a `T` whose fields or variants changed fails with [`Error::LayoutMismatch`] and
/// changes nothing, as a `#[derive(Payload)]` struct does. (A structure with no entries has
/// nothing to compare and opens with any type.)
///
/// A type postcard cannot store (one that needs a self-describing format: `#[serde(flatten)]`,
/// untagged enums, `serde_json::Value`) is refused when a structure opens, with
/// [`Error::Encode`]; so is one whose trace fails (a `Deserialize` that rejects the tracer's
/// sample values, such as a `NonZeroU32` field). A value that has no encoding (a `PathBuf`
/// that is no UTF-8) is refused when written, with [`Error::Encode`], and nothing is written.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use montage_core::payload::{Codec, Serde};
///
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Config {
///     name: String,
///     port: u16,
///     tags: Vec<String>,
/// }
///
/// let config = Serde(Config { name: "api".into(), port: 8080, tags: vec!["eu".into()] });
/// let mut bytes = Vec::new();
/// config.encode(&mut bytes)?;
/// assert_eq!(Serde::<Config>::decode(&bytes), Some(config));
/// # }
/// # Ok::<(), montage_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Serde<T>(pub T);

impl<T> Serde<T> {
    /// The value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Serde<T> {
    fn from(value: T) -> Self {
        Serde(value)
    }
}

impl<T> std::ops::Deref for Serde<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for Serde<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> Codec for Serde<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Names the format only; [`codec_id`](Codec::codec_id) adds the type's data model.
    const CODEC_ID: u64 = id("serde-postcard-1");

    fn codec_id() -> Result<u64> {
        schema_id::<T>()
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        encode_serde(&self.0, out)
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        match postcard::take_from_bytes::<T>(bytes) {
            // Exactly the bytes `encode` wrote: nothing may be left over.
            Ok((value, [])) => Some(Serde(value)),
            _ => None,
        }
    }
}

/// Appends `value` to `out` in postcard's format, as `postcard::to_extend` would write it,
/// but with a slice of bytes (a `Vec<u8>`, `[u8]` or `Box<[u8]>` anywhere in the value)
/// copied whole where postcard writes it a byte at a time. [`Serde`] encodes with it, and so
/// do the snapshots of `Logged` structures; postcard reads what it writes.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// let mut out = vec![0xAA];
/// montage_core::payload::encode_serde(&(300u16, vec![1u8, 2, 3]), &mut out)?;
/// assert_eq!(out, [0xAA, 0xAC, 0x02, 3, 1, 2, 3]);
/// # }
/// # Ok::<(), montage_core::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::Encode`] if the value has no postcard encoding (a sequence that does not know
/// its length in advance; a `PathBuf` that is no UTF-8); `out` is then as it was.
pub fn encode_serde<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    super::serde_write::write(value, out).map_err(|err| {
        out.truncate(start);
        encode_error::<T>(&err)
    })
}

fn encode_error<T: ?Sized>(why: &dyn std::fmt::Display) -> Error {
    Error::Encode {
        type_name: type_name::<T>(),
        why: why.to_string(),
    }
}

/// The codec id of `Serde<T>`, traced once per type and process.
fn schema_id<T: Serialize + DeserializeOwned + 'static>() -> Result<u64> {
    static IDS: OnceLock<Mutex<HashMap<TypeId, Result<u64, String>>>> = OnceLock::new();
    let ids = IDS.get_or_init(Mutex::default);
    let known = ids
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&TypeId::of::<T>())
        .cloned();
    // Traced outside the lock: a trace runs the user's `Deserialize`, which may itself open
    // a structure of serde values.
    let id = known.unwrap_or_else(|| {
        let id = trace::<T>();
        ids.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(TypeId::of::<T>(), id.clone());
        id
    });
    id.map_err(|why| encode_error::<T>(&why))
}

/// How many passes over a type's `Deserialize` one trace may take: each explores one more
/// variant of every enum it meets, so this bounds the variants of an enum `T` may hold.
const TRACE_PASSES: usize = 1 << 12;

/// Traces `T`'s data model and checks that postcard stores the sample values the trace
/// built; returns the id or why `T` cannot be stored.
fn trace<T: Serialize + DeserializeOwned>() -> Result<u64, String> {
    let failed =
        |err: serde_reflection::Error| format!("its serde data model cannot be traced: {err}");
    // Each pass explores one more variant of every enum it meets, but only of an enum whose
    // "incomplete" mark was read since the last pass, and the tracer names the enums still
    // incomplete only when it is consumed. So: trace with the enums known so far read after
    // every pass, until none of them is incomplete; if the registry then names others, start
    // again knowing them too.
    let mut enums = std::collections::BTreeSet::<String>::new();
    let no_samples = serde_reflection::Samples::new();
    let (root, samples, registry) = loop {
        let mut tracer = Tracer::new(TracerConfig::default().is_human_readable(false));
        let (mut root, mut samples) = (Format::unknown(), Vec::new());
        for _ in 0..TRACE_PASSES {
            let (format, value) = tracer.trace_type_once::<T>(&no_samples).map_err(failed)?;
            root = format;
            samples.push(value);
            let mut incomplete = false;
            for name in &enums {
                incomplete |= tracer.check_incomplete_enum(name).is_some();
            }
            if !incomplete {
                break;
            }
        }
        match tracer.registry() {
            Ok(registry) => break (root, samples, registry),
            Err(serde_reflection::Error::MissingVariants(names))
                if names.iter().any(|name| !enums.contains(name)) =>
            {
                enums.extend(names);
            }
            Err(err) => return Err(failed(err)),
        }
    };
    // A type that only a self-describing format can read (its `Deserialize` asks for "any"
    // value) fails the trace above; one whose `Serialize` postcard refuses fails here.
    for sample in &samples {
        let mut bytes = Vec::new();
        super::serde_write::write(sample, &mut bytes)
            .map_err(|err| format!("postcard cannot encode it: {err}"))?;
        postcard::from_bytes::<T>(&bytes)
            .map_err(|err| format!("postcard cannot decode it: {err}"))?;
    }
    schema_fingerprint(&root, &registry)
}

/// The fingerprint of a traced data model: the root format, then every container the
/// registry names, in name order.
fn schema_fingerprint(root: &Format, registry: &Registry) -> Result<u64, String> {
    let mut print = Fingerprint::new().str("serde-postcard-1");
    print = format(print, root)?;
    for (name, container) in registry {
        print = print.str(name);
        print = match container {
            ContainerFormat::UnitStruct => print.str("unit-struct"),
            ContainerFormat::NewTypeStruct(inner) => format(print.str("newtype-struct"), inner)?,
            ContainerFormat::TupleStruct(items) => formats(print.str("tuple-struct"), items)?,
            ContainerFormat::Struct(fields) => named(print.str("struct"), fields)?,
            ContainerFormat::Enum(variants) => {
                print = print.str("enum").u64(variants.len() as u64);
                for (&index, variant) in variants {
                    print = print.u64(u64::from(index)).str(&variant.name);
                    print = match &variant.value {
                        serde_reflection::VariantFormat::Unit => print.str("unit"),
                        serde_reflection::VariantFormat::NewType(inner) => {
                            format(print.str("newtype"), inner)?
                        }
                        serde_reflection::VariantFormat::Tuple(items) => {
                            formats(print.str("tuple"), items)?
                        }
                        serde_reflection::VariantFormat::Struct(fields) => {
                            named(print.str("struct"), fields)?
                        }
                        serde_reflection::VariantFormat::Variable(_) => {
                            return Err(incomplete(name));
                        }
                    };
                }
                print
            }
        };
    }
    Ok(print.finish())
}

fn incomplete(what: &str) -> String {
    format!("its serde data model cannot be traced: the format of `{what}` stayed unknown")
}

fn formats(print: Fingerprint, items: &[Format]) -> Result<Fingerprint, String> {
    items.iter().try_fold(print.u64(items.len() as u64), format)
}

fn named(print: Fingerprint, fields: &[Named<Format>]) -> Result<Fingerprint, String> {
    fields
        .iter()
        .try_fold(print.u64(fields.len() as u64), |print, field| {
            format(print.str(&field.name), &field.value)
        })
}

fn format(print: Fingerprint, format_: &Format) -> Result<Fingerprint, String> {
    let leaf = |name: &str| Ok(print.str(name));
    match format_ {
        Format::Variable(_) => Err(incomplete("a field")),
        Format::TypeName(name) => Ok(print.str("type").str(name)),
        Format::Unit => leaf("unit"),
        Format::Bool => leaf("bool"),
        Format::I8 => leaf("i8"),
        Format::I16 => leaf("i16"),
        Format::I32 => leaf("i32"),
        Format::I64 => leaf("i64"),
        Format::I128 => leaf("i128"),
        Format::U8 => leaf("u8"),
        Format::U16 => leaf("u16"),
        Format::U32 => leaf("u32"),
        Format::U64 => leaf("u64"),
        Format::U128 => leaf("u128"),
        Format::F32 => leaf("f32"),
        Format::F64 => leaf("f64"),
        Format::Char => leaf("char"),
        Format::Str => leaf("str"),
        Format::Bytes => leaf("bytes"),
        Format::Option(inner) => format(print.str("option"), inner),
        Format::Seq(inner) => format(print.str("seq"), inner),
        Format::Map { key, value } => format(format(print.str("map"), key)?, value),
        Format::Tuple(items) => formats(print.str("tuple"), items),
        Format::TupleArray { content, size } => {
            format(print.str("array").u64(*size as u64), content)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    enum Level {
        Low,
        High { limit: u32 },
    }

    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    struct Config {
        name: String,
        port: u16,
        level: Level,
        tags: Vec<String>,
        limits: BTreeMap<String, (u8, Option<i64>)>,
    }

    fn config() -> Config {
        Config {
            name: "api".into(),
            port: 8080,
            level: Level::High { limit: 7 },
            tags: vec!["eu".into(), "beta".into()],
            limits: BTreeMap::from([("rps".into(), (3, Some(-9))), ("x".into(), (0, None))]),
        }
    }

    /// A `Config` like the one above, in a module of its own, with a port of type `$port`
    /// and the module's own `Level`: the type as another version of the program has it.
    macro_rules! config_with_port {
        ($port:ty) => {
            #[derive(Serialize, Deserialize)]
            pub(super) struct Config {
                name: String,
                port: $port,
                level: Level,
                tags: Vec<String>,
                limits: BTreeMap<String, (u8, Option<i64>)>,
            }
        };
    }

    /// One field retyped.
    mod changed {
        use super::*;

        #[derive(Serialize, Deserialize)]
        pub(super) enum Level {
            Low,
            High { limit: u32 },
        }

        config_with_port!(u32);
    }

    /// Only the last variant of the nested enum changed.
    mod last_variant {
        use super::*;

        #[derive(Serialize, Deserialize)]
        pub(super) enum Level {
            Low,
            High { limit: u64 },
        }

        config_with_port!(u16);
    }

    /// The nested enum's variants in another order.
    mod reordered {
        use super::*;

        #[derive(Serialize, Deserialize)]
        pub(super) enum Level {
            High { limit: u32 },
            Low,
        }

        config_with_port!(u16);
    }

    /// Another Rust type with the same names and data model: the same id.
    mod same {
        use super::*;

        #[derive(Serialize, Deserialize)]
        pub(super) enum Level {
            Low,
            High { limit: u32 },
        }

        config_with_port!(u16);
    }

    /// A recursive type with enums inside enums.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Tree {
        Leaf(Level),
        Node(Box<Tree>, Box<Tree>),
        Tagged { tag: Option<Level>, tree: Box<Tree> },
    }

    #[test]
    fn values_round_trip_and_other_bytes_do_not_decode() {
        let value = Serde(config());
        let mut bytes = vec![0xAA];
        value.encode(&mut bytes).unwrap();
        assert_eq!(bytes[0], 0xAA, "encode appends");
        assert_eq!(Serde::<Config>::decode(&bytes[1..]), Some(value.clone()));
        let decoded =
            Serde::<Config>::decode_from(crate::payload::Encoded::from_bytes(&bytes[1..]));
        assert_eq!(decoded.unwrap(), Some(value));
        // Short, or with bytes left over: not a `Config`.
        assert_eq!(Serde::<Config>::decode(&bytes[1..bytes.len() - 1]), None);
        let mut longer = bytes[1..].to_vec();
        longer.push(0);
        assert_eq!(Serde::<Config>::decode(&longer), None);
        assert_eq!(Serde::<u64>::decode(&[0xff; 11]), None);
    }

    #[test]
    fn the_codec_id_follows_the_data_model() {
        let id = Serde::<Config>::codec_id().unwrap();
        assert_eq!(Serde::<Config>::codec_id().unwrap(), id, "stable");
        assert_eq!(Serde::<same::Config>::codec_id().unwrap(), id);
        assert_ne!(Serde::<changed::Config>::codec_id().unwrap(), id);
        assert_ne!(Serde::<reordered::Config>::codec_id().unwrap(), id);
        assert_ne!(Serde::<last_variant::Config>::codec_id().unwrap(), id);
        let tree = Serde::<Tree>::codec_id().unwrap();
        assert_ne!(tree, id);
        let value = Serde(Tree::Tagged {
            tag: Some(Level::High { limit: 3 }),
            tree: Box::new(Tree::Node(
                Box::new(Tree::Leaf(Level::Low)),
                Box::new(Tree::Leaf(Level::High { limit: 9 })),
            )),
        });
        let mut bytes = Vec::new();
        value.encode(&mut bytes).unwrap();
        assert_eq!(Serde::<Tree>::decode(&bytes), Some(value));
        assert_ne!(
            Serde::<String>::codec_id().unwrap(),
            Serde::<Vec<u8>>::codec_id().unwrap()
        );
        assert_ne!(
            Serde::<u32>::codec_id().unwrap(),
            Serde::<u64>::codec_id().unwrap()
        );
        assert_ne!(
            Serde::<String>::codec_id().unwrap(),
            <String as Codec>::codec_id().unwrap()
        );
    }

    #[derive(Serialize, Deserialize, Debug)]
    struct Inner {
        a: u8,
    }

    #[derive(Serialize, Deserialize, Debug)]
    struct Flattened {
        #[serde(flatten)]
        inner: Inner,
        b: u8,
    }

    #[derive(Serialize, Deserialize, Debug)]
    #[serde(untagged)]
    enum Untagged {
        Number(u64),
        Text(String),
    }

    #[test]
    fn types_postcard_cannot_store_are_refused_with_a_reason() {
        for (err, name) in [
            (Serde::<Flattened>::codec_id().unwrap_err(), "Flattened"),
            (Serde::<Untagged>::codec_id().unwrap_err(), "Untagged"),
            (
                Serde::<std::num::NonZeroU32>::codec_id().unwrap_err(),
                "NonZero",
            ),
        ] {
            let message = err.to_string();
            assert!(matches!(err, Error::Encode { .. }), "{err:?}");
            assert!(message.contains(name), "{message}");
        }
    }

    #[test]
    fn a_value_without_an_encoding_is_refused_and_nothing_is_written() {
        use std::os::unix::ffi::OsStrExt;

        let path = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
        let mut out = vec![1, 2, 3];
        let err = Serde(path).encode(&mut out).unwrap_err();
        assert!(matches!(err, Error::Encode { .. }), "{err:?}");
        assert_eq!(out, [1, 2, 3]);
        Serde(PathBuf::from("/tmp/fine")).encode(&mut out).unwrap();
        assert!(out.len() > 3);
    }
}
