#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![doc(test(attr(deny(warnings))))]

pub use montage_core::*;

/// Derives [`Payload`] for a `#[repr(C)]` struct of plain-old-data fields, with its
/// `<Type>Fields` accessor trait (`get_<field>`, `set_<field>`, and `cas_<field>` for fields
/// marked `#[payload(atomic)]`). See the crate docs for an example.
#[cfg(feature = "derive")]
pub use montage_derive::{Payload, logged};

/// The ready structures (`montage-collections`): hash map, ordered map, queue and graph.
pub use montage_collections as collections;
