//! The expansion: `impl PayloadField` and `impl Payload` inside `const _: () = { ... }`, with
//! the layout twin that proves the struct is plain old data without padding, and the
//! `<Type>Fields` accessor trait beside the struct. Every path is absolute, trait methods
//! are called in fully qualified form, and nothing is `unsafe`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
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
        quote_spanned!(ty.span()=> #name: <#ty as #krate::PayloadField>::Repr)
    });
    let field_checks = input.fields.iter().map(|f| {
        let ty = f.ty;
        let check = quote_spanned!(ty.span()=> #krate::__private::assert_field::<#ty>());
        if f.attrs.atomic {
            let cas = quote_spanned!(ty.span()=> #krate::__private::assert_cas_field::<#ty>());
            quote!(const _: () = { #check; #cas; };)
        } else {
            quote!(const _: () = #check;)
        }
    });
    let fingerprint = input.fields.iter().map(|f| {
        let (name, ty) = (f.ident, f.ty);
        let name_str = unraw(name);
        let ty_str = quote!(#ty).to_string().replace(' ', "");
        quote! {
            .str(#name_str)
            .str(#ty_str)
            .u64(::core::mem::offset_of!(#ident, #name) as u64)
            .u64(<#ty as #krate::PayloadField>::LAYOUT)
        }
    });

    let accessors = accessors(ident, input.vis, &input.fields, krate, Bodies::Real);

    quote! {
        #[doc(hidden)]
        const _: () = {
            /// The layout twin: the same fields in the same order under the same `repr`, with
            /// zerocopy's derives proving every field is plain old data and the layout has
            /// no padding. Never constructed.
            #repr
            #[derive(
                #krate::__private::zerocopy::TryFromBytes,
                #krate::__private::zerocopy::IntoBytes,
                #krate::__private::zerocopy::Immutable,
            )]
            #[zerocopy(crate = #zerocopy)]
            #[allow(dead_code, non_camel_case_types, missing_docs)]
            pub struct #twin { #(#twin_fields,)* }

            // The twin's proof carries over only if the layouts are identical.
            const _: () = {
                ::core::assert!(::core::mem::size_of::<#ident>() == ::core::mem::size_of::<#twin>());
                ::core::assert!(::core::mem::align_of::<#ident>() == ::core::mem::align_of::<#twin>());
                #(::core::assert!(
                    ::core::mem::offset_of!(#ident, #names) == ::core::mem::offset_of!(#twin, #names)
                );)*
            };

            #(#field_checks)*

            #[automatically_derived]
            impl #krate::PayloadField for #ident {
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

            #[automatically_derived]
            impl #krate::Payload for #ident {
                const TYPE_NAME: &'static str = #registry_name;
                const TYPE_ID: u64 = #krate::__private::Fingerprint::new()
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
    let mut decls = Vec::new();
    let mut impls = Vec::new();
    for field in fields {
        let (name, ty) = (field.ident, field.ty);
        let plain = unraw(name);
        let get = format_ident!("get_{}", plain);
        let set = format_ident!("set_{}", plain);
        let get_doc = format!(
            "Reads `{plain}`. Fails with `Error::Aborted` if the payload is newer than `op`."
        );
        let set_doc = format!(
            "Writes `{plain}`: in place if the payload was written in `op`'s epoch, otherwise \
             by copy-on-write. Returns the handle to use from now on."
        );
        let (get_body, set_body) = match bodies {
            Bodies::Real => (
                quote!(#krate::__private::get_field::<#ident, #ty>(
                    op,
                    *self,
                    ::core::mem::offset_of!(#ident, #name),
                )),
                quote!(#krate::__private::set_field::<#ident, #ty>(
                    op,
                    *self,
                    ::core::mem::offset_of!(#ident, #name),
                    &value,
                )),
            ),
            Bodies::Unreachable => (
                quote!(let _ = op; ::core::unreachable!()),
                quote!(let _ = (op, value); ::core::unreachable!()),
            ),
        };
        decls.push(quote! {
            #[doc = #get_doc]
            fn #get(&self, op: &#krate::OpGuard<'_>) -> #krate::Result<#ty>;
            #[doc = #set_doc]
            fn #set(&self, op: &#krate::OpGuard<'_>, value: #ty) -> #krate::Result<#krate::PRef<#ident>>;
        });
        impls.push(quote! {
            fn #get(&self, op: &#krate::OpGuard<'_>) -> #krate::Result<#ty> {
                #get_body
            }
            fn #set(&self, op: &#krate::OpGuard<'_>, value: #ty) -> #krate::Result<#krate::PRef<#ident>> {
                #set_body
            }
        });
        if field.attrs.atomic {
            let cas = format_ident!("cas_{}", plain);
            let cas_doc = format!(
                "Swaps `{plain}` from `current` to `new` in place, only if it holds `current`, \
                 the payload was written in `op`'s epoch and the epoch clock has not moved on."
            );
            let cas_body = match bodies {
                Bodies::Real => quote!(#krate::__private::cas_field::<#ident, #ty>(
                    op,
                    *self,
                    ::core::mem::offset_of!(#ident, #name),
                    current,
                    new,
                )),
                Bodies::Unreachable => quote!(let _ = (op, current, new); ::core::unreachable!()),
            };
            decls.push(quote! {
                #[doc = #cas_doc]
                fn #cas(
                    &self,
                    op: &#krate::OpGuard<'_>,
                    current: #ty,
                    new: #ty,
                ) -> #krate::Result<::core::result::Result<(), #krate::CasError<#ty>>>;
            });
            impls.push(quote! {
                fn #cas(
                    &self,
                    op: &#krate::OpGuard<'_>,
                    current: #ty,
                    new: #ty,
                ) -> #krate::Result<::core::result::Result<(), #krate::CasError<#ty>>> {
                    #cas_body
                }
            });
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
        impl #trait_name for #krate::PRef<#ident> {
            #(#impls)*
        }
    }
}
