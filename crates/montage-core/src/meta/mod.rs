//! Persistent metadata tables beside the blocks: the checksummed entry tables of the
//! superblock area (`table.rs`), and on them the registry of payload types (`registry.rs`).
//! The heap's directory of named structures uses the same tables.

pub(crate) mod registry;
pub(crate) mod table;
