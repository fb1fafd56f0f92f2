//! What a heap's space holds: spans and blocks per size class and in large blocks, and the
//! blocks and bytes of each named structure, from one scan of the live blocks.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::Heap;
use crate::alloc::block::{BlockKind, OwnerId};
use crate::alloc::size_class::{CLASS_SIZES, NUM_CLASSES, blocks_per_span};
use crate::base::layout::{DIRECTORY_CAPACITY, SPAN_SIZE};
use crate::config::RecoveryProgress;
use crate::error::Result;
use crate::recovery::scan::{self, Unit, UnitVisit};

/// How a heap's space is used now ([`Heap::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Bytes in a span, the unit the heap is carved in.
    pub span_size: u64,
    /// Spans that can hold blocks (the span tables are not counted).
    pub spans: u64,
    /// Spans neither carved into blocks nor part of a large block.
    pub free_spans: u64,
    /// One entry per size class, smallest first, including classes with no span.
    pub classes: Vec<ClassUsage>,
    /// Blocks of one or more whole spans, for payloads larger than the largest class.
    pub large: LargeUsage,
    /// Each structure the directory names, in directory order.
    pub structures: Vec<StructureUsage>,
    /// Live blocks that belong to no named structure (raw blocks).
    pub unowned: StructureUsage,
}

/// The spans and blocks of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassUsage {
    /// The size of each block, header and trailer included.
    pub block_size: u64,
    /// Spans carved into blocks of this class.
    pub spans: u64,
    /// Blocks those spans hold.
    pub blocks: u64,
    /// Of those, blocks holding a live payload (or a deletion's anti-block).
    pub live_blocks: u64,
    /// The payload bytes the live blocks hold.
    pub live_bytes: u64,
}

/// The heap's large blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LargeUsage {
    /// Large blocks.
    pub blocks: u64,
    /// The spans they cover.
    pub spans: u64,
    /// Of those blocks, the ones holding a live payload.
    pub live_blocks: u64,
    /// The payload bytes the live blocks hold.
    pub live_bytes: u64,
}

/// The live blocks of one structure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StructureUsage {
    /// The structure's name (empty for [`Usage::unowned`]).
    pub name: String,
    /// The owner id its blocks carry.
    pub owner: OwnerId,
    /// Its live blocks.
    pub blocks: u64,
    /// The payload bytes they hold.
    pub bytes: u64,
    /// The type ids of its live payloads (not of the anti-blocks of deletions), ascending.
    pub type_ids: Vec<u64>,
}

/// Blocks and bytes, counted by many scan workers.
#[derive(Default)]
struct Count {
    blocks: AtomicU64,
    bytes: AtomicU64,
}

impl Count {
    fn add(&self, bytes: u64) {
        // ORDERING: totals read after the scan's threads have joined.
        self.blocks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        // ORDERING: as in `add`.
        (
            self.blocks.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// One owner's live blocks, bytes and payload type ids, counted by many scan workers.
#[derive(Default)]
struct Tally {
    count: Count,
    types: Mutex<BTreeSet<u64>>,
}

impl Tally {
    fn add(&self, info: &crate::alloc::block::BlockInfo) {
        self.count.add(u64::from(info.len));
        if info.spec.kind != BlockKind::Delete {
            self.types
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(info.spec.type_id);
        }
    }

    /// The structure `name` (`owner`) as this tally counted it.
    fn usage(&self, name: String, owner: OwnerId) -> StructureUsage {
        let (blocks, bytes) = self.count.get();
        let types = std::mem::take(&mut *self.types.lock().unwrap_or_else(PoisonError::into_inner));
        StructureUsage {
            name,
            owner,
            blocks,
            bytes,
            type_ids: types.into_iter().collect(),
        }
    }
}

impl Heap {
    /// How the heap's space is used: per size class and for large blocks, spans and live
    /// blocks; per structure, live blocks and payload bytes. Reads every block header in
    /// the carved spans once, on as many threads as the machine has, calling `progress` as
    /// it goes. Quarantined blocks are not counted as live.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupted`](crate::Error::Corrupted) if the span table is damaged.
    pub fn usage(&self, progress: impl Fn(RecoveryProgress) + Send + Sync) -> Result<Usage> {
        let runtime = &self.shared().runtime;
        let media = &runtime.media;
        let geometry = runtime.alloc.geometry();
        let units = scan::read_span_table(media, &geometry, false)?.units;
        let progress = scan::Progress::new(&units, 1, Some(&progress));
        let classes: Vec<Count> = (0..NUM_CLASSES).map(|_| Count::default()).collect();
        let large = Count::default();
        let owners: Vec<Tally> = (0..=DIRECTORY_CAPACITY).map(|_| Tally::default()).collect();
        let work = |unit: UnitVisit<'_>| -> Result<()> {
            let count = match unit.unit {
                Unit::Class { class, .. } => &classes[usize::from(class)],
                Unit::Large { .. } => &large,
            };
            for (_, view) in &unit.blocks {
                let Some(view) = view else { continue };
                if !self.in_state(view, true)? {
                    continue;
                }
                let info = view.info();
                count.add(u64::from(info.len));
                if let Some(owner) = owners.get(info.spec.owner.get() as usize) {
                    owner.add(info);
                }
            }
            Ok(())
        };
        let options = scan::ScanOptions {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            settle: false,
        };
        scan::scan(media, &geometry, &units, options, &progress, &work, &|| {
            Ok(())
        })?;
        let mut usage = Usage {
            span_size: SPAN_SIZE,
            spans: geometry.data_spans(),
            free_spans: geometry.data_spans(),
            classes: Vec::with_capacity(NUM_CLASSES),
            large: LargeUsage::default(),
            structures: Vec::new(),
            unowned: owners[0].usage(String::new(), OwnerId::NONE),
        };
        let mut class_spans = [0u64; NUM_CLASSES];
        for unit in &units {
            match *unit {
                Unit::Class { class, .. } => {
                    class_spans[usize::from(class)] += 1;
                    usage.free_spans -= 1;
                }
                Unit::Large { extent, .. } => {
                    usage.large.blocks += 1;
                    usage.large.spans += extent;
                    usage.free_spans -= extent;
                }
            }
        }
        for (class, count) in classes.iter().enumerate() {
            let (live_blocks, live_bytes) = count.get();
            usage.classes.push(ClassUsage {
                block_size: CLASS_SIZES[class],
                spans: class_spans[class],
                blocks: class_spans[class] * blocks_per_span(class as u8),
                live_blocks,
                live_bytes,
            });
        }
        (usage.large.live_blocks, usage.large.live_bytes) = large.get();
        for (name, owner) in self.structures() {
            usage
                .structures
                .push(owners[owner.get() as usize].usage(name, owner));
        }
        Ok(usage)
    }
}
