//! Spanned checks of what a payload may be: a struct with named fields, no generics, and
//! fields whose types can live in persistent memory. The type checks here give a precise
//! reason for the common mistakes; the proof that a field is plain old data is zerocopy's
//! (the layout twin's derives and `PayloadField` bounds in `expand.rs`).

use crate::ctxt::Ctxt;

/// The named fields of a struct, or `None` with an error for anything else.
pub(crate) fn struct_fields<'a>(
    cx: &Ctxt,
    input: &'a syn::DeriveInput,
) -> Option<&'a syn::FieldsNamed> {
    match &input.data {
        syn::Data::Struct(data) => match &data.fields {
            syn::Fields::Named(named) if !named.named.is_empty() => Some(named),
            syn::Fields::Named(named) => {
                cx.error_spanned_by(named, "a payload needs at least one field");
                None
            }
            syn::Fields::Unnamed(fields) => {
                cx.error_spanned_by(
                    fields,
                    "`Payload` needs named fields: its accessors are named after them",
                );
                None
            }
            syn::Fields::Unit => {
                cx.error_spanned_by(&input.ident, "a payload needs at least one field");
                None
            }
        },
        syn::Data::Enum(data) => {
            cx.error_spanned_by(
                data.enum_token,
                "`Payload` can only be derived for structs: an enum's variants have no accessors; \
                 store a `#[repr(u8)]` enum as a field of a payload struct instead",
            );
            None
        }
        syn::Data::Union(data) => {
            cx.error_spanned_by(
                data.union_token,
                "`Payload` can only be derived for structs: a union does not record which field \
                 is valid, so its bytes cannot be checked when they are read back",
            );
            None
        }
    }
}

/// Generic payloads are not supported (yet): their layout id would depend on the arguments.
pub(crate) fn no_generics(cx: &Ctxt, generics: &syn::Generics) {
    if !generics.params.is_empty() {
        cx.error_spanned_by(
            generics,
            "a payload cannot be generic: its stored layout and type id must be fixed",
        );
    }
}

/// Owning and shared-pointer types that hold DRAM addresses, with a suggested replacement.
const DRAM_TYPES: &[(&str, &str)] = &[
    (
        "Box",
        "store the value inline, or a `POff<T>` to another payload",
    ),
    (
        "Vec",
        "use a fixed-size array `[T; N]` with a length field, or one payload per element",
    ),
    (
        "String",
        "use a fixed-size byte array `[u8; N]` with a length field",
    ),
    ("Rc", "store a `POff<T>` to another payload"),
    ("Arc", "store a `POff<T>` to another payload"),
    ("Weak", "store a `POff<T>` to another payload"),
    (
        "Cell",
        "payload fields change through `set_<field>` and `cas_<field>`",
    ),
    (
        "RefCell",
        "payload fields change through `set_<field>` and `cas_<field>`",
    ),
    ("Mutex", "synchronize in the DRAM index, not in the payload"),
    (
        "RwLock",
        "synchronize in the DRAM index, not in the payload",
    ),
    (
        "HashMap",
        "keep maps in DRAM and one payload per entry (see montage-collections)",
    ),
    (
        "BTreeMap",
        "keep maps in DRAM and one payload per entry (see montage-collections)",
    ),
    ("HashSet", "keep sets in DRAM and one payload per element"),
    ("BTreeSet", "keep sets in DRAM and one payload per element"),
    ("VecDeque", "use one payload per element"),
    ("LinkedList", "use one payload per element"),
    (
        "PathBuf",
        "use a fixed-size byte array `[u8; N]` with a length field",
    ),
    (
        "OsString",
        "use a fixed-size byte array `[u8; N]` with a length field",
    ),
    (
        "CString",
        "use a fixed-size byte array `[u8; N]` with a length field",
    ),
];

/// Rejects field types that certainly cannot live in persistent memory.
pub(crate) fn field_type(cx: &Ctxt, ty: &syn::Type) {
    match ty {
        syn::Type::Reference(_) => cx.error_spanned_by(
            ty,
            "a payload field cannot be a reference: it would store a DRAM address, which is \
             meaningless after a restart; store the value inline or a `POff<T>`",
        ),
        syn::Type::Ptr(_) => cx.error_spanned_by(
            ty,
            "a payload field cannot be a raw pointer: it would store a DRAM address, which is \
             meaningless after a restart (and the heap may be mapped elsewhere); use `POff<T>`",
        ),
        syn::Type::BareFn(_) => cx.error_spanned_by(
            ty,
            "a payload field cannot be a function pointer: code addresses change between runs",
        ),
        syn::Type::TraitObject(_) | syn::Type::ImplTrait(_) => cx.error_spanned_by(
            ty,
            "a payload field cannot be a trait object: it has no fixed layout",
        ),
        syn::Type::Slice(_) => cx.error_spanned_by(
            ty,
            "a payload field cannot be a slice: a payload has a fixed size; use an array `[T; N]`",
        ),
        syn::Type::Tuple(tuple) if !tuple.elems.is_empty() => cx.error_spanned_by(
            ty,
            "a payload field cannot be a tuple: tuples have no fixed layout; use a nested \
             `#[derive(Payload)]` struct or an array",
        ),
        syn::Type::Array(array) => field_type(cx, &array.elem),
        syn::Type::Paren(inner) => field_type(cx, &inner.elem),
        syn::Type::Group(inner) => field_type(cx, &inner.elem),
        syn::Type::Path(path) if path.qself.is_none() => {
            if let Some(last) = path.path.segments.last() {
                let name = last.ident.to_string();
                if let Some((_, instead)) = DRAM_TYPES.iter().find(|(n, _)| *n == name) {
                    cx.error_spanned_by(
                        ty,
                        format!(
                            "a payload field cannot be a `{name}`: it holds DRAM pointers or \
                             state, which do not survive a restart; {instead}"
                        ),
                    );
                }
            }
        }
        _ => {}
    }
}
