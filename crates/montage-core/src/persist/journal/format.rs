//! The journal file's bytes: its header slots and its records. Pure encoding and decoding;
//! `docs/design.md` ("The journal") carries the same tables.
//!
//! ```text
//! Journal file
//! 0x0000  header slot 0         one sector (512 B)
//! 0x0200  header slot 1         one sector
//! 0x1000  records               a ring up to the end of the file, SECTOR-aligned
//!
//! Header slot (the valid slot with the larger generation wins)
//! 0x00  magic            [u8; 8]  "MONTJRNL"
//! 0x08  format version   u32
//! 0x0C  checksum         u32      crc32c of bytes 0x00..0x48 with this field zero
//! 0x10  creation id      u64      the heap's
//! 0x18  journal id       u64      random, nonzero; the heap's superblock names it
//! 0x20  generation       u64      one more at every header write
//! 0x28  checkpoint seq   u64      the last record the data file holds durably
//! 0x30  checkpoint word  u64      the epoch word that record carried
//! 0x38  start            u64      ring position (virtual) of record checkpoint seq + 1
//! 0x40  session          u64      random per open: the records after `start` carry it
//!
//! Record header (64 B; a record starts on a sector and is padded to whole sectors)
//! 0x00  magic            u32      "JREC"
//! 0x04  kind             u32      1 = data, 2 = wrap (the ring continues at its start)
//! 0x08  seq              u64      one more than the record before it
//! 0x10  word             u64      the epoch word when the record was sealed
//! 0x18  durable          u64      the last seq known durable when it was sealed
//! 0x20  session          u64      the header's session when the record was written
//! 0x28  body length      u32      bytes after the header
//! 0x2C  checksum         u32      crc32c of header (this field zero) and body
//! 0x30  range count      u32
//! 0x34  reserved         [u8; 12] zero
//!
//! Record body: per range, offset u64, length u64, then the bytes, padded to 8.
//! ```
//!
//! The session tells this open's records from a crashed run's that recovery cut off: a
//! record of the crashed run may lie, whole and valid, right where this run's next record
//! would go, with the very sequence number that record would have.
//!
//! Ring positions are virtual: they only grow, and position `v` lives at byte
//! `RECORDS_START + v % ring` of the file. A record never crosses the ring's end; the
//! writer puts a wrap record where the next one would not fit.

#![deny(
    clippy::arithmetic_side_effects,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

/// The first eight bytes of a journal's header slots.
pub(crate) const MAGIC: [u8; 8] = *b"MONTJRNL";
/// The journal format this build reads and writes.
pub(crate) const VERSION: u32 = 1;
/// The unit a device writes atomically, and the alignment of records.
pub(crate) const SECTOR: u64 = 512;
/// Where the header slots are.
pub(crate) const SLOTS: [u64; 2] = [0, SECTOR];
/// Where the ring of records begins.
pub(crate) const RECORDS_START: u64 = 0x1000;
/// The smallest journal: the header page and a 64 KiB ring.
pub(crate) const MIN_LEN: u64 = crate::config::MIN_JOURNAL_LEN;
const _: () = assert!(MIN_LEN == RECORDS_START + (64 << 10));
/// The length of a record header.
pub(crate) const RECORD_HEADER: u64 = 64;
/// The length of a range's header inside a record body.
pub(crate) const RANGE_HEADER: u64 = 16;

const RECORD_MAGIC: u32 = 0x4345_524A; // "JREC"
const KIND_DATA: u32 = 1;
const KIND_WRAP: u32 = 2;

/// What a header slot says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) creation_id: u64,
    pub(crate) journal_id: u64,
    pub(crate) generation: u64,
    pub(crate) checkpoint_seq: u64,
    pub(crate) checkpoint_word: u64,
    pub(crate) start: u64,
    pub(crate) session: u64,
}

/// The bytes of a header slot that its checksum covers.
const HEADER_LEN: usize = 0x48;

fn word(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at.saturating_add(8))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn half(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at.saturating_add(4))
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    if let Some(dst) = bytes.get_mut(at..at.saturating_add(value.len())) {
        dst.copy_from_slice(value);
    }
}

impl Header {
    /// The slot's bytes, checksum included.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        put(&mut out, 0x00, &MAGIC);
        put(&mut out, 0x08, &VERSION.to_le_bytes());
        put(&mut out, 0x10, &self.creation_id.to_le_bytes());
        put(&mut out, 0x18, &self.journal_id.to_le_bytes());
        put(&mut out, 0x20, &self.generation.to_le_bytes());
        put(&mut out, 0x28, &self.checkpoint_seq.to_le_bytes());
        put(&mut out, 0x30, &self.checkpoint_word.to_le_bytes());
        put(&mut out, 0x38, &self.start.to_le_bytes());
        put(&mut out, 0x40, &self.session.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        put(&mut out, 0x0C, &crc.to_le_bytes());
        out
    }

    /// The header a slot holds, if its magic, version and checksum are right.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Header> {
        let slot = bytes.get(..HEADER_LEN)?;
        if slot.get(..8)? != MAGIC || half(slot, 0x08) != VERSION {
            return None;
        }
        let mut copy = [0u8; HEADER_LEN];
        copy.copy_from_slice(slot);
        put(&mut copy, 0x0C, &[0; 4]);
        if crc32c::crc32c(&copy) != half(slot, 0x0C) {
            return None;
        }
        Some(Header {
            creation_id: word(slot, 0x10),
            journal_id: word(slot, 0x18),
            generation: word(slot, 0x20),
            checkpoint_seq: word(slot, 0x28),
            checkpoint_word: word(slot, 0x30),
            start: word(slot, 0x38),
            session: word(slot, 0x40),
        })
    }

    /// Of two slots' contents, the valid header with the larger generation.
    pub(crate) fn newest(slot0: &[u8], slot1: &[u8]) -> Option<(usize, Header)> {
        match (Header::decode(slot0), Header::decode(slot1)) {
            (Some(a), Some(b)) if b.generation > a.generation => Some((1, b)),
            (Some(a), _) => Some((0, a)),
            (None, Some(b)) => Some((1, b)),
            (None, None) => None,
        }
    }
}

/// What a record header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHead {
    pub(crate) wrap: bool,
    pub(crate) seq: u64,
    pub(crate) word: u64,
    pub(crate) durable: u64,
    pub(crate) session: u64,
    pub(crate) body_len: u64,
    crc: u32,
    pub(crate) ranges: u32,
}

impl RecordHead {
    /// A data record's header, its checksum still to be filled in by [`RecordBuf::finish`].
    pub(crate) fn data(seq: u64, word: u64, durable: u64, session: u64) -> RecordHead {
        RecordHead {
            wrap: false,
            seq,
            word,
            durable,
            session,
            body_len: 0,
            crc: 0,
            ranges: 0,
        }
    }

    /// A wrap record: the ring goes on at its start with record `seq`.
    pub(crate) fn wrap(seq: u64, word: u64, durable: u64, session: u64) -> RecordHead {
        RecordHead {
            wrap: true,
            ..RecordHead::data(seq, word, durable, session)
        }
    }

    fn encode_into(&self, out: &mut [u8]) {
        put(out, 0x00, &RECORD_MAGIC.to_le_bytes());
        let kind = if self.wrap { KIND_WRAP } else { KIND_DATA };
        put(out, 0x04, &kind.to_le_bytes());
        put(out, 0x08, &self.seq.to_le_bytes());
        put(out, 0x10, &self.word.to_le_bytes());
        put(out, 0x18, &self.durable.to_le_bytes());
        put(out, 0x20, &self.session.to_le_bytes());
        let body = u32::try_from(self.body_len).unwrap_or(u32::MAX);
        put(out, 0x28, &body.to_le_bytes());
        put(out, 0x2C, &self.crc.to_le_bytes());
        put(out, 0x30, &self.ranges.to_le_bytes());
        if let Some(rest) = out.get_mut(0x34..0x40) {
            rest.fill(0);
        }
    }

    /// Parses a record header; `None` unless the magic and kind are right. The checksum is
    /// checked by [`verify`](Self::verify) once the body is read.
    pub(crate) fn decode(bytes: &[u8]) -> Option<RecordHead> {
        let head = bytes.get(..64)?;
        if half(head, 0x00) != RECORD_MAGIC {
            return None;
        }
        let wrap = match half(head, 0x04) {
            KIND_DATA => false,
            KIND_WRAP => true,
            _ => return None,
        };
        Some(RecordHead {
            wrap,
            seq: word(head, 0x08),
            word: word(head, 0x10),
            durable: word(head, 0x18),
            session: word(head, 0x20),
            body_len: u64::from(half(head, 0x28)),
            crc: half(head, 0x2C),
            ranges: half(head, 0x30),
        })
    }

    /// Whether `header` (the record's 64 header bytes) and `body` carry this checksum.
    pub(crate) fn verify(&self, header: &[u8], body: &[u8]) -> bool {
        let Some(head) = header.get(..64) else {
            return false;
        };
        let mut copy = [0u8; 64];
        copy.copy_from_slice(head);
        put(&mut copy, 0x2C, &[0; 4]);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&copy), body);
        crc == self.crc
    }

    /// The record's length on the ring: header and body, padded to whole sectors.
    pub(crate) fn padded_len(&self) -> u64 {
        padded(RECORD_HEADER.saturating_add(self.body_len))
    }
}

/// `len` rounded up to whole sectors.
pub(crate) fn padded(len: u64) -> u64 {
    len.div_ceil(SECTOR).saturating_mul(SECTOR)
}

/// The bytes a range takes in a record body.
pub(crate) fn range_len(len: u64) -> u64 {
    RANGE_HEADER.saturating_add(len.div_ceil(8).saturating_mul(8))
}

/// Builds one record in a reusable buffer: [`begin`](Self::begin), [`push`](Self::push) each
/// range, then [`finish`](Self::finish).
#[derive(Debug, Default)]
pub(crate) struct RecordBuf {
    bytes: Vec<u8>,
    head: Option<RecordHead>,
}

impl RecordBuf {
    /// Starts a record with header `head`.
    pub(crate) fn begin(&mut self, head: RecordHead) {
        self.bytes.clear();
        self.bytes.resize(64, 0);
        self.head = Some(head);
    }

    /// Appends a range header for `len` bytes at `offset` and returns the (zeroed) space for
    /// the bytes themselves, for the caller to fill.
    pub(crate) fn push(&mut self, offset: u64, len: u64) -> &mut [u8] {
        let start = self.bytes.len();
        let data_at = start.saturating_add(16);
        let end = start.saturating_add(usize::try_from(range_len(len)).unwrap_or(usize::MAX));
        self.bytes.resize(end, 0);
        put(&mut self.bytes, start, &offset.to_le_bytes());
        put(&mut self.bytes, start.saturating_add(8), &len.to_le_bytes());
        if let Some(head) = &mut self.head {
            head.ranges = head.ranges.saturating_add(1);
        }
        let data_end = data_at.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        self.bytes.get_mut(data_at..data_end).unwrap_or_default()
    }

    /// The record as [`finish`](Self::finish) left it.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The body bytes so far.
    pub(crate) fn body_len(&self) -> u64 {
        (self.bytes.len() as u64).saturating_sub(RECORD_HEADER)
    }

    /// Fills in the header and checksum, pads to whole sectors, and returns the record.
    pub(crate) fn finish(&mut self) -> &[u8] {
        let Some(mut head) = self.head.take() else {
            return &[];
        };
        head.body_len = self.body_len();
        head.crc = 0;
        head.encode_into(&mut self.bytes);
        let (header, body) = self.bytes.split_at(64);
        let crc = crc32c::crc32c_append(crc32c::crc32c(header), body);
        head.crc = crc;
        head.encode_into(&mut self.bytes);
        let padded = usize::try_from(head.padded_len()).unwrap_or(usize::MAX);
        self.bytes.resize(padded, 0);
        &self.bytes
    }
}

/// The ranges of a record body, as `(offset, bytes)`; stops at the first range that does
/// not fit in the body (a checksummed body never has one).
pub(crate) fn ranges(body: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let offset = body.get(at..at.checked_add(8)?)?;
        let offset = u64::from_le_bytes(offset.try_into().ok()?);
        let len = word(body, at.checked_add(8)?);
        let data_at = at.checked_add(16)?;
        let len_usize = usize::try_from(len).ok()?;
        let bytes = body.get(data_at..data_at.checked_add(len_usize)?)?;
        at = at.checked_add(usize::try_from(range_len(len)).ok()?)?;
        Some((offset, bytes))
    })
}

/// Encodes a wrap record into `out` (one sector).
pub(crate) fn wrap_record(head: RecordHead, out: &mut Vec<u8>) {
    let mut buf = RecordBuf::default();
    buf.begin(head);
    out.clear();
    out.extend_from_slice(buf.finish());
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::cast_possible_truncation
)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_header_round_trips_and_any_changed_byte_invalidates_it() {
        let header = Header {
            creation_id: 7,
            journal_id: 9,
            generation: 3,
            checkpoint_seq: 41,
            checkpoint_word: 12,
            start: 8192,
            session: 5,
        };
        let bytes = header.encode();
        assert_eq!(Header::decode(&bytes), Some(header));
        for at in 0..bytes.len() {
            let mut bad = bytes;
            bad[at] ^= 0x10;
            assert_eq!(Header::decode(&bad), None, "byte {at}");
        }
    }

    #[test]
    fn the_newest_valid_slot_wins() {
        let a = Header {
            creation_id: 1,
            journal_id: 2,
            generation: 5,
            checkpoint_seq: 0,
            checkpoint_word: 1,
            start: 0,
            session: 3,
        };
        let b = Header { generation: 6, ..a };
        assert_eq!(Header::newest(&a.encode(), &b.encode()), Some((1, b)));
        assert_eq!(Header::newest(&b.encode(), &a.encode()), Some((0, b)));
        assert_eq!(Header::newest(&a.encode(), &[0; 72]), Some((0, a)));
        assert_eq!(Header::newest(&[0; 72], &[1; 72]), None);
    }

    proptest! {
        #[test]
        fn records_round_trip_and_detect_any_flipped_bit(
            ranges in proptest::collection::vec(
                (0u64..1 << 30, proptest::collection::vec(any::<u8>(), 0..100)), 0..8),
            flip in any::<prop::sample::Index>(),
        ) {
            let mut buf = RecordBuf::default();
            buf.begin(RecordHead::data(5, 9, 4, 77));
            for (offset, bytes) in &ranges {
                buf.push(*offset, bytes.len() as u64).copy_from_slice(bytes);
            }
            let record = buf.finish().to_vec();
            prop_assert_eq!(record.len() as u64 % SECTOR, 0);
            let head = RecordHead::decode(&record).unwrap();
            prop_assert_eq!(head.padded_len(), record.len() as u64);
            let body = &record[64..64 + head.body_len as usize];
            prop_assert!(head.verify(&record[..64], body));
            let got: Vec<(u64, Vec<u8>)> = super::ranges(body).map(|(o, b)| (o, b.to_vec())).collect();
            prop_assert_eq!(&got, &ranges);
            // Any flipped bit in the header or body is caught (by the magic, the kind or
            // the checksum).
            let covered = 64 + head.body_len as usize;
            let at = flip.index(covered * 8);
            let mut bad = record.clone();
            bad[at / 8] ^= 1 << (at % 8);
            let caught = match RecordHead::decode(&bad) {
                None => true,
                Some(h) => {
                    let len = (h.body_len as usize).min(bad.len() - 64);
                    !h.verify(&bad[..64], &bad[64..64 + len])
                }
            };
            prop_assert!(caught);
        }
    }
}
