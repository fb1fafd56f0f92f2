//! Opening: a logged structure's payloads as the heap holds them, sorted by shard and kind,
//! and the state each shard's payloads rebuild.

use std::collections::VecDeque;
use std::sync::Mutex;

use montage_core::{Attached, Codec, Error, Heap, PBlock, Result};

use super::Replay;
use super::core::{Entry, Kinds, PAGE_RECORD_PREFIX, State, record_len};
use crate::structure::{self, lock};

fn corrupted(offset: u64, what: &'static str) -> Error {
    Error::Corrupted { offset, what }
}

/// A snapshot's commit: the sequence number it covers up to, its chunks and bytes, and the
/// format it was saved in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Commit {
    pub(super) upto: u64,
    pub(super) chunks: u64,
    pub(super) len: u64,
    pub(super) format: u64,
}

impl Commit {
    pub(super) fn encode(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (at, word) in [self.upto, self.chunks, self.len, self.format]
            .into_iter()
            .enumerate()
        {
            out[at * 8..at * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Commit> {
        if bytes.len() != 32 {
            return None;
        }
        let word = |at: usize| structure::word_at(bytes, at * 8);
        Some(Commit {
            upto: structure::seq_prefix(bytes)?,
            chunks: word(1)?,
            len: word(2)?,
            format: word(3)?,
        })
    }
}

/// A shard's state as its payloads rebuild it, and the blocks it no longer needs.
pub(super) type Rebuilt<T> = (State<T>, Dead);

/// Payloads a shard no longer needs, to delete.
#[derive(Default)]
pub(super) struct Dead {
    /// Records a committed snapshot covers: opening ignores them should a crash bring them
    /// back, so they go without anti-blocks (`OpGuard::discard`).
    pub(super) records: Vec<PBlock>,
    /// Chunks and commits of snapshots other than the newest: deleted with anti-blocks, as a
    /// chunk brought back could pass for one of a later snapshot that covers the same
    /// records.
    pub(super) snapshots: Vec<PBlock>,
}

impl Dead {
    pub(super) fn append(&mut self, other: Dead) {
        self.records.extend(other.records);
        self.snapshots.extend(other.snapshots);
    }
}

/// One shard's payloads, as open found them.
#[derive(Default)]
pub(super) struct Found {
    /// The heap the payloads are in (records are read again, in order, at replay).
    heap: Option<Heap>,
    /// Every record, of its own or in a page.
    records: Vec<Entry>,
    /// Pages that hold no record (a page's first record and the page are written in one
    /// operation, so only damage leaves one).
    empty: Vec<PBlock>,
    /// (snapshot's `upto`, index, block, bytes)
    chunks: Vec<(u64, u64, PBlock, Vec<u8>)>,
    commits: Vec<(Commit, PBlock)>,
}

/// What kind of payload a type id names, and of which shard.
#[derive(Clone, Copy)]
enum Kind {
    Record,
    Page,
    Chunk,
    Commit,
}

impl Found {
    /// Every live payload of the structure `attached` names, by shard (`kinds` are the
    /// shards' type ids) and kind. A payload of another type id is
    /// [`Error::LayoutMismatch`]: a log of other operations, or of another shard count.
    pub(super) fn scan(heap: &Heap, attached: &Attached, kinds: &[Kinds]) -> Result<Vec<Found>> {
        let mut ids: Vec<(u64, Kind, usize)> = Vec::with_capacity(kinds.len() * 4);
        for (shard, k) in kinds.iter().enumerate() {
            ids.push((k.record, Kind::Record, shard));
            ids.push((k.page, Kind::Page, shard));
            ids.push((k.chunk, Kind::Chunk, shard));
            ids.push((k.commit, Kind::Commit, shard));
        }
        let type_ids: Vec<u64> = ids.iter().map(|&(id, _, _)| id).collect();
        let found: Vec<Mutex<Found>> = kinds
            .iter()
            .map(|_| {
                Mutex::new(Found {
                    heap: Some(heap.clone()),
                    ..Found::default()
                })
            })
            .collect();
        structure::scan_payloads(
            heap,
            attached.owner(),
            &type_ids,
            "montage_collections::Logged record",
            |type_id, block, bytes| {
                let bad = |what| corrupted(block.offset(), what);
                let Some(&(_, kind, shard)) = ids.iter().find(|&&(id, _, _)| id == type_id) else {
                    unreachable!("scan_payloads passes only the type ids it was given")
                };
                let seq = || {
                    structure::seq_prefix(bytes)
                        .ok_or_else(|| bad("a log payload has no sequence number"))
                };
                // Records, pages' included, only where they are: replay reads them again, in
                // sequence order, rather than a copy of every record being held until then.
                match kind {
                    Kind::Page => {
                        let entries = page_records(block, bytes)?;
                        let mut found = lock(&found[shard]);
                        if entries.is_empty() {
                            found.empty.push(block);
                        }
                        found.records.extend(entries);
                    }
                    Kind::Record => {
                        let entry = Entry {
                            seq: seq()?,
                            block,
                            at: 8,
                            len: bytes.len() as u64 - 8,
                        };
                        lock(&found[shard]).records.push(entry);
                    }
                    Kind::Chunk => {
                        let seq = seq()?;
                        let index = structure::word_at(bytes, 8)
                            .ok_or_else(|| bad("a snapshot chunk has no index"))?;
                        let chunk = (seq, index, block, bytes[16..].to_vec());
                        lock(&found[shard]).chunks.push(chunk);
                    }
                    Kind::Commit => {
                        seq()?;
                        let commit = Commit::decode(bytes)
                            .ok_or_else(|| bad("a snapshot commit does not decode"))?;
                        lock(&found[shard]).commits.push((commit, block));
                    }
                }
                Ok(())
            },
        )?;
        Ok(found
            .into_iter()
            .map(|f| {
                f.into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            })
            .collect())
    }

    /// The state these payloads hold: the newest snapshot (or `initial`) with the records
    /// after it replayed; and the blocks no longer needed (older records, other snapshots),
    /// for deletion.
    pub(super) fn rebuild<T: Replay>(
        self,
        initial: impl FnOnce() -> T,
        name: &str,
    ) -> Result<Rebuilt<T>> {
        let Found {
            heap,
            records,
            empty,
            mut chunks,
            mut commits,
        } = self;
        commits.sort_unstable_by_key(|(commit, _)| commit.upto);
        let newest = commits.last().copied();
        let mut dead = Dead::default();
        let (value, upto, snapshot, snapshot_bytes) = match newest {
            None => (None, 0, Vec::new(), 0),
            Some((commit, block)) => {
                let compiled = T::snapshot_format()?;
                if commit.format != compiled {
                    return Err(Error::LayoutMismatch {
                        type_name: "montage_collections::Logged snapshot",
                        stored: commit.format,
                        compiled,
                    });
                }
                let mut mine: Vec<(u64, PBlock, Vec<u8>)> = Vec::new();
                for (upto, index, chunk_block, bytes) in chunks.drain(..) {
                    if upto == commit.upto {
                        mine.push((index, chunk_block, bytes));
                    } else {
                        dead.snapshots.push(chunk_block);
                    }
                }
                mine.sort_unstable_by_key(|&(index, _, _)| index);
                let complete = mine.len() as u64 == commit.chunks
                    && mine
                        .iter()
                        .zip(0u64..)
                        .all(|(&(index, _, _), want)| index == want);
                let mut bytes = Vec::with_capacity(mine.iter().map(|(_, _, b)| b.len()).sum());
                for (_, _, chunk) in &mine {
                    bytes.extend_from_slice(chunk);
                }
                if !complete || bytes.len() as u64 != commit.len {
                    return Err(corrupted(
                        block.offset(),
                        "a committed snapshot has lost a chunk",
                    ));
                }
                let value = T::load(&bytes)
                    .ok_or_else(|| corrupted(block.offset(), "a snapshot does not load"))?;
                let mut snapshot: Vec<PBlock> = mine.into_iter().map(|(_, b, _)| b).collect();
                snapshot.push(block);
                dead.snapshots
                    .extend(commits[..commits.len() - 1].iter().map(|&(_, b)| b));
                (Some(value), commit.upto, snapshot, commit.len)
            }
        };
        dead.snapshots
            .extend(chunks.into_iter().map(|(_, _, b, _)| b));
        // The records from `upto` on must be exactly `upto..next_seq`: each goes to its place
        // by its sequence number (no sort), and a place taken twice, or one left empty, is
        // damage.
        let log = split_covered(records, upto, &mut dead.records);
        dead.records.extend(empty);
        let mut slots: Vec<Option<Entry>> = vec![None; log.len()];
        for &entry in &log {
            let slot = usize::try_from(entry.seq - upto)
                .ok()
                .and_then(|at| slots.get_mut(at))
                .ok_or_else(|| {
                    corrupted(
                        entry.block.offset(),
                        "the log has a gap: a record it needs was lost",
                    )
                })?;
            if slot.replace(entry).is_some() {
                return Err(corrupted(
                    entry.block.offset(),
                    "two log records have the same sequence number",
                ));
            }
        }
        // Each record took a place of its own among as many places: none is empty.
        let records: VecDeque<Entry> = slots.into_iter().flatten().collect();
        let next_seq = upto + records.len() as u64;
        let start = value.unwrap_or_else(initial);
        let value = match heap {
            Some(heap) => replay(&heap, start, &records, name)?,
            None => start,
        };
        let state = State::new(value, next_seq, records, upto, snapshot, snapshot_bytes);
        Ok((state, dead))
    }
}

/// The records from `upto` on; the blocks whose records are all before it go to `dead`. A
/// page may hold records on both sides of `upto`, and stays. (Usually nothing is covered: a
/// log after a clean close is empty, and a crash leaves only what a compaction had not
/// discarded yet.)
fn split_covered(records: Vec<Entry>, upto: u64, dead: &mut Vec<PBlock>) -> Vec<Entry> {
    let (covered, log): (Vec<Entry>, Vec<Entry>) =
        records.into_iter().partition(|entry| entry.seq < upto);
    let mut covered: Vec<PBlock> = covered.into_iter().map(|entry| entry.block).collect();
    covered.sort_unstable();
    covered.dedup();
    if !covered.is_empty() {
        let mut needed = vec![false; covered.len()];
        for entry in &log {
            if let Ok(at) = covered.binary_search(&entry.block) {
                needed[at] = true;
            }
        }
        dead.extend(
            covered
                .into_iter()
                .zip(needed)
                .filter_map(|(block, needed)| (!needed).then_some(block)),
        );
    }
    log
}

/// Rebuilds the one shard of a `Logged` from `found` (nothing, for a new structure).
pub(super) fn rebuild_one<T: Replay>(
    found: Vec<Found>,
    initial: impl FnOnce() -> T,
    name: &str,
) -> Result<Vec<Rebuilt<T>>> {
    let found = found.into_iter().next().unwrap_or_default();
    Ok(vec![found.rebuild(initial, name)?])
}

/// Rebuilds every shard from `found`, in parallel over the machine's cores (shard `i`
/// starts from `initial(i)` when it has no snapshot).
pub(super) fn rebuild_all<T: Replay + Send>(
    found: Vec<Found>,
    initial: &(impl Fn(usize) -> T + Sync),
    name: &str,
) -> Result<Vec<Rebuilt<T>>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(found.len());
    if threads <= 1 {
        return found
            .into_iter()
            .enumerate()
            .map(|(i, f)| f.rebuild(|| initial(i), name))
            .collect();
    }
    let work: Mutex<Vec<(usize, Found)>> = Mutex::new(found.into_iter().enumerate().collect());
    let done: Mutex<Vec<(usize, Result<Rebuilt<T>>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let next = lock(&work).pop();
                    let Some((i, found)) = next else { break };
                    let rebuilt = found.rebuild(|| initial(i), name);
                    lock(&done).push((i, rebuilt));
                }
            });
        }
    });
    let mut done = done
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, rebuilt)| rebuilt).collect()
}

/// The records in the log page `block` whose payload is `bytes`: each a header word (the
/// tag and the encoding's length), its sequence number and the encoding, from the start to
/// the first zero word. Anything else there is damage.
fn page_records(block: PBlock, bytes: &[u8]) -> Result<Vec<Entry>> {
    let bad = |what| corrupted(block.offset(), what);
    let mut entries = Vec::new();
    let mut at = 0usize;
    while let Some(header) = structure::word_at(bytes, at).filter(|&word| word != 0) {
        let len = record_len(header)
            .ok_or_else(|| bad("a log page holds a record with a damaged header"))?;
        let start = at as u64 + PAGE_RECORD_PREFIX;
        let end = start + len;
        let seq = structure::seq_prefix(&bytes[at + 8..])
            .filter(|_| end <= bytes.len() as u64)
            .ok_or_else(|| bad("a log page holds a record that does not fit it"))?;
        entries.push(Entry {
            seq,
            block,
            at: start,
            len,
        });
        // Within the payload, checked just above.
        at = end.next_multiple_of(8) as usize;
    }
    Ok(entries)
}

/// Applies the records `records` name, read from `heap` in order, to `value`.
fn replay<T: Replay>(
    heap: &Heap,
    mut value: T,
    records: &VecDeque<Entry>,
    name: &str,
) -> Result<T> {
    let replayed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<T> {
        structure::with_buffer(|bytes| {
            // A page is read once for its records, which follow one another.
            let mut read = None;
            for entry in records {
                if read != Some(entry.block) {
                    heap.read_payload_into(entry.block, bytes)?;
                    read = Some(entry.block);
                }
                let op = usize::try_from(entry.at)
                    .ok()
                    .zip(usize::try_from(entry.at + entry.len).ok())
                    .and_then(|(start, end)| bytes.get(start..end))
                    .and_then(T::Op::decode)
                    .ok_or_else(|| {
                        corrupted(
                            entry.block.offset(),
                            "a log record does not decode as an operation",
                        )
                    })?;
                value.apply(op);
            }
            Ok(value)
        })
    }));
    replayed.unwrap_or_else(|_| {
        Err(Error::Panicked {
            structure: name.to_owned(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::core::{page_entries, record_header};
    use super::*;

    /// A counter whose snapshot is its value's eight bytes.
    #[derive(Default)]
    struct Count(u64);

    impl Replay for Count {
        type Op = u64;
        type Output = ();

        fn apply(&mut self, op: u64) {
            self.0 += op;
        }

        fn save(&self, out: &mut Vec<u8>) -> Option<Result<()>> {
            out.extend_from_slice(&self.0.to_le_bytes());
            Some(Ok(()))
        }

        fn load(bytes: &[u8]) -> Option<Self> {
            Some(Count(structure::word_at(bytes, 0)?))
        }
    }

    /// After a crash, a page may hold records on both sides of the newest snapshot: it stays
    /// (its later records are the log), and only blocks whose records the snapshot covers
    /// all are discarded.
    #[test]
    fn a_page_goes_only_when_the_snapshot_covers_all_its_records() {
        let commit = Commit {
            upto: 5,
            chunks: 1,
            len: 8,
            format: 0,
        };
        let mut records: Vec<Entry> = page_entries(0x1000, 0..3).collect();
        // The page of calls 3 to 6, across the snapshot's `upto`.
        records.extend(page_entries(0x2000, 3..7));
        records.extend(page_entries(0x3000, 7..8));
        let found = Found {
            heap: None,
            records,
            empty: vec![PBlock::from_offset(0x4000)],
            chunks: vec![(
                5,
                0,
                PBlock::from_offset(0x5000),
                9u64.to_le_bytes().to_vec(),
            )],
            commits: vec![(commit, PBlock::from_offset(0x6000))],
        };
        let (state, dead) = found.rebuild(Count::default, "count").unwrap();
        assert_eq!(
            state.value.0, 9,
            "loaded from the snapshot, replay left to the heap"
        );
        assert_eq!(state.next_seq, 8);
        let kept: Vec<(u64, u64)> = state
            .records
            .iter()
            .map(|entry| (entry.seq, entry.block.offset()))
            .collect();
        assert_eq!(kept, [(5, 0x2000), (6, 0x2000), (7, 0x3000)]);
        let mut discarded: Vec<u64> = dead.records.iter().map(|block| block.offset()).collect();
        discarded.sort_unstable();
        assert_eq!(discarded, [0x1000, 0x4000]);
        assert!(dead.snapshots.is_empty());
    }

    /// A page's records run to its first zero word; a header word without the tag, or a
    /// record that runs past the page, is damage.
    #[test]
    fn a_page_is_read_to_its_first_zero_word_and_damage_is_reported() {
        let block = PBlock::from_offset(0x1000);
        let record = |seq: u64, op: &[u8]| {
            let mut bytes = record_header(op.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(&seq.to_le_bytes());
            bytes.extend_from_slice(op);
            bytes.resize(bytes.len().next_multiple_of(8), 0);
            bytes
        };
        let mut page = record(4, b"abc");
        page.extend(record(5, &[7; 9]));
        let end = page.len();
        page.resize(128, 0);
        // What a panicking call leaves after the zero word: not read.
        page[end + 8..end + 16].copy_from_slice(&6u64.to_le_bytes());
        let read: Vec<(u64, u64, u64)> = page_records(block, &page)
            .unwrap()
            .iter()
            .map(|entry| (entry.seq, entry.at, entry.len))
            .collect();
        assert_eq!(read, [(4, 16, 3), (5, 40, 9)]);
        assert!(page_records(block, &[0; 64]).unwrap().is_empty());

        let mut untagged = page.clone();
        untagged[end + 7] = 0x12;
        assert!(matches!(
            page_records(block, &untagged),
            Err(Error::Corrupted { what, .. }) if what.contains("damaged header")
        ));
        let mut too_long = page.clone();
        too_long[..8].copy_from_slice(&record_header(200).to_le_bytes());
        assert!(matches!(
            page_records(block, &too_long),
            Err(Error::Corrupted { what, .. }) if what.contains("does not fit")
        ));
    }
}
