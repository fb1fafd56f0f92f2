//! The struct's `#[repr]`: the layout must be fixed across builds, so `C` (optionally with
//! `align(N)`) or `transparent`; the default Rust layout and `packed` are rejected.

use proc_macro2::{Span, TokenStream};
use quote::quote;

use crate::ctxt::Ctxt;

/// The accepted representations, with what to copy onto the layout twin.
pub(crate) enum Repr {
    /// `#[repr(C)]` with an optional `align(N)`.
    C { align: Option<syn::LitInt> },
    /// `#[repr(transparent)]`.
    Transparent,
}

impl Repr {
    /// The `#[repr(...)]` attribute for the layout twin.
    pub(crate) fn attribute(&self) -> TokenStream {
        match self {
            Repr::C { align: None } => quote!(#[repr(C)]),
            Repr::C { align: Some(n) } => quote!(#[repr(C, align(#n))]),
            Repr::Transparent => quote!(#[repr(transparent)]),
        }
    }
}

/// Parses the `#[repr]` attributes; `None` (with errors recorded) if the layout is not fixed.
pub(crate) fn parse(cx: &Ctxt, attrs: &[syn::Attribute], name_span: Span) -> Option<Repr> {
    let mut c = false;
    let mut transparent = false;
    let mut align = None;
    let mut bad = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("C") {
                c = true;
            } else if meta.path.is_ident("transparent") {
                transparent = true;
            } else if meta.path.is_ident("align") {
                let content;
                syn::parenthesized!(content in meta.input);
                align = Some(content.parse::<syn::LitInt>()?);
            } else if meta.path.is_ident("packed") {
                bad = true;
                cx.error_spanned_by(
                    &meta.path,
                    "`packed` is not supported: payload fields are read and swapped as aligned \
                     words; add explicit padding fields instead",
                );
                if meta.input.peek(syn::token::Paren) {
                    let content;
                    syn::parenthesized!(content in meta.input);
                    let _: TokenStream = content.parse()?;
                }
            } else {
                bad = true;
                cx.error_spanned_by(
                    &meta.path,
                    "only `#[repr(C)]` (optionally with `align(N)`) or `#[repr(transparent)]` \
                     fix a payload's layout across builds",
                );
            }
            Ok(())
        });
        if let Err(err) = result {
            cx.syn_error(err);
            bad = true;
        }
    }
    if bad {
        return None;
    }
    match (c, transparent) {
        (true, false) => Some(Repr::C { align }),
        (false, true) if align.is_none() => Some(Repr::Transparent),
        (false, false) => {
            cx.syn_error(syn::Error::new(
                name_span,
                "a payload needs `#[repr(C)]`: the default Rust layout may change between \
                 builds, and a stored payload must be read back with the layout it was written in",
            ));
            None
        }
        _ => {
            cx.syn_error(syn::Error::new(
                name_span,
                "`#[repr(transparent)]` cannot be combined with `C` or `align`",
            ));
            None
        }
    }
}
