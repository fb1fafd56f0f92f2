//! Recovery: after the superblock is validated, scan every carved span in parallel, ask the
//! caller's decision for each valid block, durably invalidate what is dropped, release spans
//! left empty, and rebuild the allocator's free lists from everything not kept.
//!
//! Which blocks survive is not decided here: the caller passes a [`Verdict`] function (the
//! epoch layer keeps blocks of epochs up to the durable cut). This module guarantees that
//!
//! * INV-REC-1: decisions are taken on the durable image: before scanning, everything the
//!   mapping holds is written back (a process crash can leave dirty lines or pages behind);
//! * INV-REC-2: every dropped block's header, the meta word of every block start that holds
//!   no valid header but is not zero (a header torn by the crash), and every released span's
//!   table entry, are durably zero before `open` returns, so a later crash cannot bring a
//!   dropped block back. A torn header must be zeroed too: the block goes to the free lists,
//!   and when it is reused a crash can tear the new header again, keeping the old meta word
//!   and the old body words that the first crash did not keep and taking from the new
//!   header exactly the words that made the old one whole: a block of an epoch the crash
//!   had dropped, valid again (found by the epoch state machine test);
//! * INV-REC-3: recovery is idempotent: a second recovery of its result keeps the same
//!   blocks, and a crash part-way through it leaves a heap whose recovery gives the same
//!   result, because recovery only ever zeroes headers of dropped or torn blocks and entries
//!   of spans with no kept block.

pub(crate) mod scan;
mod winners;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::alloc::block::{BlockInfo, BlockKind, BlockView, PBlock};
use crate::alloc::{Allocator, FreeState, clear_meta};
use crate::base::epoch::Epoch;
use crate::base::layout::{
    DIRECTORY, DIRECTORY_CAPACITY, EPOCH_OFFSET, Geometry, META_RETIRED, UID_LIMIT,
};
use crate::config::RecoveryProgress;
use crate::error::{Error, Result};
use crate::meta::structure_name;
use crate::persist::Media;
use scan::{Unit, UnitVisit};

/// What recovery does with one valid block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The block is live: it stays allocated.
    Keep,
    /// The block is garbage: its header is durably invalidated and its space freed.
    Drop,
}

/// A block that recovery left out of the heap's state (with
/// [`HeapConfig::quarantine_damaged`](crate::HeapConfig::quarantine_damaged)): it stays on
/// the media as it was, and is neither read as data nor reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// The block's offset.
    pub offset: u64,
    /// The structure it belongs to, as the directory names it (`None` if its header names
    /// none; a damaged header may name the wrong one).
    pub structure: Option<String>,
    /// Why it was left out.
    pub why: QuarantineReason,
}

/// Why a block was quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// Its header fails its checksum, and a crash could not have torn it.
    DamagedHeader,
    /// It is the durable version of its payload, and the payload fails its checksum.
    DamagedPayload,
    /// Another version of a payload whose damaged version is quarantined: recovery cannot
    /// tell whether this one is current, so it does not return it.
    SameUid,
}

/// One thing a repair ([`HeapConfig::repair`](crate::HeapConfig::repair)) found damaged and
/// did about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// Where in the heap file (for a journal: 0).
    pub offset: u64,
    /// What was wrong and what was done, in a sentence.
    pub what: String,
}

/// What one recovery found and did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Spans carved into blocks (or holding a large block) when the heap was opened.
    pub spans_scanned: u64,
    /// Block positions in carved spans (each header is read once per recovery pass).
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
    /// Journal records replayed before the scan (journal backend).
    pub journal_records: u64,
    /// Heap bytes those records rewrote.
    pub journal_bytes: u64,
    /// The blocks left out because they are damaged, or are versions of a damaged payload,
    /// by offset (only with
    /// [`HeapConfig::quarantine_damaged`](crate::HeapConfig::quarantine_damaged); without
    /// it a damaged block fails the open).
    pub quarantined: Vec<Quarantined>,
    /// With [`HeapConfig::repair`](crate::HeapConfig::repair): what was repaired before
    /// the scan, in order.
    pub repairs: Vec<Repair>,
    /// With [`HeapConfig::repair`](crate::HeapConfig::repair): the blocks that
    /// [`quarantined`](Self::quarantined) would list, dropped instead (durably invalidated
    /// and freed): what the repair lost, by structure.
    pub dropped_damaged: Vec<Quarantined>,
}

impl RecoveryReport {
    /// The quarantined blocks of the structure named `structure`: what it lost.
    pub fn quarantined_in<'a>(
        &'a self,
        structure: &'a str,
    ) -> impl Iterator<Item = &'a Quarantined> + 'a {
        self.quarantined
            .iter()
            .filter(move |q| q.structure.as_deref() == Some(structure))
    }

    /// Whether the block at `offset` was quarantined.
    pub(crate) fn is_quarantined(&self, offset: u64) -> bool {
        !self.quarantined.is_empty()
            && self
                .quarantined
                .binary_search_by_key(&offset, |q| q.offset)
                .is_ok()
    }
}

/// How a recovery runs.
#[derive(Clone, Copy)]
pub(crate) struct Options<'a> {
    /// Worker threads.
    pub(crate) threads: usize,
    /// Called now and then with how far the scan has come.
    pub(crate) progress: Option<&'a (dyn Fn(RecoveryProgress) + Send + Sync)>,
    /// Leave damaged blocks out instead of failing ([`Quarantined`]).
    pub(crate) quarantine: bool,
    /// Drop the blocks quarantine would leave: invalidate them durably and free them.
    pub(crate) repair: bool,
}

/// What a recovery hands to the heap it opens.
pub(crate) struct Recovered {
    pub(crate) free: FreeState,
    pub(crate) report: RecoveryReport,
    /// The largest uid of any valid header seen (0 if none).
    pub(crate) max_uid: u64,
    /// Kept anti-blocks: their victims are durably invalid now, so they can be released.
    pub(crate) antis: Vec<PBlock>,
    /// Blocks left as they were (quarantined), with the owner id of their valid header.
    pub(crate) left: Vec<(u64, u32)>,
}

/// What the heap's metadata says, for the epoch rule to check against the blocks before it
/// changes anything.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stored {
    /// The stored epoch word.
    pub(crate) word: Epoch,
    /// The clean-shutdown flag.
    pub(crate) clean: bool,
    /// Whether the word is durable before any block of its epoch can be written, so no
    /// block can be newer than it: true on persistent memory, false on the journal, where
    /// the heap file's pages may reach the disk before the journal record that seals their
    /// epoch does.
    pub(crate) word_leads: bool,
    /// The owner ids the directory lists, as a bit set (bit `n` for owner `n`; bit 0, no
    /// owner, always set).
    pub(crate) owners: u128,
}

impl Stored {
    /// Checks a valid block's epoch against the word: a block newer than the word where
    /// the word leads the blocks, or newer than the cut after a clean close (which syncs
    /// until every block is two epochs behind), means the word cannot be the clock these
    /// blocks were written under.
    pub(crate) fn check_block_epoch(&self, epoch: Epoch) -> Result<()> {
        let word_error = |what| Error::Corrupted {
            offset: EPOCH_OFFSET,
            what,
        };
        if self.word_leads && epoch > self.word {
            return Err(word_error(
                "the epoch word is older than a block written under it",
            ));
        }
        if self.clean && epoch > self.word.durable_cut() {
            return Err(word_error(
                "the heap was closed cleanly, but its epoch word does not cover its newest block",
            ));
        }
        Ok(())
    }

    /// Whether a block start whose meta word is `meta` but whose header is not valid can be
    /// a header the crash interrupted (INV-HDR-2): only a header written in an epoch that
    /// is not durable can be torn, and its meta word, one aligned word, is always whole and
    /// names that epoch's low bits. After a clean close no such epoch exists. Anything
    /// else, a meta word the allocator never writes or one of a durable epoch, is damage.
    pub(crate) fn may_be_torn(&self, meta: u64) -> bool {
        if self.clean {
            return false;
        }
        let Some(bits) = crate::base::layout::meta_epoch_bits(meta) else {
            return false;
        };
        // The newest epoch any header can have been written in.
        let newest = if self.word_leads {
            self.word
        } else {
            self.word.plus(Epoch::JOURNAL_LEAD)
        };
        crate::base::layout::epoch_bits_in(bits, self.word.durable_cut().get(), newest.get())
    }
}

/// Checks what a valid header says against what a heap ever writes. Its checksum matches,
/// so this is damage that kept the checksum (or a forgery), and recovery must not build on
/// it: a uid past [`UID_LIMIT`] would make the uid counter wrap, an owner past the
/// directory would name a structure that cannot exist.
pub(crate) fn check_header(info: &BlockInfo) -> Result<()> {
    let offset = info.block.offset();
    if info.spec.uid > UID_LIMIT {
        return Err(Error::Corrupted {
            offset,
            what: "a block's uid is beyond any uid a heap hands out",
        });
    }
    if info.spec.owner.get() as usize > DIRECTORY_CAPACITY {
        return Err(Error::Corrupted {
            offset,
            what: "a block names an owner the directory cannot hold",
        });
    }
    Ok(())
}

struct UnitOutcome {
    unit: Unit,
    kept: u64,
    dropped: u64,
    free_blocks: Vec<u64>,
    /// Blocks left as they are (quarantined): (offset, owner id of a valid header, else 0).
    left: Vec<(u64, u32)>,
    released: bool,
}

/// What recovery's error says when blocks name an owner the directory does not list (the
/// offset is that owner's directory entry).
pub(crate) const ORPHANS: &str = "payloads belong to a structure the directory does not list";

/// Recovers with the epoch rule: with `word` the stored epoch, the newest version of each
/// uid among the blocks of epochs `<= word - 2` wins; the rest is dropped. Winning
/// anti-blocks are kept through the scan (so the versions they shadow are durably
/// invalidated first) and returned for release.
///
/// Before anything is changed, the first pass checks the blocks against `stored` (see
/// [`winners::choose`]) and against the directory (`names`, by slot): a block whose owner has
/// no directory entry means the entry was lost, and its owner id must not be handed to a new
/// structure. It also verifies the payload checksum of every block of the durable epochs:
/// a winner that fails it is [`Error::DamagedPayload`], naming its structure.
pub(crate) fn recover_epochs(
    media: &Media,
    geometry: &Geometry,
    options: Options<'_>,
    stored: Stored,
    names: &[Option<String>],
) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let table = scan::read_span_table(media, geometry, !stored.word_leads)?;
    // Two passes read every header: the winners, then what to keep.
    let progress = scan::Progress::new(&table.units, 2, options.progress);
    let winners = winners::choose(media, geometry, &table.units, options, &progress, stored)?;
    // A large block whose entry runs past the end of the heap belongs to a growth that was
    // not durable, so no version in it can be (INV-GROW-1): one the epoch rule would keep
    // is damage, found before anything is written (INV-REC-4).
    if let Some(&span) = table
        .past_end
        .iter()
        .find(|&&span| winners.contains(PBlock(geometry.span_start(span))))
    {
        return Err(Error::Corrupted {
            offset: geometry.span_entry_offset(span),
            what: "large block runs past the end of the heap",
        });
    }
    let orphans = winners.owners() & !stored.owners;
    if orphans != 0 {
        let owner = u64::from(orphans.trailing_zeros());
        return Err(Error::Corrupted {
            offset: DIRECTORY.offset(owner - 1),
            what: ORPHANS,
        });
    }
    // A durable payload that fails its checksum is never handed out as data (INV-SUM-1),
    // and a durable header that fails its own is never taken for free space (INV-HDR-2).
    let mut damaged: Vec<_> = winners.damaged().collect();
    damaged.sort_unstable_by_key(|d| d.offset);
    let name = |owner: u32| structure_name(names, owner);
    if let Some(first) = damaged
        .first()
        .filter(|_| !options.quarantine && !options.repair)
    {
        let structure = name(first.owner).unwrap_or_else(|| "-".to_owned());
        let offset = first.offset;
        return Err(match first.why {
            QuarantineReason::DamagedHeader => Error::DamagedHeader { offset, structure },
            _ => Error::DamagedPayload { offset, structure },
        });
    }
    // Quarantine: the damaged blocks, and every version of the payloads they name, are
    // left as they are (a stale version must not stand in for a damaged newer one).
    let offsets: Vec<u64> = damaged.iter().map(|d| d.offset).collect();
    let mut uids: Vec<u64> = damaged
        .iter()
        .map(|d| d.uid)
        .filter(|&uid| uid <= UID_LIMIT)
        .collect();
    uids.sort_unstable();
    uids.dedup();
    let leave = |offset: u64, view: Option<&BlockView<'_>>| {
        offsets.binary_search(&offset).is_ok()
            || view.is_some_and(|v| uids.binary_search(&v.info().spec.uid).is_ok())
    };
    let antis = Mutex::new(Vec::new());
    let decide = |view: &BlockView<'_>| {
        let info = view.info();
        if !winners.contains(info.block) {
            return Verdict::Drop;
        }
        if info.spec.kind == BlockKind::Delete {
            antis
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(info.block);
        }
        Verdict::Keep
    };
    let mut recovered = recover_units(
        media,
        geometry,
        &table,
        options,
        &progress,
        &decide,
        FirstPass::Done((!damaged.is_empty()).then_some(&leave)),
    )?;
    recovered.antis = antis
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A quarantined header's uid stays taken, so that no new payload is taken for one of
    // its versions at the next open.
    recovered.max_uid = winners.max_uid().max(uids.last().copied().unwrap_or(0));
    let report = &mut recovered.report;
    for d in &damaged {
        report.quarantined.push(Quarantined {
            offset: d.offset,
            structure: name(d.owner),
            why: d.why,
        });
    }
    for &(offset, owner) in &recovered.left {
        if offsets.binary_search(&offset).is_err() {
            report.quarantined.push(Quarantined {
                offset,
                structure: name(owner),
                why: QuarantineReason::SameUid,
            });
        }
    }
    report.quarantined.sort_unstable_by_key(|q| q.offset);
    if options.repair {
        report.dropped_damaged = std::mem::take(&mut report.quarantined);
    }
    recovered.report.duration = started.elapsed();
    Ok(recovered)
}

/// Scans the heap, applies `decide`, and returns the allocator's free state.
pub(crate) fn recover(
    media: &Media,
    geometry: &Geometry,
    options: Options<'_>,
    decide: &(dyn Fn(&BlockView<'_>) -> Verdict + Sync),
    ahead: bool,
) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let table = scan::read_span_table(media, geometry, ahead)?;
    let progress = scan::Progress::new(&table.units, 1, options.progress);
    let mut recovered = recover_units(
        media,
        geometry,
        &table,
        options,
        &progress,
        decide,
        FirstPass::None,
    )?;
    recovered.report.duration = started.elapsed();
    Ok(recovered)
}

/// Which blocks the second pass leaves as they are (quarantined): offset and view (if the
/// header is valid).
type Leave<'a> = &'a (dyn Fn(u64, Option<&BlockView<'_>>) -> bool + Sync);

/// Whether a read-only first pass has checked every valid header ([`check_header`]) and
/// found the largest uid already, and if so, what it quarantined.
#[derive(Clone, Copy)]
enum FirstPass<'a> {
    /// With what to quarantine, if anything.
    Done(Option<Leave<'a>>),
    None,
}

fn recover_units(
    media: &Media,
    geometry: &Geometry,
    table: &scan::SpanTable,
    options: Options<'_>,
    progress: &scan::Progress<'_>,
    decide: &(dyn Fn(&BlockView<'_>) -> Verdict + Sync),
    first_pass: FirstPass<'_>,
) -> Result<Recovered> {
    let units = &table.units;
    // Entries a growth that was not durable left past the end of the heap are durably zero
    // before open returns: a later growth hands those spans out as free (INV-GROW-1).
    Allocator::clear_words(media, table.beyond.iter().copied())?;
    let max_uid = AtomicU64::new(0);
    let work = |visit: UnitVisit<'_>| -> Result<UnitOutcome> {
        // A large block of a growth that was not durable: nothing in it is kept (the epoch
        // rule's winners were checked for it already; another policy's verdict is not asked).
        let past_end = match visit.unit {
            Unit::Large { span, .. } => table.past_end.binary_search(&span).is_ok(),
            Unit::Class { .. } => false,
        };
        let mut outcome = UnitOutcome {
            unit: visit.unit,
            kept: 0,
            dropped: 0,
            free_blocks: Vec::new(),
            left: Vec::new(),
            released: false,
        };
        for (offset, view) in visit.blocks {
            if let FirstPass::Done(Some(leave)) = first_pass
                && leave(offset, view.as_ref())
            {
                let owner = view.as_ref().map_or(0, |v| v.info().spec.owner.get());
                outcome.left.push((offset, owner));
                if options.repair {
                    // Dropped as a torn block is (INV-REC-2): durably zero, then free.
                    // PERSIST: the worker's closing fence completes it.
                    clear_meta(media, offset)?;
                    outcome.free_blocks.push(offset);
                }
                continue;
            }
            if let Some(v) = view
                .as_ref()
                .filter(|_| matches!(first_pass, FirstPass::None))
            {
                check_header(v.info())?;
                // ORDERING: a maximum read after the scope joins.
                max_uid.fetch_max(v.info().spec.uid, Ordering::Relaxed);
            }
            match view
                .as_ref()
                .map(|v| if past_end { Verdict::Drop } else { decide(v) })
            {
                Some(Verdict::Keep) => {
                    // A kept version may carry the retired bit of an operation the crash
                    // undid: it is live again (INV-EP-3).
                    let meta = media.load(offset)?;
                    if meta & META_RETIRED != 0 {
                        media.store(offset, meta & !META_RETIRED)?;
                    }
                    outcome.kept += 1;
                }
                // A dropped header, and a torn one (no valid header, meta word not zero),
                // are durably zero before open returns and before the block can be reused
                // (INV-REC-2, INV-ALLOC-1).
                Some(Verdict::Drop) | None => {
                    // PERSIST: the worker's closing fence completes it.
                    clear_meta(media, offset)?;
                    if view.is_some() {
                        outcome.dropped += 1;
                    }
                    outcome.free_blocks.push(offset);
                }
            }
        }
        if outcome.kept == 0 && (options.repair || outcome.left.is_empty()) {
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
    let outcomes = scan::scan(
        media,
        geometry,
        units,
        scan::ScanOptions::recovery(options.threads),
        progress,
        &work,
        &fence,
    )?;
    Ok(gather(geometry, units, outcomes, max_uid.into_inner()))
}

/// The free state and the report from every unit's outcome.
fn gather(
    geometry: &Geometry,
    units: &[Unit],
    outcomes: Vec<UnitOutcome>,
    max_uid: u64,
) -> Recovered {
    let mut free = FreeState::new(geometry.span_count);
    let mut report = RecoveryReport {
        spans_scanned: units.len() as u64,
        blocks_scanned: units.iter().map(|unit| unit.blocks()).sum(),
        ..RecoveryReport::default()
    };
    let mut taken = vec![false; geometry.span_count as usize];
    let mut left = Vec::new();
    for outcome in outcomes {
        left.extend(outcome.left);
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
    for span in (0..geometry.span_count).filter(|&span| geometry.is_table_span(span)) {
        free.mark_table(span);
    }
    free.free_spans = (0..geometry.span_count)
        .filter(|&span| !taken[span as usize] && !geometry.is_table_span(span))
        .collect();
    Recovered {
        free,
        report,
        max_uid,
        antis: Vec::new(),
        left,
    }
}

#[cfg(test)]
mod tests {
    use crate::base::layout::{SPAN_SIZE, SpanEntry};
    use crate::sim::SimMode;
    use crate::{Error, Heap, HeapConfig};

    /// What a growth that was not durable can leave in a journal heap's span table, once
    /// the kernel has written the heap file's pages ahead of the journal: the entry of a
    /// large block that begins below the end of the heap the crash kept and runs past it,
    /// and the entry of a span carved past that end. Open takes the first for a block that
    /// was never durable and the second for a span that is not the heap's, and zeroes both;
    /// a heap whose stores are durable in order (persistent memory) refuses the same large
    /// entry as damage, as before.
    #[test]
    fn a_growth_that_was_not_durable_leaves_nothing_in_the_span_table_of_a_journal_heap() {
        for (mode, ahead) in [(SimMode::File, true), (SimMode::Prefix, false)] {
            let config = HeapConfig::simulated(8 * SPAN_SIZE, mode).max_size(32 * SPAN_SIZE);
            let heap = Heap::create(&config).unwrap();
            let owner = heap.register("t").unwrap();
            let block = heap.run_op(|op| op.alloc(owner, 1, b"durable")).unwrap();
            heap.sync().unwrap();
            let geometry = heap.shared().runtime.alloc.geometry();
            let image = heap.simulator().unwrap().durable();
            drop(heap);
            let count = geometry.span_count;
            // The last free span, as the image recovers (on the journal its entries may be
            // in the journal's records, not yet in the heap's bytes).
            let free = {
                let heap = Heap::open_image(image.clone(), &config).unwrap();
                let media = heap.media();
                (0..count)
                    .rev()
                    .find(|&span| {
                        !geometry.is_table_span(span)
                            && media.load(geometry.span_entry_offset(span)).unwrap() == 0
                    })
                    .expect("a free span at the end of the heap")
            };
            let large = geometry.span_entry_offset(free);
            let beyond = geometry.span_entry_offset(count);
            assert!(
                count < geometry.entries_end(),
                "no entry past the end to test"
            );
            let id = geometry.creation_id;
            let image = image
                .with_word(
                    large,
                    SpanEntry::Large(u32::try_from(count + 2 - free).unwrap()).encode(free, id),
                )
                .with_word(beyond, SpanEntry::Class(0).encode(count, id));
            let opened = Heap::open_image(image, &config);
            if !ahead {
                assert!(
                    matches!(opened, Err(Error::Corrupted { offset, .. }) if offset == large),
                    "{mode:?}: {opened:?}"
                );
                continue;
            }
            let heap = opened.unwrap();
            let media = heap.media();
            assert_eq!(media.load(large).unwrap(), 0, "the large block's entry");
            assert_eq!(media.load(beyond).unwrap(), 0, "the entry past the end");
            assert_eq!(heap.size(), geometry.len_with(count).unwrap());
            assert_eq!(heap.run_op(|op| op.read(block)).unwrap(), b"durable");
            // The spans are free: the heap fills them and grows into the rest.
            let spans = heap.stats().free_spans;
            assert!(spans >= 1, "{spans} free spans");
        }
    }

    /// A large block the epoch rule keeps cannot be in a growth that was not durable: its
    /// entry running past the end of the heap is damage, on the journal too, and open
    /// refuses the heap before it writes anything.
    #[test]
    fn a_durable_large_block_whose_entry_runs_past_the_end_is_damage() {
        let config = HeapConfig::simulated(8 * SPAN_SIZE, SimMode::File).max_size(32 * SPAN_SIZE);
        let heap = Heap::create(&config).unwrap();
        let owner = heap.register("t").unwrap();
        let payload = vec![7u8; usize::try_from(SPAN_SIZE).unwrap()];
        let block = heap.run_op(|op| op.alloc(owner, 1, &payload)).unwrap();
        let geometry = heap.shared().runtime.alloc.geometry();
        let sim = heap.simulator().unwrap();
        // A clean close writes everything into the heap's bytes (the journal's checkpoint).
        heap.close().unwrap();
        let image = sim.durable();
        let span = (block.offset() - geometry.data_offset) / SPAN_SIZE;
        let entry = geometry.span_entry_offset(span);
        let extent = u32::try_from(geometry.span_count + 1 - span).unwrap();
        assert!(
            ((span + 2)..geometry.span_count)
                .all(|s| image.word_at(geometry.span_entry_offset(s)) == 0),
            "the spans after the block are free"
        );
        let image = image.with_word(
            entry,
            SpanEntry::Large(extent).encode(span, geometry.creation_id),
        );
        let opened = Heap::open_image(image, &config);
        assert!(
            matches!(opened, Err(Error::Corrupted { offset, .. }) if offset == entry),
            "{opened:?}"
        );
    }
}
