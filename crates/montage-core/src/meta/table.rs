//! Reading and writing the heap's entry tables (the structure directory and the type
//! registry, format in `layout.rs`): an entry is durable once its checksummed valid word is,
//! and an entry torn by a crash reads as empty and is durably cleared before its slot can be
//! reused.

use crate::base::layout::{ENTRY_LEN, ENTRY_VALID_OFFSET, EntryTable};
use crate::error::Result;
use crate::persist::Media;

/// An entry's body: the bytes before its valid word.
pub(crate) type Body = [u8; ENTRY_VALID_OFFSET as usize];

/// Every entry of `table`: `parse(index, body)` of each intact one, `None` for empty slots.
/// An entry whose valid word does not match its body, or that `parse` rejects, was never
/// reported written (writing persists it before returning), so it is durably cleared.
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
        let parsed = (valid == table.valid_word(index, creation_id, &body))
            .then(|| parse(index, &body))
            .flatten();
        if parsed.is_none() {
            media.store(at + ENTRY_VALID_OFFSET, 0)?;
            // PERSIST: the cleared entry is durable before its slot is reused.
            media.persist(at + ENTRY_VALID_OFFSET, 8)?;
        }
        entries.push(parsed);
    }
    Ok(entries)
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
    media.store(
        at + ENTRY_VALID_OFFSET,
        table.valid_word(index, creation_id, body),
    )?;
    // PERSIST: the entry is durable before the caller hands out what it records (an owner
    // id, a type's first payload).
    media.persist(at, ENTRY_LEN)
}
