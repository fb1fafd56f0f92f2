//! The journal backend: a redo log of epochs, so that a file heap is made durable by one
//! sequential write and one device flush per group commit instead of by writing the mapped
//! file back in place.
//!
//! The heap file stays mapped shared; stores go to the mapping as on every backend. A flush
//! records a range; [`seal`](Journal::seal) copies the recorded ranges out of the mapping
//! into one checksummed, sequence-numbered record and appends it to the journal (a `pwrite`
//! into the page cache, no flush); [`commit`](Journal::commit) makes every sealed record
//! durable with one `fdatasync` of the journal shared by all callers waiting at that moment
//! (group commit). Every record carries the epoch word at its sealing, so the durable epoch
//! is the word of the last valid record.
//!
//! A [`checkpoint`](Journal::checkpoint) makes the heap file durable (`fdatasync`), so the
//! records before it are no longer needed, and says so in the journal's header; their ring
//! space is then reused. Recovery replays the valid records after the checkpoint into the
//! mapping (idempotent physical redo) and stops at the first torn or missing one.
//!
//! What may reach the heap file early (the kernel writes a shared mapping's dirty pages back
//! whenever it likes) is exactly what may reach persistent memory early from the cache, with
//! one difference the epoch layer handles: a record is durable only after a commit, not after
//! a fence, so a store that destroys what a durable state needs (reclaiming a superseded
//! version, say) waits until the record that makes it safe is committed (see
//! `epoch/reclaim.rs`). Everything outside the epoch advance keeps the fence it always had,
//! which here is a seal and a commit; only a new span's entry, which adds and which the
//! blocks carved from it follow in flush order, is flushed without one
//! (`Media::persist_ordered`).
//!
//! The protocol and its invariants are in `docs/design.md` ("The journal").

pub(crate) mod device;
pub(crate) mod format;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::base::region::Region;
use crate::error::{Error, Result};
use crate::spare::fit;
use device::Device;
use format::{Header, RECORD_HEADER, RECORDS_START, RecordBuf, RecordHead, SECTOR, SLOTS};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A position in the journal's sequence of records: durable once the journal's durable
/// sequence number reaches it.
pub(crate) type Ticket = u64;

/// The append side of the journal.
#[derive(Debug)]
struct Writer {
    /// The sequence number the next record gets.
    next_seq: u64,
    /// The ring position (virtual) the next record goes to.
    vpos: u64,
    /// The ring position of the first record after the checkpoint: the writer must not
    /// reach `vtail + ring`.
    vtail: u64,
    /// The epoch word new records carry.
    word: u64,
    /// The checkpoint the header names.
    checkpoint_seq: u64,
    /// The header slot written last, and its generation.
    slot: usize,
    generation: u64,
    buf: RecordBuf,
    scratch: Vec<u8>,
    /// The list of ranges the flushers get at the next seal, kept for its capacity.
    ranges: Vec<(u64, u64)>,
}

/// What recovery found in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Valid records replayed.
    pub(crate) records: u64,
    /// Bytes of heap they rewrote.
    pub(crate) bytes: u64,
    /// The durable epoch word: that of the last valid record, or of the checkpoint.
    pub(crate) word: u64,
}

/// One open journal.
#[derive(Debug)]
pub(crate) struct Journal {
    device: Device,
    id: u64,
    creation_id: u64,
    /// The session the header names; records after its start must carry it.
    session: AtomicU64,
    ring: u64,
    /// Ranges flushed since the last seal, in flush order.
    pending: Mutex<Vec<(u64, u64)>>,
    writer: Mutex<Writer>,
    /// The last record written to the journal file (not necessarily durable).
    sealed: AtomicU64,
    /// The last record known durable.
    durable: AtomicU64,
    /// Serializes `fdatasync`s of the journal, so callers waiting at once share one.
    commit_lock: Mutex<()>,
    /// Serializes background checkpoints.
    checkpoint_lock: Mutex<()>,
    /// Whether records are written yet: before the journal is attached (during recovery) a
    /// fence makes the heap file itself durable instead.
    logging: AtomicBool,
    poisoned: AtomicBool,
    /// When the journal was last made durable, for the background bound.
    last_commit: Mutex<Instant>,
    /// Bytes sealed since the last commit.
    unsynced: AtomicU64,
    /// Test hook: make the next flush of either file fail as if the device had reported an
    /// error.
    #[cfg(test)]
    pub(crate) fail_next: AtomicBool,
}

impl Journal {
    /// A journal over `device` whose header is `header` (already durable), not yet logging.
    pub(crate) fn new(device: Device, header: Header, slot: usize) -> Result<Journal> {
        let len = device.len();
        if len < format::MIN_LEN || !len.is_multiple_of(SECTOR) {
            return Err(Error::Corrupted {
                offset: 0,
                what: "the journal file is too short or not a whole number of sectors",
            });
        }
        let ring = len - RECORDS_START;
        Ok(Journal {
            device,
            id: header.journal_id,
            creation_id: header.creation_id,
            session: AtomicU64::new(header.session),
            ring,
            pending: Mutex::new(Vec::new()),
            writer: Mutex::new(Writer {
                next_seq: header.checkpoint_seq + 1,
                vpos: header.start,
                vtail: header.start,
                word: header.checkpoint_word,
                checkpoint_seq: header.checkpoint_seq,
                slot,
                generation: header.generation,
                buf: RecordBuf::default(),
                scratch: Vec::new(),
                ranges: Vec::new(),
            }),
            sealed: AtomicU64::new(header.checkpoint_seq),
            durable: AtomicU64::new(header.checkpoint_seq),
            commit_lock: Mutex::new(()),
            checkpoint_lock: Mutex::new(()),
            logging: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            last_commit: Mutex::new(Instant::now()),
            unsynced: AtomicU64::new(0),
            #[cfg(test)]
            fail_next: AtomicBool::new(false),
        })
    }

    /// Writes a fresh journal's header into `device` and makes it durable.
    pub(crate) fn format(
        device: &Device,
        creation_id: u64,
        journal_id: u64,
        word: u64,
    ) -> Result<Header> {
        let header = Header {
            creation_id,
            journal_id,
            generation: 1,
            checkpoint_seq: 0,
            checkpoint_word: word,
            start: 0,
            session: new_session(),
        };
        let io = |e| Error::WriteBack { source: e };
        device.write(SLOTS[0], &header.encode()).map_err(io)?;
        // An old second slot would win with a larger generation: clear it.
        device.write(SLOTS[1], &[0u8; 72]).map_err(io)?;
        device.sync().map_err(io)?;
        Ok(header)
    }

    /// The newest valid header of `device`'s journal and its slot.
    pub(crate) fn read_header(device: &Device) -> Result<Option<(usize, Header)>> {
        let mut slots = [[0u8; 72]; 2];
        for (slot, at) in slots.iter_mut().zip(SLOTS) {
            device
                .read(at, slot)
                .map_err(|e| Error::WriteBack { source: e })?;
        }
        Ok(Header::newest(&slots[0], &slots[1]))
    }

    fn session(&self) -> u64 {
        // ORDERING: changes only in `fold`, before any record is written.
        self.session.load(Ordering::Relaxed)
    }

    /// The id the heap's superblock names this journal by.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Whether a write or flush of the journal or the heap file failed.
    #[inline]
    pub(crate) fn is_poisoned(&self) -> bool {
        // ORDERING: Acquire pairs with the Release in `poison`.
        self.poisoned.load(Ordering::Acquire)
    }

    fn poison(&self, source: std::io::Error) -> Error {
        // ORDERING: pairs with the Acquire in `is_poisoned`.
        self.poisoned.store(true, Ordering::Release);
        Error::WriteBack { source }
    }

    fn check(&self) -> Result<()> {
        if self.is_poisoned() {
            return Err(Error::Poisoned);
        }
        Ok(())
    }

    /// `fdatasync` of the journal (with the test hook).
    fn sync_journal(&self) -> std::io::Result<()> {
        self.injected()?;
        self.device.sync()
    }

    /// `fdatasync` of the heap file (with the test hook).
    fn sync_data(&self) -> std::io::Result<()> {
        self.injected()?;
        self.device.sync_data()
    }

    #[cfg_attr(not(test), allow(clippy::unused_self, clippy::unnecessary_wraps))]
    fn injected(&self) -> std::io::Result<()> {
        // ORDERING: a test hook; the test sets it on the thread that then flushes.
        #[cfg(test)]
        if self.fail_next.swap(false, Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    /// From now on fences seal and commit records (before, they flush the heap file).
    pub(crate) fn start_logging(&self) {
        // ORDERING: set by the opening thread before the heap is shared.
        self.logging.store(true, Ordering::Release);
    }

    fn is_logging(&self) -> bool {
        // ORDERING: pairs with the Release in `start_logging`.
        self.logging.load(Ordering::Acquire)
    }

    /// Records `[offset, offset + len)` for the next record.
    pub(crate) fn flush(&self, offset: u64, len: u64) -> Result<()> {
        self.flush_all(&[(offset, len)])
    }

    /// Records each of `ranges` for the next record, under one lock.
    pub(crate) fn flush_all(&self, ranges: &[(u64, u64)]) -> Result<()> {
        self.check()?;
        if self.is_logging() {
            lock(&self.pending).extend(ranges.iter().filter(|&&(_, len)| len != 0));
        }
        Ok(())
    }

    /// A fence: everything flushed so far is durable when it returns.
    pub(crate) fn fence(&self, region: &Region) -> Result<()> {
        self.check()?;
        if !self.is_logging() {
            return self.sync_data().map_err(|e| self.poison(e));
        }
        let ticket = self.seal(region, None)?;
        self.commit(ticket)
    }

    /// Appends what was flushed since the last seal as one or more records (the last one
    /// carrying `word`, if given, as the new epoch word), without making them durable.
    /// Returns the ticket that [`commit`](Self::commit) makes durable.
    pub(crate) fn seal(&self, region: &Region, word: Option<u64>) -> Result<Ticket> {
        self.check()?;
        let mut w = lock(&self.writer);
        // The flushers go on with the writer's spare list, empty with the capacity of the
        // last seal's (see `crate::spare`).
        let mut ranges = std::mem::take(&mut w.ranges);
        std::mem::swap(&mut ranges, &mut *lock(&self.pending));
        // What the flushers filled it with: the merge below shortens it in place.
        let used = ranges.len();
        let sealed = self.seal_ranges(region, &mut w, &mut ranges, word);
        fit(&mut ranges, used);
        w.ranges = ranges;
        sealed
    }

    /// [`seal`](Self::seal) of `ranges`, the ranges flushed since the last seal, with the
    /// writer in hand.
    fn seal_ranges(
        &self,
        region: &Region,
        w: &mut Writer,
        ranges: &mut Vec<(u64, u64)>,
        word: Option<u64>,
    ) -> Result<Ticket> {
        let changes_word = word.is_some_and(|word| word != w.word);
        if ranges.is_empty() && !changes_word {
            return Ok(w.next_seq - 1);
        }
        merge(ranges);
        let max_body = (self.ring / 4)
            .saturating_sub(RECORD_HEADER + SECTOR)
            .max(SECTOR);
        let mut pieces = split(ranges, max_body).peekable();
        loop {
            let durable = self.durable.load(Ordering::Acquire);
            let mut head = RecordHead::data(w.next_seq, w.word, durable, self.session());
            let mut chunk = Vec::new();
            let mut body = 0u64;
            while let Some(&(offset, len)) = pieces.peek() {
                let need = format::range_len(len);
                if body + need > max_body && !chunk.is_empty() {
                    break;
                }
                body += need;
                chunk.push((offset, len));
                pieces.next();
            }
            let last = pieces.peek().is_none();
            if last && let Some(word) = word {
                head.word = word.max(w.word);
            }
            w.buf.begin(head);
            for &(offset, len) in &chunk {
                let dst = w.buf.push(offset, len);
                region.read(offset, dst)?;
            }
            let record_len = w.buf.finish().len() as u64;
            let at = self.place(w, record_len)?;
            if let Err(e) = self.device.write(at, w.buf.bytes()) {
                return Err(self.poison(e));
            }
            w.vpos += record_len;
            w.word = head.word;
            w.next_seq += 1;
            // ORDERING: Release pairs with the Acquire in `commit`: a committer that reads
            // this sequence number finds the record written before its `fdatasync`.
            self.sealed.store(w.next_seq - 1, Ordering::Release);
            // ORDERING: a statistic for the background bound.
            self.unsynced.fetch_add(record_len, Ordering::Relaxed);
            if last {
                return Ok(w.next_seq - 1);
            }
        }
    }

    /// Finds room for a record of `len` bytes at the writer's position, writing a wrap
    /// record first if it would cross the ring's end, and checkpointing in line if the ring
    /// is full. Returns the physical offset to write it at.
    fn place(&self, w: &mut Writer, len: u64) -> Result<u64> {
        loop {
            let room = self.ring - w.vpos % self.ring;
            let wraps = len > room;
            let end = w.vpos + if wraps { room + len } else { len };
            if end - w.vtail > self.ring {
                self.checkpoint_locked(w)?;
                continue;
            }
            if wraps {
                let durable = self.durable.load(Ordering::Acquire);
                let head = RecordHead::wrap(w.next_seq, w.word, durable, self.session());
                format::wrap_record(head, &mut w.scratch);
                let at = RECORDS_START + w.vpos % self.ring;
                if let Err(e) = self.device.write(at, &w.scratch) {
                    return Err(self.poison(e));
                }
                w.vpos += room;
            }
            return Ok(RECORDS_START + w.vpos % self.ring);
        }
    }

    /// The last record sealed.
    pub(crate) fn last_sealed(&self) -> Ticket {
        // ORDERING: pairs with the Release in `seal`.
        self.sealed.load(Ordering::Acquire)
    }

    /// How many sealed records are not durable yet.
    pub(crate) fn uncommitted(&self) -> u64 {
        // ORDERING: both loads pair with their Release stores; a snapshot is enough for a
        // bound the caller enforces under the advance lock.
        self.last_sealed()
            .saturating_sub(self.durable.load(Ordering::Acquire))
    }

    /// Whether record `ticket` is durable.
    pub(crate) fn is_durable(&self, ticket: Ticket) -> bool {
        // ORDERING: pairs with the Release in `commit` and `checkpoint`.
        self.durable.load(Ordering::Acquire) >= ticket
    }

    /// Makes every record up to `ticket` durable: one `fdatasync` of the journal, shared by
    /// every caller waiting at the same time (group commit).
    pub(crate) fn commit(&self, ticket: Ticket) -> Result<()> {
        self.check()?;
        if self.is_durable(ticket) {
            return Ok(());
        }
        let _commit = lock(&self.commit_lock);
        if self.is_durable(ticket) {
            return Ok(());
        }
        self.check()?;
        let target = self.last_sealed();
        // ORDERING: a statistic; taken before the flush so that nothing sealed after it
        // is forgotten.
        self.unsynced.store(0, Ordering::Relaxed);
        if let Err(e) = self.sync_journal() {
            return Err(self.poison(e));
        }
        // ORDERING: Release pairs with the Acquire in `is_durable`.
        self.durable.fetch_max(target, Ordering::Release);
        *lock(&self.last_commit) = Instant::now();
        Ok(())
    }

    /// Whether the background should commit: something sealed is not durable and either
    /// `interval` has passed since the last commit or an eighth of the ring is waiting.
    pub(crate) fn commit_due(&self, interval: std::time::Duration) -> bool {
        !self.is_durable(self.last_sealed())
            && (lock(&self.last_commit).elapsed() >= interval
                // ORDERING: a statistic.
                || self.unsynced.load(Ordering::Relaxed) >= self.ring / 8)
    }

    /// Whether the live part of the ring has passed three quarters of it: late enough that
    /// a page of the heap file dirtied again and again is written back once per checkpoint,
    /// early enough that the last quarter absorbs what is sealed while the checkpoint runs.
    pub(crate) fn checkpoint_due(&self) -> bool {
        let w = lock(&self.writer);
        w.vpos - w.vtail > self.ring / 4 * 3
    }

    /// Makes the heap file durable up to the last sealed record, records that in the header
    /// and frees the ring space before it. Runs beside sealing; only the header update
    /// holds the writer.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        self.check()?;
        let _one = lock(&self.checkpoint_lock);
        let (seq, word, vpos) = {
            let w = lock(&self.writer);
            (w.next_seq - 1, w.word, w.vpos)
        };
        // Every record up to `seq` was copied out of the mapping, so the mapping holds it.
        if let Err(e) = self.sync_data() {
            return Err(self.poison(e));
        }
        let mut w = lock(&self.writer);
        if seq > w.checkpoint_seq {
            self.write_header(&mut w, seq, word, vpos)?;
        }
        Ok(())
    }

    /// A checkpoint by a writer that found the ring full: everything written so far.
    fn checkpoint_locked(&self, w: &mut Writer) -> Result<()> {
        if let Err(e) = self.sync_data() {
            return Err(self.poison(e));
        }
        self.checkpoint_here(w)
    }

    /// Names the writer's position as the checkpoint: everything sealed so far must be
    /// durable in the heap file already.
    fn checkpoint_here(&self, w: &mut Writer) -> Result<()> {
        let (seq, word, vpos) = (w.next_seq - 1, w.word, w.vpos);
        self.write_header(w, seq, word, vpos)
    }

    fn write_header(&self, w: &mut Writer, seq: u64, word: u64, start: u64) -> Result<()> {
        let slot = 1 - w.slot;
        let header = Header {
            creation_id: self.creation_id,
            journal_id: self.id,
            generation: w.generation + 1,
            checkpoint_seq: seq,
            checkpoint_word: word,
            start,
            session: self.session(),
        };
        if let Err(e) = self
            .device
            .write(SLOTS[slot], &header.encode())
            .and_then(|()| self.sync_journal())
        {
            return Err(self.poison(e));
        }
        w.slot = slot;
        w.generation += 1;
        w.checkpoint_seq = seq;
        w.vtail = start;
        // The heap file holds every record up to `seq` durably now.
        // ORDERING: Release pairs with the Acquire in `is_durable`.
        self.durable.fetch_max(seq, Ordering::Release);
        Ok(())
    }

    /// Recovery: validates the records after the checkpoint, then hands each valid record's
    /// ranges to `apply` in order. Nothing is applied if the journal is damaged before its
    /// last valid record. Afterwards the caller makes the heap file durable and calls
    /// [`fold`](Self::fold).
    pub(crate) fn replay(
        &self,
        mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Replayed> {
        let (start, first_seq, mut word) = {
            let w = lock(&self.writer);
            (w.vtail, w.next_seq, w.word)
        };
        let found = self.scan(start, first_seq)?;
        let mut replayed = Replayed {
            records: 0,
            bytes: 0,
            word,
        };
        let mut body = Vec::new();
        for &(at, head) in &found.records {
            body.resize(head.body_len as usize, 0);
            self.device
                .read(at + RECORD_HEADER, &mut body)
                .map_err(|e| Error::WriteBack { source: e })?;
            for (offset, bytes) in format::ranges(&body) {
                apply(offset, bytes)?;
                replayed.bytes += bytes.len() as u64;
            }
            replayed.records += 1;
            word = head.word;
        }
        replayed.word = word;
        let mut w = lock(&self.writer);
        w.next_seq = first_seq + found.records.len() as u64;
        w.vpos = found.end;
        w.word = word;
        self.sealed.store(w.next_seq - 1, Ordering::Release);
        Ok(replayed)
    }

    /// After replay and a durable heap file: a new checkpoint at the end of what was
    /// replayed, so the records are not replayed again and the ring after them is free,
    /// and a new session, so that records the crashed run left beyond that end are never
    /// taken for this run's.
    pub(crate) fn fold(&self) -> Result<()> {
        // ORDERING: set before the header that names it is written, under the writer lock
        // below; no record is written before `fold` returns.
        self.session.store(new_session(), Ordering::Relaxed);
        self.checkpoint_here(&mut lock(&self.writer))
    }

    /// The valid records from ring position `start`, expected to begin with `first_seq`.
    fn scan(&self, start: u64, first_seq: u64) -> Result<Scan> {
        let io = |e| Error::WriteBack { source: e };
        let mut records = Vec::new();
        let mut v = start;
        let mut seq = first_seq;
        let mut head_bytes = [0u8; 64];
        let mut body = Vec::new();
        while v - start < self.ring {
            let at = RECORDS_START + v % self.ring;
            self.device.read(at, &mut head_bytes).map_err(io)?;
            let Some(head) = RecordHead::decode(&head_bytes) else {
                break;
            };
            if head.session != self.session() || head.seq != seq {
                break;
            }
            let room = self.ring - v % self.ring;
            if head.padded_len() > room {
                break;
            }
            body.resize(head.body_len as usize, 0);
            self.device
                .read(at + RECORD_HEADER, &mut body)
                .map_err(io)?;
            if !head.verify(&head_bytes, &body) {
                break;
            }
            if head.wrap {
                v += room;
                continue;
            }
            records.push((at, head));
            v += head.padded_len();
            seq += 1;
        }
        self.check_no_later_durable(v, start + self.ring, seq)?;
        Ok(Scan { records, end: v })
    }

    /// Fails if a valid record after ring position `from` (and before `until`) says record
    /// `missing` was durable: then the journal was damaged, not torn at its end.
    fn check_no_later_durable(&self, from: u64, until: u64, missing: u64) -> Result<()> {
        const CHUNK: u64 = 1 << 20;
        let io = |e| Error::WriteBack { source: e };
        let mut v = from + SECTOR;
        let mut buf = Vec::new();
        while v < until {
            let at = RECORDS_START + v % self.ring;
            let len = CHUNK.min(self.ring - v % self.ring).min(until - v);
            buf.resize(len as usize, 0);
            self.device.read(at, &mut buf).map_err(io)?;
            for (i, sector) in buf.chunks(SECTOR as usize).enumerate() {
                let Some(head) = RecordHead::decode(sector) else {
                    continue;
                };
                if head.session != self.session() || head.seq < missing || head.durable < missing {
                    continue;
                }
                let rat = at + i as u64 * SECTOR;
                let mut body = vec![0u8; head.body_len as usize];
                if rat + RECORD_HEADER + head.body_len > self.device.len() {
                    continue;
                }
                self.device
                    .read(rat + RECORD_HEADER, &mut body)
                    .map_err(io)?;
                if head.verify(sector, &body) {
                    return Err(Error::Corrupted {
                        offset: RECORDS_START + (from % self.ring),
                        what: "the journal is damaged before its last valid record",
                    });
                }
            }
            v += len;
        }
        Ok(())
    }
}

/// The durable epoch word a journal file's bytes carry: that of its last valid record, or
/// of its checkpoint. `None` without a valid header, or if the journal is damaged.
#[cfg(any(test, feature = "sim"))]
pub(crate) fn durable_word_of(bytes: crate::persist::pages::Pages) -> Option<u64> {
    use crate::config::SimMode;
    use crate::persist::pages::Pages;
    use crate::persist::sim::Simulator;
    let sim = Simulator::new(SimMode::File, Pages::default(), Some(bytes));
    let device = Device::Sim(std::sync::Arc::new(sim));
    let (slot, header) = Journal::read_header(&device).ok()??;
    let journal = Journal::new(device, header, slot).ok()?;
    journal
        .replay(|_, _| Ok(()))
        .ok()
        .map(|replayed| replayed.word)
}

/// A random session id.
fn new_session() -> u64 {
    crate::random::random_u64()
}

/// The valid records a scan found: their physical offsets and headers, and the ring
/// position after the last.
struct Scan {
    records: Vec<(u64, RecordHead)>,
    end: u64,
}

/// Sorts `ranges` and merges overlapping and adjacent ones, in place.
fn merge(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable_by_key(|&(offset, _)| offset);
    // `ranges[..kept]` are the merged ranges so far, each ending before the next begins.
    let mut kept: usize = 0;
    for i in 0..ranges.len() {
        let (offset, len) = ranges[i];
        if let Some(last) = kept.checked_sub(1).map(|k| &mut ranges[k])
            && offset <= last.0 + last.1
        {
            last.1 = last.1.max(offset + len - last.0);
            continue;
        }
        ranges[kept] = (offset, len);
        kept += 1;
    }
    ranges.truncate(kept);
}

/// `ranges` cut so that no piece needs more than `max_body` bytes of record body; pieces
/// of one range are cut at cache-line multiples.
fn split(ranges: &[(u64, u64)], max_body: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let max = (max_body - format::RANGE_HEADER) / 64 * 64;
    ranges.iter().flat_map(move |&(offset, len)| {
        let pieces = len.div_ceil(max).max(1);
        (0..pieces).map(move |i| {
            let at = i * max;
            (offset + at, max.min(len - at))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::mapping::Mapping;
    use crate::config::SimMode;
    use crate::persist::pages::Pages;
    use crate::persist::sim::Simulator;
    use proptest::prelude::*;
    use std::sync::Arc;

    const HEAP: usize = 1 << 16;

    /// A logging journal of the smallest size on the simulator, over an empty heap.
    fn new_journal() -> (Arc<Simulator>, Journal, Region) {
        let sim = Arc::new(Simulator::new(
            SimMode::File,
            Pages::zeroed(HEAP),
            Some(Pages::zeroed(format::MIN_LEN as usize)),
        ));
        let device = Device::Sim(sim.clone());
        let header = Journal::format(&device, 1, 2, 1).unwrap();
        let journal = Journal::new(device, header, 0).unwrap();
        journal.start_logging();
        (
            sim,
            journal,
            Region::new(Mapping::anonymous(HEAP, true).unwrap()),
        )
    }

    /// A journal with five committed one-sector records: record `i` (seq `i + 1`) holds 100
    /// bytes of `i + 1` at `4096 i` and carries word `i + 2`.
    fn five_records() -> Arc<Simulator> {
        let (sim, journal, region) = new_journal();
        for i in 0..5u64 {
            region.write(4096 * i, &[i as u8 + 1; 100]).unwrap();
            journal.flush(4096 * i, 100).unwrap();
            let ticket = journal.seal(&region, Some(i + 2)).unwrap();
            journal.commit(ticket).unwrap();
        }
        sim
    }

    /// A seal hands the flushers back an empty list with the capacity of an earlier seal's,
    /// and what the records hold is what was flushed (ranges given together, in one call,
    /// as the advance gives them, or one at a time).
    #[test]
    fn a_seal_keeps_the_flushers_list_and_records_every_range() {
        let (sim, journal, region) = new_journal();
        let ranges: Vec<(u64, u64)> = (0..64u64).map(|i| (512 * i, 100)).collect();
        for round in 0..3u64 {
            for &(offset, len) in &ranges {
                region
                    .write(offset, &[round as u8 + 1; 100][..len as usize])
                    .unwrap();
            }
            if round == 1 {
                for &(offset, len) in &ranges {
                    journal.flush(offset, len).unwrap();
                }
            } else {
                journal.flush_all(&ranges).unwrap();
            }
            // An empty range is no range.
            journal.flush_all(&[(8192, 0)]).unwrap();
            let ticket = journal.seal(&region, Some(round + 2)).unwrap();
            journal.commit(ticket).unwrap();
            if round > 0 {
                assert!(lock(&journal.pending).capacity() >= ranges.len());
            }
        }
        let (word, image) = replay_onto(Device::Sim(sim.clone()), vec![0; HEAP]).unwrap();
        assert_eq!(word, 4);
        for &(offset, len) in &ranges {
            let at = offset as usize;
            assert!(image[at..at + len as usize].iter().all(|&b| b == 3));
            assert!(image[at + len as usize..at + 512].iter().all(|&b| b == 0));
        }
    }

    /// Replays the journal on `device` onto `image`; the durable word and the image.
    fn replay_onto(device: Device, mut image: Vec<u8>) -> Result<(u64, Vec<u8>)> {
        let (slot, header) = Journal::read_header(&device).unwrap().unwrap();
        let journal = Journal::new(device, header, slot).unwrap();
        let replayed = journal.replay(|offset, bytes| {
            image[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
            Ok(())
        })?;
        Ok((replayed.word, image))
    }

    fn replay(sim: &Arc<Simulator>) -> Result<(u64, Vec<u8>)> {
        replay_onto(Device::Sim(sim.clone()), vec![0; HEAP])
    }

    fn damage(sim: &Simulator, record: u64) {
        let at = RECORDS_START + SECTOR * record + RECORD_HEADER + 20;
        sim.journal_write(at, &[0xEE]).unwrap();
    }

    #[test]
    fn replay_applies_every_committed_record_in_order() {
        let sim = five_records();
        let (word, image) = replay(&sim).unwrap();
        assert_eq!(word, 6);
        for i in 0..5usize {
            assert_eq!(image[4096 * i..4096 * i + 100], [i as u8 + 1; 100]);
        }
    }

    #[test]
    fn a_torn_last_record_ends_the_journal() {
        let sim = five_records();
        damage(&sim, 4);
        let (word, image) = replay(&sim).unwrap();
        assert_eq!(word, 5, "the word of the last valid record");
        assert_eq!(image[4 * 4096], 0, "the torn record was not applied");
        assert_eq!(image[3 * 4096], 4);
    }

    #[test]
    fn replay_over_the_last_checkpoint_gives_the_committed_heap_across_wraps() {
        for seed in 0..24 {
            replay_gives_the_committed_heap(seed);
        }
    }

    fn replay_gives_the_committed_heap(seed: u64) {
        let (sim, journal, region) = new_journal();
        let mut rng = crate::persist::sim::SplitMix64::new(seed);
        // About 10 ring lengths of records: wraps, checkpoints in the background and in
        // line; the records replayed cross the ring's end for some seeds.
        for i in 0..300u64 {
            let len = 1 + rng.below_or_equal(3000);
            let offset = rng.below_or_equal(HEAP as u64 - len);
            let bytes = vec![(i % 251) as u8; len as usize];
            sim.write(&region, offset, &bytes).unwrap();
            journal.flush(offset, len).unwrap();
            let ticket = journal.seal(&region, Some(i + 2)).unwrap();
            if rng.below_or_equal(3) == 0 {
                journal.commit(ticket).unwrap();
            }
            if journal.checkpoint_due() && rng.below_or_equal(1) == 0 {
                journal.checkpoint().unwrap();
            }
        }
        journal.commit(journal.last_sealed()).unwrap();
        let (heap, journal_bytes) = sim.durable().into_parts();
        let replay_sim = Simulator::new(SimMode::File, Pages::default(), journal_bytes);
        let (word, image) = replay_onto(Device::Sim(Arc::new(replay_sim)), heap.to_vec()).unwrap();
        assert_eq!(word, 301);
        let mut now = vec![0u8; HEAP];
        region.read(0, &mut now).unwrap();
        assert!(
            image == now,
            "seed {seed}: the replayed heap differs from the committed one"
        );
    }

    #[test]
    fn a_damaged_record_before_a_durable_one_is_an_error() {
        let sim = five_records();
        damage(&sim, 1);
        let err = replay(&sim).unwrap_err();
        assert!(
            matches!(err, Error::Corrupted { what, .. } if what.contains("damaged")),
            "{err:?}"
        );
    }

    proptest! {
        #[test]
        fn merged_ranges_cover_exactly_the_same_bytes(
            input in proptest::collection::vec((0u64..200, 1u64..20), 0..30)
        ) {
            let mut ranges = input.clone();
            merge(&mut ranges);
            let bytes = |r: &[(u64, u64)]| {
                r.iter().flat_map(|&(o, l)| o..o + l).collect::<std::collections::BTreeSet<_>>()
            };
            prop_assert_eq!(bytes(&ranges), bytes(&input));
            prop_assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
        }

        #[test]
        fn split_pieces_fit_and_cover_the_range(offset in 0u64..1 << 20, len in 1u64..1 << 16) {
            let max_body = 4096;
            let pieces: Vec<_> = split(&[(offset, len)], max_body).collect();
            prop_assert!(pieces.iter().all(|&(_, l)| format::range_len(l) <= max_body));
            prop_assert_eq!(pieces.iter().map(|p| p.1).sum::<u64>(), len);
            prop_assert!(pieces.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        }
    }
}
