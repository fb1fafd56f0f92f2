//! The file backend: a flush records the dirty pages of a range; a fence coalesces every
//! recorded range and writes them back with few `msync(MS_SYNC)` calls. A failed `msync`
//! poisons the heap, because after a failed write-back the kernel may drop the dirty pages and
//! a retried `msync` can then report success for data that never reached the disk.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};
use crate::heap::mapping::Mapping;
use crate::persist::PAGE_SIZE;

/// Dirty-page bookkeeping and the poison flag of one file heap.
#[derive(Debug, Default)]
pub(crate) struct MsyncState {
    /// Page-aligned `[start, end)` ranges flushed but not yet written back.
    dirty: Mutex<Vec<(u64, u64)>>,
    /// Held for the whole of a fence, so a fence that finds nothing left to do still waits
    /// until a concurrent fence that took its ranges has finished writing them back.
    syncing: Mutex<()>,
    poisoned: AtomicBool,
    /// Test hook: make the next `msync` fail as if the device had reported an error.
    #[cfg(test)]
    pub(crate) fail_next: AtomicBool,
}

impl MsyncState {
    /// Whether an earlier write-back failed.
    #[inline]
    pub(crate) fn is_poisoned(&self) -> bool {
        // ORDERING: Acquire pairs with the Release in `poison`, so a thread that sees the flag
        // also sees that the failure happened before its own write.
        self.poisoned.load(Ordering::Acquire)
    }

    fn poison(&self) {
        // ORDERING: pairs with the Acquire load in `is_poisoned`.
        self.poisoned.store(true, Ordering::Release);
    }

    /// Records that `[offset, offset + len)` must be written back at the next fence.
    pub(crate) fn record(&self, offset: u64, len: u64) -> Result<()> {
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        if len == 0 {
            return Ok(());
        }
        let start = offset - offset % PAGE_SIZE;
        let end = offset.saturating_add(len).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let mut dirty = self
            .dirty
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Coalesce with the last range cheaply; the fence sorts and merges the rest.
        if let Some(last) = dirty.last_mut()
            && start <= last.1
            && end >= last.0
        {
            last.0 = last.0.min(start);
            last.1 = last.1.max(end);
            return Ok(());
        }
        dirty.push((start, end));
        Ok(())
    }

    /// Writes back every recorded range.
    pub(crate) fn fence(&self, mapping: &Mapping) -> Result<()> {
        let _syncing = self
            .syncing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        let ranges = {
            let mut dirty = self
                .dirty
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::take(&mut *dirty)
        };
        for (start, end) in coalesce(ranges) {
            let result = self.write_back(mapping, start, end);
            if let Err(source) = result {
                self.poison();
                return Err(Error::WriteBack { source });
            }
        }
        Ok(())
    }

    fn write_back(&self, mapping: &Mapping, start: u64, end: u64) -> std::io::Result<()> {
        // ORDERING: a test hook; the test sets it before the fence on the same thread.
        #[cfg(test)]
        if self.fail_next.swap(false, Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        #[cfg(not(test))]
        let _ = self;
        let len = (end.min(mapping.len() as u64)).saturating_sub(start);
        mapping.msync(start as usize, len as usize)
    }
}

/// Sorts ranges and merges those that overlap or touch, so a fence issues one `msync` per
/// contiguous dirty run.
pub(crate) fn coalesce(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn coalesces_touching_and_overlapping_ranges() {
        let merged = coalesce(vec![(8192, 12288), (0, 4096), (4096, 8192), (20480, 24576)]);
        assert_eq!(merged, vec![(0, 12288), (20480, 24576)]);
    }

    proptest! {
        #[test]
        fn coalesced_ranges_cover_exactly_the_input(
            input in proptest::collection::vec((0u64..64, 1u64..8), 0..32)
        ) {
            let ranges: Vec<(u64, u64)> = input.iter().map(|&(s, l)| (s, s + l)).collect();
            let merged = coalesce(ranges.clone());
            for pair in merged.windows(2) {
                prop_assert!(pair[0].1 < pair[1].0, "ranges must be disjoint and not touching");
            }
            for point in 0u64..80 {
                let inside = ranges.iter().any(|&(s, e)| s <= point && point < e);
                let covered = merged.iter().any(|&(s, e)| s <= point && point < e);
                prop_assert_eq!(inside, covered);
            }
        }
    }
}
