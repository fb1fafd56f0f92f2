//! The expansion: `impl PayloadField` and `impl Payload` inside `const _: () = { ... }`, with
//! the layout twin that proves the struct is plain old data without padding, and the
//! `<Type>Fields` accessor trait beside the struct. Every path is absolute, trait methods
//! are called in fully qualified form, and nothing is `unsafe`.

use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use crate::ast::{Field, Input, unraw};
use crate::attr;
use crate::crate_path;
use crate::ctxt::Ctxt;
use crate::fallback;

/// Expands `#[derive(Payload)]` on `input`.
pub(crate) fn derive(input: &syn::DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let attrs = attr::container(&cx, &input.attrs);
    let krate = crate_path::resolve(&cx, attrs.krate.as_ref());
    let parsed = Input::from_ast(&cx, input, attrs);
    match (cx.check(), parsed) {
        (Ok(()), Some(parsed)) => expand(&parsed, &krate),
        (Err(errors), _) => fallback::expand(input, &krate, &errors),
        (Ok(()), None) => fallback::expand(
            input,
            &krate,
            &syn::Error::new(input.ident.span(), "invalid payload definition"),
        ),
    }
}

fn expand(input: &Input<'_>, krate: &syn::Path) -> TokenStream {
    let ident = input.ident;
    let registry_name = input.registry_name();
    let repr = input.repr.attribute();
    let zerocopy = crate_path::zerocopy_path(krate);
    let twin = format_ident!("__MontageLayoutOf{}", unraw(ident));

    let names: Vec<&syn::Ident> = input.fields.iter().map(|f| f.ident).collect();
    let types: Vec<&syn::Type> = input.fields.iter().map(|f| f.ty).collect();

    // The twin's fields carry the user's field-type spans, so that zerocopy's complaints
    // about a field point at that field.
    let twin_fields = input.fields.iter().map(|f| {
        let (name, ty) = (f.ident, f.ty);
        quote_spanned!(ty.span()=> #name: <#ty as #krate::payload::PayloadField>::Repr)
    });
    // Every generated item that needs the fields to be payload fields states it as a
    // where-clause spanned on the field's type: a field that is not fails once per item, at
    // the field, with `PayloadField`'s explanation, and the item's body is not checked
    // again against the missing bound (which would repeat the error at every use).
    let bounds = field_bounds(&input.fields, krate);
    // The type id follows the resolved layout: each field's name, offset and own id (its
    // type's `PayloadField::LAYOUT`), never the type as spelled here, so that an alias or a
    // path to the same type gives the same id.
    let fingerprint = input.fields.iter().map(|f| {
        let (name, ty) = (f.ident, f.ty);
        let name_str = unraw(name);
        quote! {
            .str(#name_str)
            .u64(::core::mem::offset_of!(#ident, #name) as u64)
            .u64(<#ty as #krate::payload::PayloadField>::LAYOUT)
        }
    });

    let padding_message = format!(
        "`{}` has padding bytes between or after its fields: a payload's bytes are stored as they \
         are, so every byte must belong to a field; reorder the fields from the largest \
         alignment to the smallest, or add explicit padding fields such as `_pad: [u8; N]`",
        unraw(ident)
    );
    // Padding is a property of the whole struct: both diagnostics point at its name.
    let at_name = respan(krate, ident.span());
    let derive_into_bytes =
        quote_spanned!(ident.span()=> #[derive(#at_name::__private::zerocopy::IntoBytes)]);
    let padding_check = quote_spanned! {ident.span()=>
        const _: () = ::core::assert!(
            ::core::mem::size_of::<#ident>() == #(::core::mem::size_of::<#types>())+*,
            #padding_message,
        );
    };
    let accessors = accessors(ident, input.vis, &input.fields, krate, Bodies::Real);
    let codec = codec_impl(ident, krate, &bounds);

    quote! {
        #[doc(hidden)]
        const _: () = {
            /// The layout twin: the same fields in the same order under the same `repr`, with
            /// zerocopy's `IntoBytes` derive proving the layout has no padding (each field is
            /// plain old data by its `PayloadField` bound). Never constructed.
            #repr
            #derive_into_bytes
            #[zerocopy(crate = #zerocopy)]
            #[allow(dead_code, non_camel_case_types, missing_docs)]
            pub struct #twin where #(#bounds)* { #(#twin_fields,)* }

            // A plain statement of the most common rejection; zerocopy's derive on the twin
            // is the proof, and reports the same problem in its own terms.
            #padding_check

            // The twin's proof carries over only if the layouts are identical.
            const _: () = {
                ::core::assert!(::core::mem::size_of::<#ident>() == ::core::mem::size_of::<#twin>());
                ::core::assert!(::core::mem::align_of::<#ident>() == ::core::mem::align_of::<#twin>());
                #(::core::assert!(
                    ::core::mem::offset_of!(#ident, #names) == ::core::mem::offset_of!(#twin, #names)
                );)*
            };

            #[automatically_derived]
            impl #krate::payload::PayloadField for #ident where #(#bounds)* {
                type Repr = #twin;
                const LAYOUT: u64 = <#ident as #krate::Payload>::TYPE_ID;

                fn write_field(&self, out: &mut [u8]) {
                    ::core::assert_eq!(out.len(), ::core::mem::size_of::<#ident>());
                    #(#krate::__private::write_at::<#types>(
                        out,
                        ::core::mem::offset_of!(#ident, #names),
                        &self.#names,
                    );)*
                }

                fn read_field(bytes: &[u8]) -> ::core::option::Option<Self> {
                    if bytes.len() != ::core::mem::size_of::<#ident>() {
                        return ::core::option::Option::None;
                    }
                    ::core::option::Option::Some(#ident {
                        #(#names: #krate::__private::read_at::<#types>(
                            bytes,
                            ::core::mem::offset_of!(#ident, #names),
                        )?,)*
                    })
                }
            }

            #codec

            #[automatically_derived]
            impl #krate::Payload for #ident where #(#bounds)* {
                const TYPE_NAME: &'static str = #registry_name;
                const TYPE_ID: u64 = #krate::payload::Fingerprint::new()
                    .str(#registry_name)
                    #(#fingerprint)*
                    .u64(::core::mem::size_of::<#ident>() as u64)
                    .u64(::core::mem::align_of::<#ident>() as u64)
                    .finish();
            }
        };

        #accessors
    }
}

/// `impl Codec`: a payload type's encoding in collections is its stored bytes.
fn codec_impl(ident: &syn::Ident, krate: &syn::Path, bounds: &[TokenStream]) -> TokenStream {
    quote! {
        #[automatically_derived]
        impl #krate::payload::Codec for #ident where #(#bounds)* {
            const CODEC_ID: u64 = <#ident as #krate::Payload>::TYPE_ID;

            fn encode(&self, out: &mut ::std::vec::Vec<u8>) -> #krate::Result<()> {
                #krate::__private::encode_payload::<#ident>(self, out);
                ::core::result::Result::Ok(())
            }

            #[inline]
            fn fingerprint_encoding(
                &self,
                into: #krate::payload::Fingerprint,
            ) -> ::core::option::Option<#krate::payload::Fingerprint> {
                #krate::__private::fingerprint_payload::<#ident>(self, into)
            }

            fn decode(bytes: &[u8]) -> ::core::option::Option<Self> {
                <#ident as #krate::payload::PayloadField>::read_field(bytes)
            }
        }
    }
}

/// `Type: PayloadField,` for every field (and `Type: CasField,` for atomic ones), each
/// spanned on the field's type.
fn field_bounds(fields: &[Field<'_>], krate: &syn::Path) -> Vec<TokenStream> {
    fields
        .iter()
        .map(|f| {
            let ty = f.ty;
            let krate = respan(krate, ty.span());
            if f.attrs.atomic {
                quote_spanned!(ty.span()=> #ty: #krate::payload::PayloadField + #krate::payload::CasField,)
            } else {
                quote_spanned!(ty.span()=> #ty: #krate::payload::PayloadField,)
            }
        })
        .collect()
}

/// `tokens` with every span replaced by `span` (so that a diagnostic about a generated bound
/// points at the user's field rather than at the derive).
fn respan(tokens: &impl ToTokens, span: proc_macro2::Span) -> TokenStream {
    tokens
        .to_token_stream()
        .into_iter()
        .map(|mut tree| {
            if let proc_macro2::TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(&group.stream(), span));
                inner.set_span(span);
                tree = proc_macro2::TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// A field's accessors: (doc, signature, body) of `get_`, `set_` and, for an atomic field,
/// `cas_`.
fn field_methods(
    ident: &syn::Ident,
    field: &Field<'_>,
    krate: &syn::Path,
    bodies: Bodies,
) -> Vec<(String, TokenStream, TokenStream)> {
    let (name, ty) = (field.ident, field.ty);
    let plain = unraw(name);
    let offset = quote!(::core::mem::offset_of!(#ident, #name));
    let op = quote!(op: &#krate::OpGuard<'_>);
    let body = |call: TokenStream, args: TokenStream| match bodies {
        Bodies::Real => call,
        Bodies::Unreachable => quote!(let _ = #args; ::core::unreachable!()),
    };
    let get = format_ident!("get_{}", plain);
    let set = format_ident!("set_{}", plain);
    let mut methods = vec![
        (
            format!(
                "Reads `{plain}`. Fails with `Error::Aborted` if the payload is newer than `op`."
            ),
            quote!(fn #get(&self, #op) -> #krate::Result<#ty>),
            body(
                quote!(#krate::__private::get_field::<#ident, #ty>(op, *self, #offset)),
                quote!(op),
            ),
        ),
        (
            format!(
                "Writes `{plain}`: in place if the payload was written in `op`'s epoch, \
                 otherwise by copy-on-write. Returns the handle to use from now on."
            ),
            quote!(fn #set(&self, #op, value: #ty) -> #krate::Result<#krate::PRef<#ident>>),
            body(
                quote!(#krate::__private::set_field::<#ident, #ty>(op, *self, #offset, &value)),
                quote!((op, value)),
            ),
        ),
    ];
    if field.attrs.atomic {
        let cas = format_ident!("cas_{}", plain);
        methods.push((
            format!(
                "Swaps `{plain}` from `current` to `new` in place, only if it holds `current`, \
                 the payload was written in `op`'s epoch and the epoch clock has not moved on."
            ),
            quote!(fn #cas(&self, #op, current: #ty, new: #ty)
                -> #krate::Result<::core::result::Result<(), #krate::verified::CasError<#ty>>>),
            body(
                quote!(#krate::__private::cas_field::<#ident, #ty>(op, *self, #offset, current, new)),
                quote!((op, current, new)),
            ),
        ));
    }
    methods
}

/// What the generated accessor methods do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bodies {
    /// Call the runtime.
    Real,
    /// Never run: the fallback after a compile error, so that call sites do not add errors.
    Unreachable,
}

/// The `<Type>Fields` trait and its impl for `PRef<Type>`.
pub(crate) fn accessors(
    ident: &syn::Ident,
    vis: &syn::Visibility,
    fields: &[Field<'_>],
    krate: &syn::Path,
    bodies: Bodies,
) -> TokenStream {
    let trait_name = format_ident!("{}Fields", unraw(ident));
    // The fallback states no bounds: the fields were already reported.
    let bounds = match bodies {
        Bodies::Real => field_bounds(fields, krate),
        Bodies::Unreachable => Vec::new(),
    };
    let mut decls = Vec::new();
    let mut impls = Vec::new();
    for field in fields {
        for (doc, signature, body) in field_methods(ident, field, krate, bodies) {
            decls.push(quote!(#[doc = #doc] #signature;));
            impls.push(quote!(#signature { #body }));
        }
    }
    let trait_doc = format!(
        "Field accessors of [`{ident}`] payloads, generated by `#[derive(Payload)]`; \
         implemented for `PRef<{ident}>`."
    );
    quote! {
        #[doc = #trait_doc]
        #vis trait #trait_name {
            #(#decls)*
        }

        #[automatically_derived]
        impl #trait_name for #krate::PRef<#ident> where #(#bounds)* {
            #(#impls)*
        }
    }
}
