//! The parallel block scan: reads the span table, splits the carved spans across threads, and
//! visits every block whose header is valid.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::alloc::block::BlockView;
use crate::alloc::read_header_and_meta;
use crate::alloc::size_class::{blocks_per_span, class_size};
use crate::base::layout::{Geometry, SPAN_SIZE, SpanEntry, block_capacity};
use crate::config::RecoveryProgress;
use crate::error::{Error, Result};
use crate::persist::Media;

/// One carved span (or large block) to scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A span carved into blocks of one class.
    Class { span: u64, class: u8 },
    /// A large block covering `extent` spans from `span`.
    Large { span: u64, extent: u64 },
}

impl Unit {
    pub(crate) fn blocks(self) -> u64 {
        match self {
            Unit::Class { class, .. } => blocks_per_span(class),
            Unit::Large { .. } => 1,
        }
    }
}

/// The span table as recovery reads it: the units to scan, and what a crash left in it
/// ahead of the durable heap on the journal (see [`read_span_table`]).
#[derive(Debug, Default)]
pub(crate) struct SpanTable {
    /// The carved spans and large blocks, in span order.
    pub(crate) units: Vec<Unit>,
    /// The first spans of large blocks whose entries run past the end of the heap: entries
    /// of a growth that was not durable, each scanned as a block of the spans the heap has.
    /// Nothing in one can be durable; recovery drops it.
    pub(crate) past_end: Vec<u64>,
    /// The offsets of entries that are not zero, of spans past the end of the heap whose
    /// entries lie in tables the heap has (the rest of the last group): stores of a growth
    /// that was not durable. Recovery zeroes them: a later growth takes those spans as free.
    pub(crate) beyond: Vec<u64>,
}

/// Reads and validates the span table. Fails with `Corrupted` on an entry that does not
/// decode or a large block that runs past the end of the heap or over another span's entry.
///
/// With `ahead` (the journal backend, where the heap file's pages may reach the disk before
/// the records that make their stores durable), a crash may leave the entries of a growth
/// that was not durable: the count the heap recovers is the old one (INV-GROW-1), but the
/// kernel wrote back the entries of spans carved past it, and of a large block that began
/// below the old end and runs past it. Those are not damage: a large block running past the
/// end is scanned over the spans the heap has and listed in [`SpanTable::past_end`], and
/// the entries past the end are listed in [`SpanTable::beyond`].
pub(crate) fn read_span_table(
    media: &Media,
    geometry: &Geometry,
    ahead: bool,
) -> Result<SpanTable> {
    let mut table = SpanTable::default();
    let mut span = 0;
    while span < geometry.span_count {
        if geometry.is_table_span(span) {
            span += 1;
            continue;
        }
        let offset = geometry.span_entry_offset(span);
        let word = media.load(offset)?;
        let corrupted = |what| Error::Corrupted { offset, what };
        match SpanEntry::decode(word, span, geometry.creation_id) {
            None => return Err(corrupted("span table entry fails its check")),
            Some(SpanEntry::Free) => span += 1,
            Some(SpanEntry::Class(class)) => {
                if usize::from(class) >= crate::alloc::size_class::NUM_CLASSES {
                    return Err(corrupted("span table entry names an unknown size class"));
                }
                table.units.push(Unit::Class { span, class });
                span += 1;
            }
            Some(SpanEntry::Large(extent)) => {
                let mut extent = u64::from(extent);
                if span + extent > geometry.span_count {
                    if !ahead {
                        return Err(corrupted("large block runs past the end of the heap"));
                    }
                    extent = geometry.span_count - span;
                    table.past_end.push(span);
                }
                if (span + 1..span + extent).any(|inner| geometry.is_table_span(inner)) {
                    return Err(corrupted("large block runs over a span table"));
                }
                for inner in span + 1..span + extent {
                    if media.load(geometry.span_entry_offset(inner))? != 0 {
                        return Err(corrupted("large block overlaps a carved span"));
                    }
                }
                table.units.push(Unit::Large { span, extent });
                span += extent;
            }
        }
    }
    if ahead {
        for span in geometry.span_count..geometry.entries_end() {
            let offset = geometry.span_entry_offset(span);
            if !geometry.is_table_span(span) && media.load(offset)? != 0 {
                table.beyond.push(offset);
            }
        }
    }
    Ok(table)
}

/// What one scan worker reports for one unit.
pub(crate) struct UnitVisit<'a> {
    pub(crate) unit: Unit,
    /// Per block start: the view if its header is valid.
    pub(crate) blocks: Vec<(u64, Option<BlockView<'a>>)>,
    /// The block starts whose meta word is not zero but whose header is not valid, with
    /// that meta word: torn by a crash, or damaged.
    pub(crate) invalid: Vec<(u64, u64)>,
}

/// How a scan runs.
#[derive(Clone, Copy)]
pub(crate) struct ScanOptions {
    /// Worker threads.
    pub(crate) threads: usize,
    /// Write back every header read (recovery, INV-REC-1).
    pub(crate) settle: bool,
}

impl ScanOptions {
    /// The options of a recovery pass: headers are written back as they are read.
    pub(crate) fn recovery(threads: usize) -> Self {
        ScanOptions {
            threads,
            settle: true,
        }
    }
}

/// How far the scans of one recovery (or one `Heap::scan`) have come: headers read, of
/// `total` that all its passes read, told to `report` after every chunk of spans.
pub(crate) struct Progress<'a> {
    read: AtomicU64,
    total: u64,
    report: Option<&'a (dyn Fn(RecoveryProgress) + Send + Sync)>,
}

impl<'a> Progress<'a> {
    /// Progress through `passes` scans of `units`, reported to `report`.
    pub(crate) fn new(
        units: &[Unit],
        passes: u64,
        report: Option<&'a (dyn Fn(RecoveryProgress) + Send + Sync)>,
    ) -> Self {
        Progress {
            read: AtomicU64::new(0),
            total: passes * units.iter().map(|unit| unit.blocks()).sum::<u64>(),
            report,
        }
    }

    /// Counts `headers` more read.
    fn add(&self, headers: u64) {
        // ORDERING: a monotonic counter for progress reports only.
        self.read.fetch_add(headers, Ordering::Relaxed);
    }

    /// Tells the callback, if there is one, how far the scans have come.
    fn report(&self) {
        if let Some(report) = self.report {
            report(RecoveryProgress {
                // ORDERING: as in `add`.
                read: self.read.load(Ordering::Relaxed),
                total: self.total,
            });
        }
    }
}

/// Visits every unit with `options.threads` workers. `work` gets each unit's block views and returns
/// a per-unit result; `per_worker` runs once at the end of each worker (for its fence). The
/// results come back in unit order.
pub(crate) fn scan<'m, R: Send>(
    media: &'m Media,
    geometry: &Geometry,
    units: &[Unit],
    options: ScanOptions,
    progress: &Progress<'_>,
    work: &(dyn Fn(UnitVisit<'m>) -> Result<R> + Sync),
    per_worker: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Vec<R>> {
    const CHUNK: usize = 16;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(units.len()));
    let creation_id = geometry.creation_id;
    let worker = || -> Result<()> {
        let mut local = Vec::new();
        loop {
            // ORDERING: the counter only partitions work; results travel through the mutex
            // and the scope's join.
            let start = next.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= units.len() {
                break;
            }
            for (index, unit) in units.iter().enumerate().skip(start).take(CHUNK) {
                let visit = visit_unit(media, geometry, creation_id, *unit, options.settle)?;
                local.push((index, work(visit)?));
                progress.add(unit.blocks());
            }
            progress.report();
        }
        per_worker()?;
        results
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(local);
        Ok(())
    };
    let threads = options.threads.clamp(1, units.len().div_ceil(CHUNK).max(1));
    if threads == 1 {
        worker()?;
    } else {
        std::thread::scope(|scope| -> Result<()> {
            let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
            for handle in handles {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            }
            Ok(())
        })?;
    }
    let mut results = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    results.sort_unstable_by_key(|(index, _)| *index);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

fn visit_unit<'m>(
    media: &'m Media,
    geometry: &Geometry,
    creation_id: u64,
    unit: Unit,
    settle: bool,
) -> Result<UnitVisit<'m>> {
    let read = |offset: u64, capacity: u64| -> Result<Option<BlockView<'m>>> {
        if settle {
            media.settle_header(offset)?;
        }
        let found = read_header_and_meta(media, creation_id, offset, capacity)?;
        Ok(found.map(|(info, meta)| BlockView::new(info, media, meta)))
    };
    let mut blocks = Vec::new();
    match unit {
        Unit::Class { span, class } => {
            let start = geometry.span_start(span);
            let size = class_size(class);
            for i in 0..blocks_per_span(class) {
                let offset = start + i * size;
                blocks.push((offset, read(offset, block_capacity(size))?));
            }
        }
        Unit::Large { span, extent } => {
            let offset = geometry.span_start(span);
            blocks.push((offset, read(offset, block_capacity(extent * SPAN_SIZE))?));
        }
    }
    // What made a block start no block: a zero meta word, or one over a header that is not
    // valid (the lines were just read).
    let mut invalid = Vec::new();
    for &(offset, _) in blocks.iter().filter(|(_, view)| view.is_none()) {
        let meta = media.load(offset)?;
        if meta != 0 {
            invalid.push((offset, meta));
        }
    }
    Ok(UnitVisit {
        unit,
        blocks,
        invalid,
    })
}
