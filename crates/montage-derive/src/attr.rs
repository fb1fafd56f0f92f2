//! The `#[payload(...)]` attributes: `crate` and `rename` on the struct, `atomic` on fields.
//! Unknown and repeated keys are spanned errors.

use syn::spanned::Spanned;

use crate::ctxt::Ctxt;

/// Attribute keys, as typed constants so that a misspelling does not compile.
#[derive(Clone, Copy)]
struct Symbol(&'static str);

const PAYLOAD: Symbol = Symbol("payload");
const CRATE: Symbol = Symbol("crate");
const RENAME: Symbol = Symbol("rename");
const ATOMIC: Symbol = Symbol("atomic");

impl PartialEq<Symbol> for syn::Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

/// What the struct's `#[payload(...)]` attributes say.
#[derive(Default)]
pub(crate) struct ContainerAttrs {
    /// `crate = "path"`: where the facade is.
    pub(crate) krate: Option<syn::LitStr>,
    /// `rename = "Name"`: the registry name.
    pub(crate) rename: Option<syn::LitStr>,
}

/// What a field's `#[payload(...)]` attributes say.
#[derive(Default)]
pub(crate) struct FieldAttrs {
    /// `atomic`: generate `cas_<field>`.
    pub(crate) atomic: bool,
}

/// Parses the struct's attributes.
pub(crate) fn container(cx: &Ctxt, attrs: &[syn::Attribute]) -> ContainerAttrs {
    let mut out = ContainerAttrs::default();
    for attr in attrs.iter().filter(|a| a.path() == &PAYLOAD) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path == CRATE {
                let value: syn::LitStr = meta.value()?.parse()?;
                set_once(cx, &meta.path, &mut out.krate, value);
            } else if meta.path == RENAME {
                let value: syn::LitStr = meta.value()?.parse()?;
                if value.value().is_empty() {
                    cx.error_spanned_by(&value, "the registry name must not be empty");
                }
                set_once(cx, &meta.path, &mut out.rename, value);
            } else if meta.path == ATOMIC {
                cx.error_spanned_by(
                    &meta.path,
                    "`atomic` is not expected here; it applies to fields",
                );
            } else {
                cx.error_spanned_by(
                    &meta.path,
                    format!(
                        "unknown payload attribute `{}`; expected `crate` or `rename`",
                        path_name(&meta.path)
                    ),
                );
            }
            Ok(())
        });
        if let Err(err) = result {
            cx.syn_error(err);
        }
    }
    out
}

/// Parses a field's attributes.
pub(crate) fn field(cx: &Ctxt, attrs: &[syn::Attribute]) -> FieldAttrs {
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| a.path() == &PAYLOAD) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path == ATOMIC {
                if out.atomic {
                    cx.error_spanned_by(&meta.path, "duplicate payload attribute `atomic`");
                }
                out.atomic = true;
            } else if meta.path == CRATE || meta.path == RENAME {
                cx.error_spanned_by(
                    &meta.path,
                    format!(
                        "`{}` is not expected here; it applies to the struct",
                        path_name(&meta.path)
                    ),
                );
                // Consume the value so that parsing continues after it.
                let _: syn::LitStr = meta.value()?.parse()?;
            } else {
                cx.error_spanned_by(
                    &meta.path,
                    format!(
                        "unknown payload attribute `{}`; expected `atomic`",
                        path_name(&meta.path)
                    ),
                );
            }
            Ok(())
        });
        if let Err(err) = result {
            cx.syn_error(err);
        }
    }
    out
}

fn set_once<T>(cx: &Ctxt, key: &syn::Path, slot: &mut Option<T>, value: T) {
    if slot.is_some() {
        cx.syn_error(syn::Error::new(
            key.span(),
            format!("duplicate payload attribute `{}`", path_name(key)),
        ));
    } else {
        *slot = Some(value);
    }
}

fn path_name(path: &syn::Path) -> String {
    quote::quote!(#path).to_string().replace(' ', "")
}
