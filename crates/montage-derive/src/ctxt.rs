//! Collects every error found in one derive, so the user sees them all at once.

use std::cell::RefCell;

/// An error accumulator. It must be consumed with [`check`](Ctxt::check).
pub(crate) struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Ctxt {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records an error spanned on `tokens`.
    pub(crate) fn error_spanned_by(
        &self,
        tokens: impl quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.syn_error(syn::Error::new_spanned(tokens, message));
    }

    /// Records a parse error.
    pub(crate) fn syn_error(&self, error: syn::Error) {
        if let Some(errors) = self.errors.borrow_mut().as_mut() {
            errors.push(error);
        }
    }

    /// All errors combined into one, or `Ok` if there were none.
    pub(crate) fn check(self) -> Result<(), syn::Error> {
        let errors = self.errors.borrow_mut().take().unwrap_or_default();
        let mut iter = errors.into_iter();
        let Some(mut combined) = iter.next() else {
            return Ok(());
        };
        for error in iter {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        assert!(
            std::thread::panicking() || self.errors.borrow().is_none(),
            "Ctxt dropped without check()"
        );
    }
}
