//! Reading and writing the heap's entry tables (the structure directory and the type
//! registry, format in `layout.rs`).
//!
//! An entry's body is durable before its checksummed valid word is written, so a crash
//! leaves a slot either empty (valid word zero, whatever the body holds) or whole. A valid
//! word that does not match its body is therefore never a torn write: it is damage, and
//! reading the table reports it. Reading never writes.

use crate::base::layout::{ENTRY_VALID_OFFSET, EntryTable};
use crate::error::{Error, Result};
use crate::persist::Media;

/// An entry's body: the bytes before its valid word.
pub(crate) type Body = [u8; ENTRY_VALID_OFFSET as usize];

/// Every entry of `table`: `parse(index, body)` of each intact one, `None` for empty slots.
///
/// # Errors
///
/// [`Error::Corrupted`] at the entry for one whose valid word does not match its body, or
/// that `parse` rejects.
pub(crate) fn read_entries<T>(
    media: &Media,
    table: EntryTable,
    creation_id: u64,
    parse: impl Fn(u64, &Body) -> Option<T>,
) -> Result<Vec<Option<T>>> {
    let mut entries = Vec::with_capacity(table.capacity);
    for index in 0..table.capacity as u64 {
        let at = table.offset(index);
        let valid = media.load(at + ENTRY_VALID_OFFSET)?;
        if valid == 0 {
            entries.push(None);
            continue;
        }
        let mut body: Body = [0; ENTRY_VALID_OFFSET as usize];
        media.read(at, &mut body)?;
        let parsed = intact(table, index, creation_id, &body, valid)
            .then(|| parse(index, &body))
            .flatten();
        let Some(parsed) = parsed else {
            return Err(Error::Corrupted {
                offset: at,
                what: "a directory or type registry entry fails its check",
            });
        };
        entries.push(Some(parsed));
    }
    Ok(entries)
}

/// Whether an entry `index` of `table` with `body` and the valid word `valid` is filled and
/// whole: its valid word is not zero and matches its body.
pub(crate) fn intact(
    table: EntryTable,
    index: u64,
    creation_id: u64,
    body: &Body,
    valid: u64,
) -> bool {
    valid != 0 && valid == table.valid_word(index, creation_id, body)
}

/// Empties entry `index` of `table` (zeroes its valid word) and makes it durable before
/// returning.
pub(crate) fn clear_entry(media: &Media, table: EntryTable, index: u64) -> Result<()> {
    let at = table.offset(index) + ENTRY_VALID_OFFSET;
    media.store(at, 0)?;
    // PERSIST: the slot is durably empty before the caller goes on.
    media.persist(at, 8)
}

/// Writes entry `index` of `table` and makes it durable before returning.
pub(crate) fn write_entry(
    media: &Media,
    table: EntryTable,
    creation_id: u64,
    index: u64,
    body: &Body,
) -> Result<()> {
    let at = table.offset(index);
    media.write(at, body)?;
    // PERSIST: the body is durable before the valid word can be, so a valid word that does
    // not match its body is never a torn write (see the module docs).
    media.persist(at, ENTRY_VALID_OFFSET)?;
    media.store(
        at + ENTRY_VALID_OFFSET,
        table.valid_word(index, creation_id, body),
    )?;
    // PERSIST: the entry is durable before the caller hands out what it records (an owner
    // id, a type's first payload).
    media.persist(at + ENTRY_VALID_OFFSET, 8)
}
