//! What the derive emits when the input is rejected: the errors, plus (for a struct with
//! named fields) the accessor trait with bodies that never run, so that code using the
//! accessors does not add a cascade of "no method" errors to the real ones.

use proc_macro2::TokenStream;

use crate::ast::Field;
use crate::attr;
use crate::ctxt::Ctxt;
use crate::expand::{Bodies, accessors};

pub(crate) fn expand(
    input: &syn::DeriveInput,
    krate: &syn::Path,
    errors: &syn::Error,
) -> TokenStream {
    let mut out = errors.to_compile_error();
    if let syn::Data::Struct(syn::DataStruct {
        fields: syn::Fields::Named(named),
        ..
    }) = &input.data
        && input.generics.params.is_empty()
    {
        {
            // The attributes were already checked (and their errors reported) once.
            let cx = Ctxt::new();
            let fields: Vec<Field<'_>> = named
                .named
                .iter()
                .filter_map(|f| {
                    Some(Field {
                        ident: f.ident.as_ref()?,
                        ty: &f.ty,
                        attrs: attr::field(&cx, &f.attrs),
                    })
                })
                .collect();
            let _ = cx.check();
            out.extend(accessors(
                &input.ident,
                &input.vis,
                &fields,
                krate,
                Bodies::Unreachable,
            ));
        }
    }
    out
}
