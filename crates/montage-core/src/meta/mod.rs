//! Persistent metadata tables beside the blocks: the checksummed entry tables of the
//! superblock area (`table.rs`), and on them the registry of payload types (`registry.rs`).
//! The heap's directory of named structures uses the same tables.

pub(crate) mod registry;
pub(crate) mod table;

/// The name the directory gives owner id `owner`, from its names by slot (slot `owner - 1`;
/// owner 0 is no structure).
pub(crate) fn structure_name(names: &[Option<String>], owner: u32) -> Option<String> {
    (owner as usize)
        .checked_sub(1)
        .and_then(|slot| names.get(slot).cloned().flatten())
}
