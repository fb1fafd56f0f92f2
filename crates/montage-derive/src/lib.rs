//! `#[derive(Payload)]`: makes a plain-old-data struct storable in a montage persistent heap.
//!
//! Use it through the `montage` facade (`montage::Payload`), which re-exports it. The derive
//! checks what the compiler cannot see from the type alone (`#[repr(C)]`, named fields, no
//! generics, the `payload` attributes), requires every field to be a `PayloadField` (plain
//! old data by zerocopy's judgement with a field id of its own: a primitive, an array, a
//! `POff`, another payload, or a type declared with `montage::payload_field!`), proves the
//! layout has no padding by deriving zerocopy's `IntoBytes` for a layout twin of the struct,
//! computes the type id from the resolved layout (each field's name, offset and field id;
//! never the type as spelled, so aliases do not change it), and generates the
//! `<Type>Fields` accessor trait. See the `montage` crate docs for what the accessors do.
//!
//! ```text
//! #[derive(Payload)]
//! #[repr(C)]
//! pub struct Account {
//!     pub id: u64,
//!     #[payload(atomic)]
//!     pub balance: i64,
//! }
//! ```
//!
//! Attributes: `#[payload(crate = "path")]` (where the facade is, default `::montage`),
//! `#[payload(rename = "Name")]` (the name in the heap's type registry, default the struct's
//! name) on the struct; `#[payload(atomic)]` on a `u64` or `i64` field to generate its
//! `cas_<field>`.

#![forbid(unsafe_code)]

mod ast;
mod attr;
mod crate_path;
mod ctxt;
mod expand;
mod fallback;
mod logged;
mod repr;
mod valid;

use proc_macro::TokenStream;

/// `#[montage::logged]` on an `impl` block: makes the structure's `pub fn (&mut self, ..)`
/// methods the logged operations of a `montage::collections::Logged` of it. Generates the
/// operation enum `<T>Op` (its encoding: each argument's `Codec`), the output enum
/// `<T>Output`, the `Replay` impl, and the trait `<T>Logged` whose methods, on a
/// `Logged<T>`, log and make each call and return `montage::Result` of what the method
/// returns. `#[montage::logged(snapshot)]` also implements snapshots with serde (`T` must
/// derive `Serialize` and `Deserialize`; the `serde` feature). Rejects, with an error on it,
/// what cannot be replayed: generic methods or structures, `impl Trait`, references and
/// closures as arguments, `async fn`, `self` by value.
#[proc_macro_attribute]
pub fn logged(args: TokenStream, item: TokenStream) -> TokenStream {
    logged::expand(args.into(), &item.into()).into()
}

/// Derives `montage::Payload` (see the crate docs).
#[proc_macro_derive(Payload, attributes(payload))]
pub fn derive_payload(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive(&input).into()
}
