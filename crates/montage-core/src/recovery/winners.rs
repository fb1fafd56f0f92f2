//! The epoch rule's first pass: which block is the newest durable version of each uid.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc::block::{BlockKind, PBlock};
use crate::alloc::payload_intact;
use crate::base::layout::{Geometry, LEN_WORD_OFFSET, UID_OFFSET};
use crate::error::Result;
use crate::persist::Media;

use super::scan::{self, Unit, UnitVisit};
use super::{Options, QuarantineReason, Stored};

/// The winning blocks, as a bitmap over 64-byte block positions of the data area.
pub(super) struct Winners {
    data_offset: u64,
    bits: Vec<AtomicU64>,
    max_uid: u64,
    owners: u128,
    /// Blocks of the durable epochs whose payload fails its checksum, and block starts
    /// whose header is damaged.
    damaged: Vec<Damaged>,
}

/// A damaged block: where, the owner id and uid its header names (as far as a damaged
/// header can be believed), and which part failed (`DamagedHeader` or `DamagedPayload`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Damaged {
    pub(super) offset: u64,
    pub(super) owner: u32,
    pub(super) why: QuarantineReason,
    pub(super) uid: u64,
}

impl Winners {
    /// Whether `block` is the newest durable version of its uid.
    pub(super) fn contains(&self, block: PBlock) -> bool {
        let Some(index) = block.offset().checked_sub(self.data_offset).map(|d| d / 64) else {
            return false;
        };
        self.bits.get((index / 64) as usize).is_some_and(|word| {
            // ORDERING: written before the scope that filled it joined.
            word.load(Ordering::Relaxed) & (1 << (index % 64)) != 0
        })
    }

    /// The largest uid of any valid header.
    pub(super) fn max_uid(&self) -> u64 {
        self.max_uid
    }

    /// The owner ids of all valid headers, as a bit set (bit `n` for owner `n`).
    pub(super) fn owners(&self) -> u128 {
        self.owners
    }

    /// The damaged blocks recovery must not build on, by offset: every damaged header, and
    /// every winner whose payload fails its checksum (a damaged version that a newer one
    /// supersedes is never read again).
    pub(super) fn damaged(&self) -> impl Iterator<Item = Damaged> + '_ {
        self.damaged.iter().copied().filter(|d| {
            d.why == QuarantineReason::DamagedHeader || self.contains(PBlock::from_offset(d.offset))
        })
    }

    fn insert(&self, offset: u64) {
        let index = (offset - self.data_offset) / 64;
        if let Some(word) = self.bits.get((index / 64) as usize) {
            // ORDERING: read after the scope joins.
            word.fetch_or(1 << (index % 64), Ordering::Relaxed);
        }
    }
}

/// Adds to `damaged` the block starts of `invalid` (offset, meta word) whose header cannot
/// be one the crash tore.
fn damaged_headers(
    media: &Media,
    stored: Stored,
    invalid: &[(u64, u64)],
    damaged: &mut Vec<Damaged>,
) -> Result<()> {
    for &(offset, meta) in invalid {
        if !stored.may_be_torn(meta) {
            // The owner id and uid as the damaged header has them, to name suspects.
            let owner = (media.load(offset + LEN_WORD_OFFSET)? & 0xFFFF_FFFF) as u32;
            damaged.push(Damaged {
                offset,
                owner,
                why: QuarantineReason::DamagedHeader,
                uid: media.load(offset + UID_OFFSET)?,
            });
        }
    }
    Ok(())
}

/// One durable version: (uid, epoch, kind rank, offset). Sorting puts, per uid, the newest
/// version last; an anti-block beats an update of the same epoch, which beats an alloc.
type Version = (u64, u64, u8, u64);

fn rank(kind: BlockKind) -> u8 {
    match kind {
        BlockKind::Alloc => 0,
        BlockKind::Update => 1,
        BlockKind::Delete => 2,
    }
}

/// Reads every valid header and picks, per uid, the newest version among the blocks of
/// epochs `<= stored.word - 2`, and notes every damaged block: a payload of a durable epoch
/// that fails its checksum, and a header that is not valid but cannot be one the crash
/// tore ([`Stored::may_be_torn`]). It only reads: a header no heap can hold fails the whole
/// recovery before anything is changed, and so does an epoch word that cannot be the clock
/// these blocks were written under: older than one of them where the word leads the blocks
/// (see [`Stored::word_leads`]), or, after a clean close, not two epochs past every one of
/// them, which is what a clean close leaves.
pub(super) fn choose(
    media: &Media,
    geometry: &Geometry,
    units: &[Unit],
    options: Options<'_>,
    progress: &scan::Progress<'_>,
    stored: Stored,
) -> Result<Winners> {
    let cut = stored.word.durable_cut();
    let threads = options.threads.max(1);
    let max_uid = AtomicU64::new(0);
    let owners = [AtomicU64::new(0), AtomicU64::new(0)];
    let creation_id = geometry.creation_id;
    // Per unit: its durable versions, and those whose payload fails its checksum (with
    // their owners).
    let work = |visit: UnitVisit<'_>| -> Result<(Vec<Version>, Vec<Damaged>)> {
        let mut versions = Vec::new();
        let mut damaged = Vec::new();
        let mut buf = Vec::new();
        for view in visit.blocks.iter().filter_map(|(_, v)| v.as_ref()) {
            let info = view.info();
            super::check_header(info)?;
            stored.check_block_epoch(info.spec.epoch)?;
            let owner = info.spec.owner.get();
            // ORDERING: bits read after the scope joins.
            owners[(owner / 64) as usize % 2].fetch_or(1 << (owner % 64), Ordering::Relaxed);
            // ORDERING: a maximum read after the scope joins.
            max_uid.fetch_max(info.spec.uid, Ordering::Relaxed);
            if info.spec.epoch <= cut {
                // A block of a durable epoch had its trailer written back with it.
                if !payload_intact(media, creation_id, info, &mut buf)? {
                    damaged.push(Damaged {
                        offset: info.block.offset(),
                        owner,
                        why: QuarantineReason::DamagedPayload,
                        uid: info.spec.uid,
                    });
                }
                versions.push((
                    info.spec.uid,
                    info.spec.epoch.get(),
                    rank(info.spec.kind),
                    info.block.offset(),
                ));
            }
        }
        damaged_headers(media, stored, &visit.invalid, &mut damaged)?;
        Ok((versions, damaged))
    };
    let per_unit = scan::scan(
        media,
        geometry,
        units,
        scan::ScanOptions::recovery(threads),
        progress,
        &work,
        &|| Ok(()),
    )?;

    // Partition by uid so that each partition can be sorted on its own thread.
    let mut parts: Vec<Vec<Version>> = vec![Vec::new(); threads];
    let mut damaged = Vec::new();
    for (versions, unit_damaged) in per_unit {
        for version in versions {
            parts[(version.0 % threads as u64) as usize].push(version);
        }
        damaged.extend(unit_damaged);
    }
    let positions = geometry.span_count * (crate::base::layout::SPAN_SIZE / 64);
    let winners = Winners {
        data_offset: geometry.data_offset,
        bits: (0..positions.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect(),
        max_uid: 0,
        owners: 0,
        damaged: Vec::new(),
    };
    std::thread::scope(|scope| {
        for part in &mut parts {
            let winners = &winners;
            scope.spawn(move || {
                part.sort_unstable();
                for (i, version) in part.iter().enumerate() {
                    let newest = part.get(i + 1).is_none_or(|next| next.0 != version.0);
                    if newest {
                        winners.insert(version.3);
                    }
                }
            });
        }
    });
    let [low, high] = owners;
    Ok(Winners {
        max_uid: max_uid.into_inner(),
        owners: u128::from(low.into_inner()) | u128::from(high.into_inner()) << 64,
        damaged,
        ..winners
    })
}
