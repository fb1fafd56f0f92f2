//! A byte image held as shared, copy-on-write pages, with all-zero pages absent.
//!
//! The simulator keeps whole heap images (the durable image, a snapshot at the crash point,
//! every crash image it builds) and a test builds thousands of them. A heap under test is
//! mostly zero and a crash changes few of its pages, so an image that shares its pages costs
//! a vector of pointers to copy instead of the heap's size, and loading it into a fresh
//! mapping writes only the pages that hold something.

// Outside the simulator only the empty image of a new heap is ever built.
#![cfg_attr(not(any(test, feature = "sim")), allow(dead_code))]

use std::sync::Arc;

/// The size of one shared page.
const PAGE: usize = 4096;

/// A byte image of a fixed length; see the [module docs](self).
#[derive(Clone, Debug, Default)]
pub(crate) struct Pages {
    len: usize,
    /// Page `i` holds bytes `i * PAGE ..`; `None` is a page of zeros.
    pages: Vec<Option<Arc<[u8; PAGE]>>>,
}

impl Pages {
    /// An image of `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Pages {
        Pages {
            len,
            pages: vec![None; len.div_ceil(PAGE)],
        }
    }

    /// An image holding a copy of `bytes`.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Pages {
        let mut image = Pages::zeroed(bytes.len());
        image.write(0, bytes);
        image
    }

    /// Lengthens the image to `len` bytes of which the new ones are zero (a shorter `len`
    /// changes nothing).
    pub(crate) fn grow(&mut self, len: usize) {
        if len > self.len {
            self.len = len;
            self.pages.resize(len.div_ceil(PAGE), None);
        }
    }

    /// The image's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The whole image as one vector.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; self.len];
        for (offset, page) in self.present() {
            bytes[offset..offset + page.len()].copy_from_slice(page);
        }
        bytes
    }

    /// Copies `bytes` to `offset`. Returns `false`, writing nothing, if they do not fit.
    pub(crate) fn write(&mut self, offset: usize, bytes: &[u8]) -> bool {
        if !self.fits(offset, bytes.len()) {
            return false;
        }
        for (index, within, range) in pieces(offset, bytes.len()) {
            let piece = &bytes[range];
            let slot = &mut self.pages[index];
            if slot.is_none() && piece.iter().all(|&b| b == 0) {
                continue;
            }
            let page = slot.get_or_insert_with(|| Arc::new([0u8; PAGE]));
            Arc::make_mut(page)[within..within + piece.len()].copy_from_slice(piece);
        }
        true
    }

    /// Fills `buf` from `offset`. Returns `false`, reading nothing, if it does not fit.
    pub(crate) fn read(&self, offset: usize, buf: &mut [u8]) -> bool {
        if !self.fits(offset, buf.len()) {
            return false;
        }
        for (index, within, range) in pieces(offset, buf.len()) {
            let piece = &mut buf[range];
            match &self.pages[index] {
                Some(page) => piece.copy_from_slice(&page[within..within + piece.len()]),
                None => piece.fill(0),
            }
        }
        true
    }

    /// The pages that may hold a non-zero byte, as (offset, bytes), in order; the last is
    /// cut at the image's length.
    pub(crate) fn present(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.pages.iter().enumerate().filter_map(|(index, page)| {
            let offset = index * PAGE;
            let end = (offset + PAGE).min(self.len);
            page.as_ref().map(|page| (offset, &page[..end - offset]))
        })
    }

    fn fits(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }
}

/// Splits `len` bytes from `offset` at page boundaries: (page index, offset in the page,
/// range of the caller's buffer).
fn pieces(
    offset: usize,
    len: usize,
) -> impl Iterator<Item = (usize, usize, std::ops::Range<usize>)> {
    let mut done = 0;
    std::iter::from_fn(move || {
        if done == len {
            return None;
        }
        let at = offset + done;
        let within = at % PAGE;
        let take = (PAGE - within).min(len - done);
        let piece = (at / PAGE, within, done..done + take);
        done += take;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_across_pages_read_back_and_clones_do_not_share_later_writes() {
        let len = 3 * PAGE + 100;
        let mut plain = vec![0u8; len];
        let mut image = Pages::zeroed(len);
        let data: Vec<u8> = (0..PAGE + 300).map(|i| (i % 251) as u8 + 1).collect();
        for offset in [0, PAGE - 7, 2 * PAGE - 250, len - data.len()] {
            assert!(image.write(offset, &data));
            plain[offset..offset + data.len()].copy_from_slice(&data);
        }
        let before = image.clone();
        assert!(image.write(PAGE, &[0xAB; 16]));
        plain[PAGE..PAGE + 16].fill(0xAB);
        assert_eq!(image.to_vec(), plain);
        assert_ne!(before.to_vec(), plain, "the clone saw a later write");
        let mut buf = vec![0u8; 2 * PAGE];
        assert!(image.read(PAGE - 3, &mut buf));
        assert_eq!(buf, plain[PAGE - 3..3 * PAGE - 3]);
        assert_eq!(Pages::from_bytes(&plain).to_vec(), plain);
    }

    #[test]
    fn zero_pages_stay_absent_and_out_of_range_accesses_do_nothing() {
        let mut image = Pages::zeroed(2 * PAGE + 10);
        assert!(image.write(PAGE + 1, &[0u8; 64]));
        assert_eq!(image.present().count(), 0);
        assert!(image.write(2 * PAGE + 2, &[9u8; 8]));
        let present: Vec<(usize, usize)> = image.present().map(|(o, p)| (o, p.len())).collect();
        assert_eq!(present, vec![(2 * PAGE, 10)]);
        assert!(!image.write(2 * PAGE + 3, &[1u8; 8]));
        assert!(!image.write(usize::MAX, &[1u8]));
        let mut buf = [7u8; 8];
        assert!(!image.read(2 * PAGE + 3, &mut buf));
        assert_eq!(buf, [7u8; 8]);
        assert!(image.read(2 * PAGE + 2, &mut buf));
        assert_eq!(buf, [9u8; 8]);
        assert_eq!(Pages::from_bytes(&[0u8; 3 * PAGE]).present().count(), 0);
    }
}
