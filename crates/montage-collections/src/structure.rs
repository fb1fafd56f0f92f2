//! What every structure does the same way: find or create its name in the heap directory,
//! and rebuild from its payloads (checked to be of its payload type) in a parallel scan.

use std::sync::{Mutex, MutexGuard, PoisonError};

use montage_core::{Error, Heap, OwnerId, PBlock, Result, ScanFilter};

/// The type id of a payload of the structure kind `kind` whose parts are encoded by the
/// codecs with ids `codecs`: what every structure's payloads carry, and what
/// [`inspect`](crate::inspect) recognises.
pub(crate) fn type_id_of(kind: &str, codecs: &[u64]) -> u64 {
    codecs
        .iter()
        .fold(
            montage_core::payload::Fingerprint::new()
                .str("montage-collections")
                .str(kind),
            |print, &codec| print.u64(codec),
        )
        .finish()
}

/// The largest sequence number a structure hands out (2^62: a century of calls at a billion
/// a second). A recovered payload with a larger one is damaged, and the next number can
/// never overflow.
pub(crate) const SEQ_LIMIT: u64 = 1 << 62;

/// The little-endian word at byte `at` of `bytes`, if they reach that far.
pub(crate) fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// The sequence number a payload starts with (queue elements, log records, snapshot
/// chunks), if it has one no larger than [`SEQ_LIMIT`].
pub(crate) fn seq_prefix(bytes: &[u8]) -> Option<u64> {
    word_at(bytes, 0).filter(|&seq| seq <= SEQ_LIMIT)
}

/// Locks `mutex`. A poisoned lock only means a thread panicked while holding it; the
/// structures keep their DRAM state consistent at every step (payload work first, index
/// updates last), so the state is used as is.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Maps the errors that mean another operation changed or claimed the payload first
/// (`Retired`, or `InvalidBlock` for a version invalidated after its offset was read) to
/// [`Error::Aborted`], so the operation is rolled back and run again.
pub(crate) fn contended(err: Error) -> Error {
    match err {
        Error::Retired { .. } | Error::InvalidBlock { .. } => Error::Aborted,
        other => other,
    }
}

thread_local! {
    static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    static ENCODE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's encoding buffer (see [`with_buffer`], whose payload reads may
/// happen while an encoded entry is held).
pub(crate) fn with_encode_buffer<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    ENCODE.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut bytes) => f(&mut bytes),
        Err(_) => f(&mut Vec::new()),
    })
}

/// Runs `f` with this thread's payload buffer: one buffer per thread, rather than an
/// allocation per payload read. A nested call (a value's `Codec::decode` that reads a
/// structure) gets a buffer of its own.
pub(crate) fn with_buffer<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    BUFFER.with(|buffer| match buffer.try_borrow_mut() {
        Ok(mut bytes) => f(&mut bytes),
        Err(_) => f(&mut Vec::new()),
    })
}

/// Calls `visit` with every live payload of `owner` (its type id, block and bytes), on as
/// many threads as the machine has. A payload of a type not in `type_ids` (the structure
/// was written with other key, value or element types) is [`Error::LayoutMismatch`]
/// against the first of them.
pub(crate) fn scan_payloads(
    heap: &Heap,
    owner: OwnerId,
    type_ids: &[u64],
    type_name: &'static str,
    visit: impl Fn(u64, PBlock, &[u8]) -> Result<()> + Sync,
) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    heap.scan_payloads(
        ScanFilter::all().live().owner(owner),
        threads,
        |info, bytes| {
            if !type_ids.contains(&info.spec.type_id) {
                return Err(Error::LayoutMismatch {
                    type_name,
                    stored: info.spec.type_id,
                    compiled: type_ids.first().copied().unwrap_or(0),
                });
            }
            visit(info.spec.type_id, info.block, bytes)
        },
    )
}

/// An iterator over a structure read in `count` parts (stripes, buckets), each part read
/// by `read` in one operation when the iteration reaches it; an error is yielded once and
/// ends it.
pub(crate) fn parts<T>(
    count: usize,
    read: impl FnMut(usize) -> Result<Vec<T>>,
) -> impl Iterator<Item = Result<T>> {
    Parts {
        count,
        next: 0,
        buffer: Vec::new().into_iter(),
        read,
    }
}

struct Parts<T, F> {
    count: usize,
    next: usize,
    buffer: std::vec::IntoIter<T>,
    read: F,
}

impl<T, F: FnMut(usize) -> Result<Vec<T>>> Iterator for Parts<T, F> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        loop {
            if let Some(item) = self.buffer.next() {
                return Some(Ok(item));
            }
            if self.next >= self.count {
                return None;
            }
            let index = self.next;
            self.next += 1;
            match (self.read)(index) {
                Ok(items) => self.buffer = items.into_iter(),
                Err(err) => {
                    self.next = self.count;
                    return Some(Err(err));
                }
            }
        }
    }
}

/// Test support: runs `newer` on another thread after moving the clock past the epoch of an
/// operation begun here, then hands that older operation to `check` (and aborts it).
#[cfg(test)]
pub(crate) fn with_older_operation(
    heap: &Heap,
    newer: impl FnOnce() + Send,
    check: impl FnOnce(&montage_core::OpGuard<'_>),
) {
    let old = heap.begin_op().expect("begin_op");
    std::thread::scope(|s| {
        s.spawn(|| {
            heap.advance_epoch().expect("advance");
            newer();
        });
    });
    check(&old);
    old.abort().expect("abort");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nested_read_gets_a_buffer_of_its_own() {
        let lens = super::with_buffer(|outer| {
            outer.clear();
            outer.extend_from_slice(b"outer");
            let inner = super::with_buffer(|inner| {
                inner.extend_from_slice(b"in");
                inner.len()
            });
            (outer.len(), inner, outer.clone())
        });
        assert_eq!(lens, (5, 2, b"outer".to_vec()));
    }
}
