//! The type registry: which layout each payload type was first stored with, so that a
//! program whose `#[derive(Payload)]` struct changed shape gets
//! [`Error::LayoutMismatch`] instead of reading old bytes as the new layout.
//!
//! Entries live in the heap's registry area (format in `base/layout.rs`), keyed by a hash of
//! the type's name; a DRAM copy answers lookups. An entry is written and made durable before
//! the first payload of its type is allocated, so a recovered payload always has one.

use std::sync::{Mutex, PoisonError};

use crate::base::layout::{
    ENTRY_VALID_OFFSET, REG_NAME_LEN, REG_NAME_OFFSET, REG_TYPE_ID_OFFSET, REGISTRY,
    REGISTRY_CAPACITY,
};
use crate::error::{Error, Result};
use crate::meta::table;
use crate::persist::Media;

/// One registered type, as the DRAM copy keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name_hash: u64,
    type_id: u64,
    /// The name as stored (at most [`REG_NAME_LEN`] bytes of it).
    name: String,
}

/// The DRAM copy of the registry area.
#[derive(Debug)]
pub(crate) struct Registry {
    entries: Mutex<Vec<Option<Entry>>>,
    /// The heap's creation id, which every entry's checksum covers.
    creation_id: u64,
}

impl Registry {
    /// An empty registry (a new heap).
    pub(crate) fn empty(creation_id: u64) -> Registry {
        Registry {
            entries: Mutex::new(vec![None; REGISTRY_CAPACITY]),
            creation_id,
        }
    }

    /// Reads the registry area of a heap being opened. An entry torn by a crash reads as an
    /// empty slot (registration persists it before returning, so no payload of its type can
    /// be durable); a damaged entry is [`Error::Corrupted`].
    pub(crate) fn load(media: &Media, creation_id: u64) -> Result<Registry> {
        let entries = table::read_entries(media, REGISTRY, creation_id, |_, raw| {
            let name = &raw[REG_NAME_OFFSET as usize..];
            let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            Some(Entry {
                name_hash: word(raw, 0),
                type_id: word(raw, REG_TYPE_ID_OFFSET as usize),
                name: String::from_utf8_lossy(&name[..len]).into_owned(),
            })
        })?;
        Ok(Registry {
            entries: Mutex::new(entries),
            creation_id,
        })
    }

    /// Checks `name` against the registry, recording it with `type_id` if it is new and
    /// `register` allows.
    ///
    /// # Errors
    ///
    /// [`Error::LayoutMismatch`] if `name` was registered with another type id;
    /// [`Error::RegistryFull`] if it is new and there is no room; [`Error::ReadOnly`] if it
    /// is new and `register` is false; a media error.
    pub(crate) fn check_or_register(
        &self,
        media: &Media,
        name: &'static str,
        type_id: u64,
        register: bool,
    ) -> Result<()> {
        let name_hash = crate::fingerprint::Fingerprint::new().str(name).finish();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.iter().flatten().find(|e| e.name_hash == name_hash) {
            return if entry.type_id == type_id {
                Ok(())
            } else {
                Err(Error::LayoutMismatch {
                    type_name: name,
                    stored: entry.type_id,
                    compiled: type_id,
                })
            };
        }
        if !register {
            return Err(Error::ReadOnly);
        }
        let index =
            entries
                .iter()
                .position(Option::is_none)
                .ok_or_else(|| Error::RegistryFull {
                    capacity: REGISTRY_CAPACITY,
                })?;
        let mut raw: table::Body = [0; ENTRY_VALID_OFFSET as usize];
        raw[..8].copy_from_slice(&name_hash.to_le_bytes());
        raw[REG_TYPE_ID_OFFSET as usize..REG_NAME_OFFSET as usize]
            .copy_from_slice(&type_id.to_le_bytes());
        let shown = truncate_utf8(name, REG_NAME_LEN);
        raw[REG_NAME_OFFSET as usize..REG_NAME_OFFSET as usize + shown.len()]
            .copy_from_slice(shown.as_bytes());
        // Durable before any payload of the type is allocated (the caller allocates only
        // after this returns), so recovery never meets a payload whose layout it cannot
        // check.
        table::write_entry(media, REGISTRY, self.creation_id, index as u64, &raw)?;
        entries[index] = Some(Entry {
            name_hash,
            type_id,
            name: shown.to_owned(),
        });
        Ok(())
    }

    /// Every registered type's name (as stored: at most 40 bytes of it) and type id, in
    /// registration order.
    pub(crate) fn types(&self) -> Vec<(String, u64)> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.type_id))
            .collect()
    }
}

fn word(raw: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&raw[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("abc", 40), "abc");
        assert_eq!(truncate_utf8("\u{e9}\u{e9}\u{e9}", 3), "\u{e9}");
        assert_eq!(truncate_utf8("", 3), "");
    }
}
