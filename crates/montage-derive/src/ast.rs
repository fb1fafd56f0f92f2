//! The derive input as the expansion needs it: a checked struct with named fields.

use crate::attr::{self, ContainerAttrs, FieldAttrs};
use crate::ctxt::Ctxt;
use crate::repr::{self, Repr};
use crate::valid;

/// A struct that passed every syntactic check.
pub(crate) struct Input<'a> {
    pub(crate) ident: &'a syn::Ident,
    pub(crate) vis: &'a syn::Visibility,
    pub(crate) repr: Repr,
    pub(crate) attrs: ContainerAttrs,
    pub(crate) fields: Vec<Field<'a>>,
}

/// One named field.
pub(crate) struct Field<'a> {
    pub(crate) ident: &'a syn::Ident,
    pub(crate) ty: &'a syn::Type,
    pub(crate) attrs: FieldAttrs,
}

impl<'a> Input<'a> {
    /// Parses and checks `input`, recording every problem in `cx`; `None` if there was one.
    pub(crate) fn from_ast(
        cx: &Ctxt,
        input: &'a syn::DeriveInput,
        attrs: ContainerAttrs,
    ) -> Option<Input<'a>> {
        let named = valid::struct_fields(cx, input);
        valid::no_generics(cx, &input.generics);
        let repr = repr::parse(cx, &input.attrs, input.ident.span());
        let fields: Vec<Field<'a>> = named
            .map(|named| {
                named
                    .named
                    .iter()
                    .filter_map(|field| {
                        let ident = field.ident.as_ref()?;
                        valid::field_type(cx, &field.ty);
                        Some(Field {
                            ident,
                            ty: &field.ty,
                            attrs: attr::field(cx, &field.attrs),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Input {
            ident: &input.ident,
            vis: &input.vis,
            repr: repr?,
            attrs,
            fields,
        })
    }

    /// The name the heap's type registry knows the type by.
    pub(crate) fn registry_name(&self) -> String {
        self.attrs
            .rename
            .as_ref()
            .map_or_else(|| unraw(self.ident), syn::LitStr::value)
    }
}

/// An identifier without its `r#` prefix.
pub(crate) fn unraw(ident: &syn::Ident) -> String {
    let s = ident.to_string();
    s.strip_prefix("r#")
        .map_or_else(|| s.clone(), str::to_owned)
}
