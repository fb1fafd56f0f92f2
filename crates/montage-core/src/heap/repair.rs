//! Repair (`HeapConfig::repair`): what a damaged heap's checksums prove intact is kept, the
//! rest is dropped, and every step is reported as a [`Repair`].
//!
//! Repair runs inside an ordinary open, in two places. Before the file is mapped
//! ([`fix_file`]): the superblock, the span count word and the file's length, the
//! clean-shutdown flag, and the journal the heap names. Once it is mapped and before
//! recovery reads them ([`fix_tables`]): the directory, the type registry and the span
//! table. Recovery then drops the damaged blocks instead of leaving them (`Options::repair`)
//! and gives the payloads of an owner the directory lost a name ([`adopt`]).
//!
//! An entry that fails its checksum is first tried for a one-byte correction: if exactly
//! one change of one byte makes its checksum hold, that is taken (the checksums are crc32c,
//! so a second such change is a 1 in 2^32 chance per candidate for the superblock and the
//! tables). Beyond that each kind of entry has its own fallback, documented at
//! [`HeapConfig::repair`](crate::HeapConfig::repair).

use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::attach;
use super::directory::parse_entry;
use crate::alloc::read_header;
use crate::alloc::size_class::{NUM_CLASSES, blocks_per_span, class_for, class_size};
use crate::base::layout::{
    CLEAN_SHUTDOWN_OFFSET, DIR_OWNER_OFFSET, DIRECTORY, ENTRY_VALID_OFFSET, EntryTable, Geometry,
    HEADER_LEN, JOURNAL_ID_OFFSET, NAME_MAX, REGISTRY, SPAN_COUNT_OFFSET, SPAN_SIZE,
    SUPERBLOCK_HEAD_LEN, SpanEntry, TRAILER_LEN, block_capacity, decode_span_count,
    span_count_word,
};
use crate::error::{Error, Result};
use crate::meta::table::{self, Body};
use crate::persist::{Media, allocate_file};
use crate::recovery::Repair;

/// The one change of one byte of `bytes` that makes `valid` hold, if exactly one does.
fn correct_one_byte(bytes: &[u8], valid: impl Fn(&[u8]) -> bool) -> Option<(usize, u8)> {
    let mut found = None;
    let mut candidate = bytes.to_vec();
    for (at, &was) in bytes.iter().enumerate() {
        for value in (0..=u8::MAX).filter(|&v| v != was) {
            candidate[at] = value;
            if valid(&candidate) {
                if found.is_some() {
                    return None;
                }
                found = Some((at, value));
            }
        }
        candidate[at] = was;
    }
    found
}

fn repaired(repairs: &mut Vec<Repair>, offset: u64, what: String) {
    repairs.push(Repair { offset, what });
}

/// The heap file being repaired, read and written with `pread`/`pwrite` before it is
/// mapped.
#[derive(Clone, Copy)]
struct HeapFile<'a> {
    file: &'a File,
    path: &'a Path,
}

impl HeapFile<'_> {
    fn word(self, offset: u64) -> Result<u64> {
        let mut bytes = [0u8; 8];
        self.file
            .read_exact_at(&mut bytes, offset)
            .map_err(|e| Error::io("read", self.path, e))?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn write(self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io("write", self.path, e))
    }
}

/// The file-level repairs, on the heap file `file` at `path` (open for writing and locked),
/// before it is mapped. Durable when it returns.
///
/// # Errors
///
/// What cannot be repaired: a superblock damaged in more than one byte (the error opening
/// it gives), a file too short to hold a superblock; I/O errors.
pub(super) fn fix_file(file: &File, path: &Path, repairs: &mut Vec<Repair>) -> Result<()> {
    let before = repairs.len();
    let heap = HeapFile { file, path };
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    let geometry = fix_superblock(heap, len, repairs)?;
    let geometry = fix_span_count(heap, geometry, len, repairs)?;
    fix_length(heap, &geometry, len, repairs)?;
    if heap.word(CLEAN_SHUTDOWN_OFFSET)? > 1 {
        heap.write(CLEAN_SHUTDOWN_OFFSET, &0u64.to_le_bytes())?;
        repaired(
            repairs,
            CLEAN_SHUTDOWN_OFFSET,
            "the clean-shutdown flag was neither 0 nor 1: cleared".to_owned(),
        );
    }
    let named = heap.word(JOURNAL_ID_OFFSET)?;
    if named != 0 {
        fix_journal(heap, named, geometry.creation_id, repairs)?;
    }
    if repairs.len() > before {
        file.sync_all().map_err(|e| Error::io("fsync", path, e))?;
    }
    Ok(())
}

/// The geometry the superblock states, after restoring a superblock damaged in one byte.
fn fix_superblock(file: HeapFile<'_>, len: u64, repairs: &mut Vec<Repair>) -> Result<Geometry> {
    let mut head = [0u8; SUPERBLOCK_HEAD_LEN as usize];
    file.file
        .read_exact_at(&mut head, 0)
        .map_err(|_| Error::Truncated {
            expected: SUPERBLOCK_HEAD_LEN,
            actual: len,
        })?;
    let parse = |bytes: &[u8]| Geometry::from_superblock(bytes, u64::MAX);
    let err = match parse(&head) {
        Ok(geometry) => return Ok(geometry),
        Err(err) => err,
    };
    let Some((at, value)) = correct_one_byte(&head, |c| parse(c).is_ok()) else {
        return Err(err);
    };
    file.write(at as u64, &[value])?;
    head[at] = value;
    repaired(
        repairs,
        at as u64,
        format!("the superblock's byte at {at:#x} was damaged ({err}); its checksum restored it"),
    );
    parse(&head)
}

/// `geometry` with the spans the span count word names, after setting a damaged word to the
/// spans the file (`len` bytes) holds.
fn fix_span_count(
    heap: HeapFile<'_>,
    geometry: Geometry,
    len: u64,
    repairs: &mut Vec<Repair>,
) -> Result<Geometry> {
    if !geometry.grows() {
        return Ok(geometry);
    }
    let count = decode_span_count(heap.word(SPAN_COUNT_OFFSET)?, geometry.creation_id);
    if let Some(stated) = count.and_then(|count| geometry.with_span_count(count, u64::MAX).ok()) {
        return Ok(stated);
    }
    let count = spans_fitting(&geometry, len);
    heap.write(
        SPAN_COUNT_OFFSET,
        &span_count_word(count, geometry.creation_id).to_le_bytes(),
    )?;
    repaired(
        repairs,
        SPAN_COUNT_OFFSET,
        format!("the span count word was damaged: set to the {count} spans the file holds"),
    );
    geometry.with_span_count(count, u64::MAX)
}

/// Extends a file (`len` bytes) shorter than its heap with zeros, reporting the carved spans
/// it lost.
fn fix_length(
    heap: HeapFile<'_>,
    geometry: &Geometry,
    len: u64,
    repairs: &mut Vec<Repair>,
) -> Result<()> {
    let expected = geometry.len();
    if len >= expected {
        return Ok(());
    }
    // The carved spans whose bytes the file lost, by their entries (those in a table past
    // the end are lost with it).
    let mut cut = Vec::new();
    for span in (0..geometry.span_count).filter(|&s| !geometry.is_table_span(s)) {
        let entry = geometry.span_entry_offset(span);
        if geometry.span_start(span) + SPAN_SIZE > len && entry + 8 <= len && heap.word(entry)? != 0
        {
            cut.push(span);
        }
    }
    allocate_file(heap.file, heap.path, len, expected - len)?;
    repaired(
        repairs,
        len,
        format!(
            "the file is {len} bytes and its heap {expected}: extended with zeros; whatever the \
             missing {} bytes held is lost",
            expected - len
        ),
    );
    if let Some(&first) = cut.first() {
        repaired(
            repairs,
            geometry.span_start(first),
            format!(
                "{} carved span(s) lay past the end of the file ({}): their blocks are lost",
                cut.len(),
                list(&cut)
            ),
        );
    }
    Ok(())
}

/// If the journal the heap names as `named` cannot be replayed, un-names it durably and
/// sets it aside.
fn fix_journal(
    heap: HeapFile<'_>,
    named: u64,
    creation_id: u64,
    repairs: &mut Vec<Repair>,
) -> Result<()> {
    let Err(err) = attach::check_journal(heap.file, heap.path, named, creation_id) else {
        return Ok(());
    };
    heap.write(JOURNAL_ID_OFFSET, &0u64.to_le_bytes())?;
    // The heap no longer names the journal before the journal goes.
    heap.file
        .sync_data()
        .map_err(|e| Error::io("fdatasync", heap.path, e))?;
    let jpath = attach::journal_path(heap.path);
    let mut what = format!(
        "{err}: the heap no longer names it, and its state is the heap file's own (what the \
         journal held after its last checkpoint is lost)"
    );
    if jpath.exists() {
        let mut aside = jpath.clone().into_os_string();
        aside.push(".damaged");
        std::fs::rename(&jpath, &aside).map_err(|e| Error::io("rename", &jpath, e))?;
        let _ = write!(
            what,
            "; the journal is kept as {}",
            Path::new(&aside).display()
        );
    }
    repaired(repairs, JOURNAL_ID_OFFSET, what);
    Ok(())
}

/// `spans` as a short list: the first few, then how many more.
fn list(spans: &[u64]) -> String {
    let mut out: Vec<String> = spans.iter().take(8).map(|s| format!("span {s}")).collect();
    if spans.len() > 8 {
        out.push(format!("{} more", spans.len() - 8));
    }
    out.join(", ")
}

/// The most spans a heap of `geometry` (the one it was created with) has in a file of
/// `len` bytes: at least its initial spans, and never ending on a span table.
fn spans_fitting(geometry: &Geometry, len: u64) -> u64 {
    let mut count = geometry.span_count;
    while geometry.len_with(count + 1).is_some_and(|need| need <= len) {
        count += 1;
    }
    while count > geometry.span_count && geometry.is_table_span(count - 1) {
        count -= 1;
    }
    count
}

/// The table-level repairs, on the mapped heap: the directory, the registry and the span
/// table (of the spans `geometry` names), each entry made durable as it is written.
///
/// # Errors
///
/// A media error.
pub(super) fn fix_tables(
    media: &Media,
    geometry: &Geometry,
    repairs: &mut Vec<Repair>,
) -> Result<()> {
    let id = geometry.creation_id;
    // Every name the directory keeps first, then names for the entries it lost, none of
    // them one of those (an intact entry may be called `recovered-<n>` by an earlier repair).
    let mut names: Vec<String> = Vec::new();
    let mut lost = Vec::new();
    for index in 0..DIRECTORY.capacity as u64 {
        let intact = |entry: &[u8]| {
            checks(DIRECTORY, index, id, entry) && parse_entry(index, body(entry)).is_some()
        };
        match fix_entry(media, DIRECTORY, index, id, intact, repairs)? {
            Fixed::Intact(entry) | Fixed::Corrected(entry) => {
                names.extend(parse_entry(index, body(&entry)));
            }
            Fixed::Lost => lost.push(index),
        }
    }
    for index in lost {
        let name = adopt(media, geometry, index as usize, &names, repairs)?;
        names.push(name);
    }
    for index in 0..REGISTRY.capacity as u64 {
        let intact = |entry: &[u8]| checks(REGISTRY, index, id, entry);
        if let Fixed::Lost = fix_entry(media, REGISTRY, index, id, intact, repairs)? {
            table::clear_entry(media, REGISTRY, index)?;
            repaired(
                repairs,
                REGISTRY.offset(index),
                format!(
                    "type registry entry {index} was damaged beyond correction: cleared (the \
                     payloads of its type stay; the next program to store the type registers it \
                     again)"
                ),
            );
        }
    }
    fix_span_table(media, geometry, repairs)
}

/// An entry's body: its bytes before the valid word.
fn body(entry: &[u8]) -> &Body {
    entry[..ENTRY_VALID_OFFSET as usize]
        .try_into()
        .unwrap_or(&[0; ENTRY_VALID_OFFSET as usize])
}

/// Whether `entry` (body and valid word) of `table` at `index` is a valid, filled entry.
fn checks(table: EntryTable, index: u64, creation_id: u64, entry: &[u8]) -> bool {
    let mut valid = [0u8; 8];
    valid.copy_from_slice(&entry[ENTRY_VALID_OFFSET as usize..]);
    table::intact(
        table,
        index,
        creation_id,
        body(entry),
        u64::from_le_bytes(valid),
    )
}

/// What [`fix_entry`] found.
enum Fixed {
    /// The entry was empty or intact (its bytes).
    Intact(Vec<u8>),
    /// It was damaged and a one-byte correction restored it (its bytes now), or it was an
    /// empty entry whose valid word was hit (cleared).
    Corrected(Vec<u8>),
    /// It was damaged beyond correction; it is as it was.
    Lost,
}

/// Checks entry `index` of `table`; if it is filled but not `intact`, restores it by a
/// one-byte correction where exactly one makes it intact or empty, and clears it where its
/// body is all zero (no registration writes such a body: the slot was empty and its valid
/// word is what was damaged).
fn fix_entry(
    media: &Media,
    table: EntryTable,
    index: u64,
    creation_id: u64,
    intact: impl Fn(&[u8]) -> bool,
    repairs: &mut Vec<Repair>,
) -> Result<Fixed> {
    let at = table.offset(index);
    let mut entry = vec![0u8; ENTRY_VALID_OFFSET as usize + 8];
    media.read(at, &mut entry)?;
    let empty = |entry: &[u8]| entry[ENTRY_VALID_OFFSET as usize..].iter().all(|&b| b == 0);
    if empty(&entry) || intact(&entry) {
        return Ok(Fixed::Intact(entry));
    }
    let which = if table.offset(0) == DIRECTORY.offset(0) {
        "directory"
    } else {
        "type registry"
    };
    let corrected = correct_one_byte(&entry, |e| empty(e) || intact(e));
    let unnamed = body(&entry).iter().all(|&b| b == 0);
    let what = match corrected {
        Some((byte, value)) if !unnamed || value == 0 => {
            entry[byte] = value;
            if empty(&entry) {
                table::clear_entry(media, table, index)?;
            } else {
                table::write_entry(media, table, creation_id, index, body(&entry))?;
            }
            format!(
                "{which} entry {index} was damaged in its byte {byte:#x}: its checksum restored it"
            )
        }
        _ if unnamed => {
            table::clear_entry(media, table, index)?;
            entry.fill(0);
            format!("{which} entry {index} was empty and its valid word damaged: cleared")
        }
        _ => return Ok(Fixed::Lost),
    };
    repaired(repairs, at, what);
    Ok(Fixed::Corrected(entry))
}

/// Names the structure of directory slot `index` (whose entry was lost) `recovered-<owner>`,
/// or, if a name in `taken` has that, with a further suffix; returns the name.
///
/// # Errors
///
/// A media error.
pub(super) fn adopt(
    media: &Media,
    geometry: &Geometry,
    index: usize,
    taken: &[String],
    repairs: &mut Vec<Repair>,
) -> Result<String> {
    let owner = index as u64 + 1;
    let mut name = format!("recovered-{owner}");
    let mut n = 1;
    while taken.contains(&name) {
        n += 1;
        name = format!("recovered-{owner}-{n}");
    }
    let mut entry: Body = [0; ENTRY_VALID_OFFSET as usize];
    entry[..name.len().min(NAME_MAX)].copy_from_slice(&name.as_bytes()[..name.len().min(NAME_MAX)]);
    entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
        .copy_from_slice(&owner.to_le_bytes());
    table::write_entry(media, DIRECTORY, geometry.creation_id, index as u64, &entry)?;
    repaired(
        repairs,
        DIRECTORY.offset(index as u64),
        format!("the name of the structure with owner id {owner} was lost: it is now `{name}`"),
    );
    Ok(name)
}

/// Rebuilds every span table entry that fails its check from the headers of the blocks in
/// its span, and clears damaged entries inside a large block.
fn fix_span_table(media: &Media, geometry: &Geometry, repairs: &mut Vec<Repair>) -> Result<()> {
    let id = geometry.creation_id;
    let decode = |span: u64| -> Result<Option<SpanEntry>> {
        Ok(SpanEntry::decode(
            media.load(geometry.span_entry_offset(span))?,
            span,
            id,
        ))
    };
    let mut span = 0;
    while span < geometry.span_count {
        if geometry.is_table_span(span) {
            span += 1;
            continue;
        }
        let entry = match decode(span)? {
            Some(SpanEntry::Class(class)) if usize::from(class) < NUM_CLASSES => {
                span += 1;
                continue;
            }
            Some(SpanEntry::Free) => {
                span += 1;
                continue;
            }
            Some(SpanEntry::Large(extent))
                if large_fits(geometry, span, u64::from(extent), &decode)? =>
            {
                SpanEntry::Large(extent)
            }
            _ => {
                let inferred = infer(media, geometry, span)?;
                let at = geometry.span_entry_offset(span);
                media.store(at, inferred.encode(span, id))?;
                // PERSIST: the rebuilt entry is durable before recovery reads the table.
                media.persist(at, 8)?;
                let what = match inferred {
                    SpanEntry::Free => "free: no block in it has a valid header".to_owned(),
                    SpanEntry::Class(class) => {
                        format!("carved into blocks of {} bytes", class_size(class))
                    }
                    SpanEntry::Large(extent) => {
                        format!("the first of a large block of {extent} spans")
                    }
                };
                repaired(
                    repairs,
                    at,
                    format!(
                        "span {span}'s table entry was damaged: rebuilt from its blocks' headers as {what}"
                    ),
                );
                inferred
            }
        };
        let extent = match entry {
            SpanEntry::Large(extent) => u64::from(extent).max(1),
            _ => 1,
        };
        for inner in span + 1..span + extent {
            let at = geometry.span_entry_offset(inner);
            if media.load(at)? != 0 {
                media.store(at, 0)?;
                // PERSIST: as above.
                media.persist(at, 8)?;
                repaired(
                    repairs,
                    at,
                    format!(
                        "span {inner}'s table entry, inside a large block, was damaged: cleared"
                    ),
                );
            }
        }
        span += extent;
    }
    Ok(())
}

/// Whether a large block of `extent` spans from `span` fits: inside the heap, over no span
/// table, and over no span whose entry is a valid one of another kind (entries that fail
/// their check are damage inside it).
fn large_fits(
    geometry: &Geometry,
    span: u64,
    extent: u64,
    decode: &impl Fn(u64) -> Result<Option<SpanEntry>>,
) -> Result<bool> {
    if extent == 0 || span + extent > geometry.span_count {
        return Ok(false);
    }
    for inner in span + 1..span + extent {
        if geometry.is_table_span(inner) || decode(inner)?.is_some_and(|e| e != SpanEntry::Free) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What span `span`'s entry must have been, from its blocks' headers: a large block if the
/// header at its start holds more than any class does; else the class under which the most
/// valid headers lie at block starts (a tie goes to the larger class: a larger class's block
/// starts are among a smaller's, so a smaller class that ties would carve free blocks inside
/// live ones); free if no header is valid.
fn infer(media: &Media, geometry: &Geometry, span: u64) -> Result<SpanEntry> {
    let id = geometry.creation_id;
    let start = geometry.span_start(span);
    // The spans a large block here could cover: up to a span table or the end.
    let room = (span..geometry.span_count)
        .take_while(|&s| s == span || !geometry.is_table_span(s))
        .count() as u64;
    if let Some(info) = read_header(media, id, start, block_capacity(room * SPAN_SIZE))? {
        let total = HEADER_LEN + u64::from(info.len) + TRAILER_LEN;
        if class_for(total).is_none() {
            return Ok(SpanEntry::Large(total.div_ceil(SPAN_SIZE) as u32));
        }
    }
    let mut best = (0, SpanEntry::Free);
    for class in 0..NUM_CLASSES as u8 {
        let size = class_size(class);
        let mut valid = 0;
        for i in 0..blocks_per_span(class) {
            if read_header(media, id, start + i * size, block_capacity(size))?.is_some() {
                valid += 1;
            }
        }
        if valid > 0 && valid >= best.0 {
            best = (valid, SpanEntry::Class(class));
        }
    }
    Ok(best.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_byte_corrections_are_taken_only_when_unique() {
        let sum = |b: &[u8]| b.iter().map(|&x| u32::from(x)).sum::<u32>();
        // A "checksum" that is the last byte: any one change of it works, so none is unique
        // unless the damage is there.
        let valid = |b: &[u8]| crc(&b[..4]) == u32::from_le_bytes(b[4..8].try_into().unwrap());
        let mut bytes = b"abcd".to_vec();
        bytes.extend_from_slice(&crc(b"abcd").to_le_bytes());
        assert!(valid(&bytes));
        bytes[2] ^= 0x40;
        assert_eq!(correct_one_byte(&bytes, valid), Some((2, b'c')));
        // Two bytes damaged: no single change restores it.
        bytes[1] ^= 0x01;
        assert_eq!(correct_one_byte(&bytes, valid), None);
        // Many single changes satisfy a weak check: none is taken.
        assert_eq!(correct_one_byte(&[1, 2, 3], |b| sum(b) == 7), None);
    }

    fn crc(bytes: &[u8]) -> u32 {
        crate::base::crc::append(0, bytes)
    }
}
