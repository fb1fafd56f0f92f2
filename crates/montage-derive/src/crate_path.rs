//! Where the generated code finds the runtime: `::montage` unless `#[payload(crate = "...")]`
//! says otherwise (for a renamed dependency, or `montage_core` used directly).

use quote::quote;

use crate::ctxt::Ctxt;

/// The path the expansion uses, made absolute so that a local module of the same name
/// cannot shadow it.
pub(crate) fn resolve(cx: &Ctxt, krate: Option<&syn::LitStr>) -> syn::Path {
    let Some(lit) = krate else {
        return syn::parse_quote!(::montage);
    };
    let mut path: syn::Path = match lit.parse() {
        Ok(path) => path,
        Err(err) => {
            cx.error_spanned_by(lit, format!("`crate` must be a path: {err}"));
            return syn::parse_quote!(::montage);
        }
    };
    let first = path.segments.first().map(|s| s.ident.to_string());
    match first.as_deref() {
        Some("Self") => {
            cx.error_spanned_by(lit, "`crate` cannot start with `Self`");
        }
        Some("crate" | "self" | "super") => {}
        _ if path.leading_colon.is_none() => {
            path.leading_colon = Some(syn::Token![::](lit.span()));
        }
        _ => {}
    }
    path
}

/// The path as the string zerocopy's `#[zerocopy(crate = "...")]` expects.
pub(crate) fn zerocopy_path(krate: &syn::Path) -> String {
    quote!(#krate::__private::zerocopy)
        .to_string()
        .replace(' ', "")
}
