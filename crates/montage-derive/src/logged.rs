//! `#[logged]` on an `impl` block: the operations of a `Logged<T>` from `T`'s own methods.
//!
//! Every `pub fn name(&mut self, arg: Type, ...) -> R` of the block (or `pub(crate)`, ...:
//! any method that is not private) becomes a variant of an operation enum `<T>Op` (its
//! arguments as fields, each encoded with its `Codec` behind a length), with an output enum
//! `<T>Output`, the `Replay` impl that calls the method, and a trait `<T>Logged`, implemented
//! for every `Logs<T>` handle (`Logged<T>`, a shard of `LoggedShards<T>`), whose methods of
//! the same names log the call and return `montage::Result<R>`. The generated items have the
//! visibility of the most visible logged method. `&self` methods and private methods are
//! left as they are (reads go through `Logged::read`). What cannot be replayed is rejected
//! with an error on it: generic methods or blocks, `impl Trait`, reference or pattern
//! arguments, `async fn`, `self` by value.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

use crate::ctxt::Ctxt;

/// The attribute's arguments: `crate = "path"`, `snapshot`.
struct Args {
    krate: Option<syn::LitStr>,
    snapshot: bool,
}

fn parse_args(cx: &Ctxt, args: TokenStream) -> Args {
    let mut out = Args {
        krate: None,
        snapshot: false,
    };
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            out.krate = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("snapshot") {
            out.snapshot = true;
            Ok(())
        } else {
            Err(meta.error("expected `crate = \"path\"` or `snapshot`"))
        }
    });
    if let Err(err) = syn::parse::Parser::parse2(parser, args) {
        cx.syn_error(err);
    }
    out
}

/// One logged method: its name, visibility, arguments (name, type) and return type.
struct Method {
    name: syn::Ident,
    vis: syn::Visibility,
    args: Vec<(syn::Ident, syn::Type)>,
    output: syn::Type,
}

/// The visibility of the generated items: that of the most visible logged method (`pub`
/// before `pub(crate)` before any other restriction), so that they expose no more than the
/// methods do, nor less.
fn visibility(methods: &[Method]) -> syn::Visibility {
    let rank = |vis: &syn::Visibility| match vis {
        syn::Visibility::Public(_) => 3,
        syn::Visibility::Restricted(r) if r.path.is_ident("crate") && r.in_token.is_none() => 2,
        syn::Visibility::Restricted(_) => 1,
        syn::Visibility::Inherited => 0,
    };
    methods
        .iter()
        .map(|m| &m.vis)
        .max_by_key(|vis| rank(vis))
        .cloned()
        .unwrap_or(syn::Visibility::Inherited)
}

/// The logged methods of `block`, with an error on each that cannot be one.
fn methods(cx: &Ctxt, block: &syn::ItemImpl) -> Vec<Method> {
    let mut out = Vec::new();
    for item in &block.items {
        let syn::ImplItem::Fn(f) = item else { continue };
        // Private methods are helpers; `pub` and `pub(crate)`, ... are the structure's API.
        if matches!(f.vis, syn::Visibility::Inherited) {
            continue;
        }
        let sig = &f.sig;
        let Some(syn::FnArg::Receiver(receiver)) = sig.inputs.first() else {
            continue;
        };
        if receiver.reference.is_none() {
            cx.error_spanned_by(receiver, "a logged method takes `&mut self`, not `self`");
            continue;
        }
        if receiver.mutability.is_none() {
            // `&self`: a read, not logged.
            continue;
        }
        if let Some(asyncness) = &sig.asyncness {
            cx.error_spanned_by(
                asyncness,
                "a logged method cannot be `async`: its call is replayed",
            );
        }
        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            cx.error_spanned_by(
                &sig.generics,
                "a logged method cannot be generic: its arguments are stored in one operation type",
            );
        }
        let mut args = Vec::new();
        for input in sig.inputs.iter().skip(1) {
            let syn::FnArg::Typed(typed) = input else {
                continue;
            };
            let syn::Pat::Ident(ident) = &*typed.pat else {
                cx.error_spanned_by(
                    &typed.pat,
                    "a logged method's arguments must be plain names",
                );
                continue;
            };
            if let Some(why) = unstorable(&typed.ty) {
                cx.error_spanned_by(&typed.ty, why);
                continue;
            }
            args.push((ident.ident.clone(), (*typed.ty).clone()));
        }
        let output = match &sig.output {
            syn::ReturnType::Default => syn::parse_quote!(()),
            syn::ReturnType::Type(_, ty) => {
                if matches!(**ty, syn::Type::ImplTrait(_)) {
                    cx.error_spanned_by(ty, "a logged method cannot return `impl Trait`");
                }
                (**ty).clone()
            }
        };
        out.push(Method {
            name: sig.ident.clone(),
            vis: f.vis.clone(),
            args,
            output,
        });
    }
    out
}

/// Why an argument of type `ty` cannot be logged, if it cannot.
fn unstorable(ty: &syn::Type) -> Option<&'static str> {
    match ty {
        syn::Type::Reference(r) if r.mutability.is_some() => Some(
            "a logged method cannot take `&mut` arguments: a replay has nothing to write through",
        ),
        syn::Type::Reference(_) => {
            Some("a logged method's arguments are stored: take an owned value, not a reference")
        }
        syn::Type::ImplTrait(_) => Some(
            "a logged method cannot take `impl Trait` (a closure, an iterator): its argument is stored and replayed",
        ),
        syn::Type::TraitObject(_) | syn::Type::BareFn(_) => Some(
            "a logged method cannot take functions or trait objects: its arguments are stored and replayed",
        ),
        syn::Type::Paren(inner) => unstorable(&inner.elem),
        _ => None,
    }
}

/// Expands `#[logged(args)]` on `item`.
pub(crate) fn expand(args: TokenStream, item: &TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let args = parse_args(&cx, args);
    let Ok(block) = syn::parse2::<syn::ItemImpl>(item.clone()) else {
        let err = syn::Error::new(
            Span::call_site(),
            "#[logged] goes on an `impl` block of the structure's own methods",
        )
        .to_compile_error();
        return quote!(#item #err);
    };
    if let Some((_, path, _)) = &block.trait_ {
        cx.error_spanned_by(
            path,
            "#[logged] goes on the structure's own methods, not a trait impl",
        );
    }
    if !block.generics.params.is_empty() {
        cx.error_spanned_by(
            &block.generics,
            "#[logged] does not take generic structures",
        );
    }
    let self_ident = match &*block.self_ty {
        syn::Type::Path(path) if path.qself.is_none() => {
            path.path.segments.last().map(|s| s.ident.clone())
        }
        _ => None,
    };
    let Some(self_ident) = self_ident else {
        cx.error_spanned_by(&block.self_ty, "#[logged] needs a named structure type");
        let err = cx.check().err();
        let err = err.map(|e| e.to_compile_error());
        return quote!(#block #err);
    };
    let methods = methods(&cx, &block);
    if methods.is_empty() {
        cx.error_spanned_by(
            &block.self_ty,
            "#[logged] found no `pub fn ...(&mut self, ...)` method to log",
        );
    }
    let krate = crate::crate_path::resolve(&cx, args.krate.as_ref());
    if let Err(err) = cx.check() {
        let err = err.to_compile_error();
        return quote!(#block #err);
    }
    let generated = generate(&block.self_ty, &self_ident, &methods, &krate, args.snapshot);
    quote! {
        #block
        #generated
    }
}

fn generate(
    self_ty: &syn::Type,
    self_ident: &syn::Ident,
    methods: &[Method],
    krate: &syn::Path,
    snapshot: bool,
) -> TokenStream {
    let op = format_ident!("{}Op", self_ident);
    let output = format_ident!("{}Output", self_ident);
    let variants = methods.iter().map(|m| {
        let v = variant(m);
        let fields = m.args.iter().map(|(name, ty)| quote!(#name: #ty));
        quote!(#v { #(#fields),* })
    });
    let outputs = methods.iter().map(|m| {
        let v = variant(m);
        let ty = &m.output;
        quote!(#v(#ty))
    });
    let apply_arms = methods.iter().map(|m| {
        let v = variant(m);
        let name = &m.name;
        let names: Vec<_> = m.args.iter().map(|(name, _)| name).collect();
        quote!(#op::#v { #(#names),* } => #output::#v(self.#name(#(#names),*)))
    });
    let snapshot_fns = snapshot.then(|| quote!(#krate::collections::serde_snapshots!();));
    let op_doc = format!(
        "The logged calls of `{self_ident}`: one variant per `pub fn (&mut self, ..)` method."
    );
    let output_doc = format!("What a logged call of `{self_ident}` returns.");
    let codec = codec(self_ident, &op, methods, krate);
    let vis = visibility(methods);
    let handle_trait = handle_trait(self_ty, self_ident, methods, krate, &vis);
    quote! {
        #[doc = #op_doc]
        #[allow(missing_docs, clippy::large_enum_variant)]
        #vis enum #op { #(#variants),* }

        #[doc = #output_doc]
        #[allow(missing_docs)]
        #vis enum #output { #(#outputs),* }

        #codec

        impl #krate::collections::Replay for #self_ty {
            type Op = #op;
            type Output = #output;

            fn apply(&mut self, op: #op) -> #output {
                match op {
                    #(#apply_arms),*
                }
            }

            #snapshot_fns
        }

        #handle_trait
    }
}

/// The enum variant of `m`: its name in camel case.
fn variant(m: &Method) -> syn::Ident {
    format_ident!("{}", camel(&m.name.to_string()), span = m.name.span())
}

/// The `Codec` of the operation enum `op` of `self_ident`'s `methods`: a variant index, then
/// each argument behind its length; its id is the methods' and arguments' names and the
/// arguments' codec ids.
fn codec(
    self_ident: &syn::Ident,
    op: &syn::Ident,
    methods: &[Method],
    krate: &syn::Path,
) -> TokenStream {
    let type_name = self_ident.to_string();
    let encode_arms = methods.iter().enumerate().map(|(index, m)| {
        let v = variant(m);
        let index = index as u32;
        let names: Vec<_> = m.args.iter().map(|(name, _)| name).collect();
        quote! {
            #op::#v { #(#names),* } => {
                out.extend_from_slice(&#index.to_le_bytes());
                #( #krate::collections::logged::__private::encode_field(#names, out)?; )*
            }
        }
    });
    let decode_arms = methods.iter().enumerate().map(|(index, m)| {
        let v = variant(m);
        let index = index as u32;
        let names: Vec<_> = m.args.iter().map(|(name, _)| name).collect();
        let tys: Vec<_> = m.args.iter().map(|(_, ty)| ty).collect();
        quote! {
            #index => {
                #( let #names: #tys = #krate::collections::logged::__private::decode_field(&mut rest)?; )*
                #op::#v { #(#names),* }
            }
        }
    });
    let id_parts = methods.iter().map(|m| {
        let name = m.name.to_string();
        let arg_names: Vec<String> = m.args.iter().map(|(n, _)| n.to_string()).collect();
        let tys: Vec<_> = m.args.iter().map(|(_, ty)| ty).collect();
        quote! {
            print = print.str(#name);
            #( print = print.str(#arg_names).u64(<#tys as #krate::Codec>::codec_id()?); )*
        }
    });
    let const_id_parts = methods.iter().map(|m| {
        let name = m.name.to_string();
        let arg_names: Vec<String> = m.args.iter().map(|(n, _)| n.to_string()).collect();
        let tys: Vec<_> = m.args.iter().map(|(_, ty)| ty).collect();
        quote! {
            .str(#name)
            #( .str(#arg_names).u64(<#tys as #krate::Codec>::CODEC_ID) )*
        }
    });
    quote! {
        impl #krate::Codec for #op {
            const CODEC_ID: u64 = #krate::payload::Fingerprint::new()
                .str("montage-logged")
                .str(#type_name)
                #(#const_id_parts)*
                .finish();

            fn codec_id() -> #krate::Result<u64> {
                let mut print = #krate::payload::Fingerprint::new().str("montage-logged").str(#type_name);
                #(#id_parts)*
                ::core::result::Result::Ok(print.finish())
            }

            fn encode(&self, out: &mut ::std::vec::Vec<u8>) -> #krate::Result<()> {
                match self {
                    #(#encode_arms)*
                }
                ::core::result::Result::Ok(())
            }

            fn decode(bytes: &[u8]) -> ::core::option::Option<Self> {
                let (tag, mut rest) = bytes.split_at_checked(4)?;
                let tag = u32::from_le_bytes(tag.try_into().ok()?);
                let op = match tag {
                    #(#decode_arms)*
                    _ => return ::core::option::Option::None,
                };
                rest.is_empty().then_some(op)
            }
        }
    }
}

/// The trait `<T>Logged` of `self_ident`'s logged `methods`, and its impl for every handle
/// that logs `T`'s calls (`Logs<T>`: `Logged<T>`, a shard of `LoggedShards<T>`).
fn handle_trait(
    self_ty: &syn::Type,
    self_ident: &syn::Ident,
    methods: &[Method],
    krate: &syn::Path,
    vis: &syn::Visibility,
) -> TokenStream {
    let op = format_ident!("{}Op", self_ident);
    let output = format_ident!("{}Output", self_ident);
    let handle = format_ident!("{}Logged", self_ident);
    let handle_doc = format!(
        "`{self_ident}`'s logged methods on its handles: `Logged<{self_ident}>` and each shard of `LoggedShards<{self_ident}>`."
    );
    let handle_methods = methods.iter().map(|m| {
        let v = variant(m);
        let name = &m.name;
        let ty = &m.output;
        let args = m.args.iter().map(|(name, ty)| quote!(#name: #ty));
        let names: Vec<_> = m.args.iter().map(|(name, _)| name).collect();
        let doc =
            format!("Logs a call of `{self_ident}::{name}` and makes it (see `Logged::apply`).");
        quote! {
            #[doc = #doc]
            fn #name(&self, #(#args),*) -> #krate::Result<#ty> {
                match #krate::collections::logged::Logs::<#self_ty>::log(self, #op::#v { #(#names),* })? {
                    #output::#v(value) => ::core::result::Result::Ok(value),
                    #[allow(unreachable_patterns)]
                    _ => ::core::unreachable!("a logged call returned another method's output"),
                }
            }
        }
    });
    let handle_decls = methods.iter().map(|m| {
        let name = &m.name;
        let ty = &m.output;
        let args = m.args.iter().map(|(name, ty)| quote!(#name: #ty));
        let doc =
            format!("Logs a call of `{self_ident}::{name}` and makes it (see `Logged::apply`).");
        quote! {
            #[doc = #doc]
            ///
            /// # Errors
            ///
            /// What `Logged::apply` returns.
            fn #name(&self, #(#args),*) -> #krate::Result<#ty>;
        }
    });
    quote! {
        #[doc = #handle_doc]
        #vis trait #handle {
            #(#handle_decls)*
        }

        impl<H: #krate::collections::logged::Logs<#self_ty> + ?::core::marker::Sized> #handle for H {
            #(#handle_methods)*
        }
    }
}

/// `place_order` as `PlaceOrder`.
fn camel(name: &str) -> String {
    name.split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        })
        .collect()
}
