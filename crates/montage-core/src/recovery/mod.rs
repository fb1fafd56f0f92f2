//! Recovery: after the superblock is validated, scan every carved span in parallel, ask the
//! caller's decision for each valid block, durably invalidate what is dropped, release spans
//! left empty, and rebuild the allocator's free lists from everything not kept.
//!
//! Which blocks survive is not decided here: the caller passes a [`Verdict`] function (the
//! epoch layer keeps blocks of epochs up to the durable cut). This module guarantees that
//!
//! * INV-REC-1: decisions are taken on the durable image: before scanning, everything the
//!   mapping holds is written back (a process crash can leave dirty lines or pages behind);
//! * INV-REC-2: every dropped block's header, and every released span's table entry, is
//!   durably zero before `open` returns, so a later crash cannot bring a dropped block back;
//! * INV-REC-3: recovery is idempotent: a second recovery of its result keeps the same
//!   blocks, and a crash part-way through it leaves a heap whose recovery gives the same
//!   result, because recovery only ever zeroes headers of dropped blocks and entries of
//!   spans with no kept block.

pub(crate) mod scan;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::alloc::FreeState;
use crate::error::Result;
use crate::heap::layout::Geometry;
use crate::persist::Media;
use scan::{Unit, UnitVisit};

pub use scan::BlockView;

/// What recovery does with one valid block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The block is live: it stays allocated.
    Keep,
    /// The block is garbage: its header is durably invalidated and its space freed.
    Drop,
}

/// What one recovery found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Spans carved into blocks (or holding a large block) when the heap was opened.
    pub spans_scanned: u64,
    /// Block positions whose headers were read.
    pub blocks_scanned: u64,
    /// Valid blocks kept.
    pub blocks_kept: u64,
    /// Valid blocks dropped by the decision function.
    pub blocks_dropped: u64,
    /// Spans given back to the free-span pool because nothing in them was kept.
    pub spans_released: u64,
    /// Whether the heap had been closed cleanly before this open.
    pub clean_shutdown: bool,
    /// Wall-clock time of the scan.
    pub duration: Duration,
}

struct UnitOutcome {
    unit: Unit,
    kept: u64,
    dropped: u64,
    free_blocks: Vec<u64>,
    released: bool,
}

/// Scans the heap, applies `decide`, and returns the allocator's free state.
pub(crate) fn recover(
    media: &Media,
    geometry: &Geometry,
    threads: usize,
    decide: &(dyn Fn(&BlockView<'_>) -> Verdict + Sync),
) -> Result<(FreeState, RecoveryReport)> {
    let started = std::time::Instant::now();
    let units = scan::read_span_table(media, geometry)?;
    let progress = AtomicU64::new(0);
    let work = |visit: UnitVisit<'_>| -> Result<UnitOutcome> {
        let mut outcome = UnitOutcome {
            unit: visit.unit,
            kept: 0,
            dropped: 0,
            free_blocks: Vec::new(),
            released: false,
        };
        for (offset, view) in visit.blocks {
            match view.map(|v| decide(&v)) {
                Some(Verdict::Keep) => outcome.kept += 1,
                Some(Verdict::Drop) => {
                    media.store(offset, 0)?;
                    // PERSIST: a dropped header is durably zero before open returns
                    // (INV-REC-2); the worker's closing fence completes it.
                    media.flush(offset, 8)?;
                    outcome.dropped += 1;
                    outcome.free_blocks.push(offset);
                }
                None => outcome.free_blocks.push(offset),
            }
        }
        if outcome.kept == 0 {
            let span = match visit.unit {
                Unit::Class { span, .. } | Unit::Large { span, .. } => span,
            };
            let entry = geometry.span_entry_offset(span);
            media.store(entry, 0)?;
            // PERSIST: the released span's entry is durably zero before the span can be
            // carved again (INV-SPAN-2); the worker's closing fence completes it.
            media.flush(entry, 8)?;
            outcome.released = true;
            outcome.free_blocks.clear();
        }
        Ok(outcome)
    };
    // PERSIST: each worker fences its own flushes (fences are per thread).
    let fence = || media.fence();
    let options = scan::ScanOptions {
        threads,
        settle: true,
    };
    let outcomes = scan::scan(media, geometry, &units, options, &progress, &work, &fence)?;

    let mut free = FreeState::new(geometry.span_count);
    let mut report = RecoveryReport {
        spans_scanned: units.len() as u64,
        blocks_scanned: progress.into_inner(),
        ..RecoveryReport::default()
    };
    let mut taken = vec![false; geometry.span_count as usize];
    for outcome in outcomes {
        report.blocks_kept += outcome.kept;
        report.blocks_dropped += outcome.dropped;
        let (span, extent) = match outcome.unit {
            Unit::Class { span, .. } => (span, 1),
            Unit::Large { span, extent } => (span, extent),
        };
        if outcome.released {
            report.spans_released += 1;
            continue;
        }
        for slot in taken.iter_mut().skip(span as usize).take(extent as usize) {
            *slot = true;
        }
        match outcome.unit {
            Unit::Class { span, class } => {
                free.mark_class(span, class);
                free.free_blocks[usize::from(class)].extend(outcome.free_blocks);
            }
            Unit::Large { span, extent } => free.mark_large(span, extent),
        }
    }
    free.free_spans = (0..geometry.span_count)
        .filter(|&span| !taken[span as usize])
        .collect();
    report.duration = started.elapsed();
    Ok((free, report))
}
