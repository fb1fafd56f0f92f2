//! The directory of named structures: a persistent table of names, each with the owner id
//! its structure's payloads carry, so one heap holds several structures.

use std::sync::{MutexGuard, PoisonError};

use super::Heap;
use crate::alloc::block::OwnerId;
use crate::base::layout::{
    DIR_OWNER_OFFSET, DIRECTORY, DIRECTORY_CAPACITY, ENTRY_VALID_OFFSET, Geometry, NAME_MAX,
};
use crate::error::{Error, Result};
use crate::meta::table;
use crate::persist::Media;

impl Heap {
    /// The owner id of the structure called `name`, registering it if it is new. The
    /// registration is durable when this returns.
    ///
    /// # Errors
    ///
    /// [`Error::BadName`] for an empty or over-long name (or one containing NUL bytes),
    /// [`Error::DirectoryFull`] when every slot is taken.
    pub fn register(&self, name: &str) -> Result<OwnerId> {
        check_name(name)?;
        self.shared().runtime.epochs.check_open()?;
        let mut dir = self.directory();
        if let Some(index) = dir.iter().position(|n| n.as_deref() == Some(name)) {
            return Ok(owner_of(index));
        }
        let index = dir
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| Error::DirectoryFull {
                capacity: DIRECTORY_CAPACITY,
            })?;
        let owner = owner_of(index);
        let mut entry: table::Body = [0; ENTRY_VALID_OFFSET as usize];
        entry[..name.len()].copy_from_slice(name.as_bytes());
        entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
            .copy_from_slice(&u64::from(owner.0).to_le_bytes());
        let creation_id = self.shared().geometry.creation_id;
        // The name is durable before its owner id is handed out.
        table::write_entry(
            &self.shared().runtime.media,
            DIRECTORY,
            creation_id,
            index as u64,
            &entry,
        )?;
        dir[index] = Some(name.to_owned());
        Ok(owner)
    }

    /// The owner id of the structure called `name`, if it is registered.
    pub fn lookup(&self, name: &str) -> Option<OwnerId> {
        let dir = self.directory();
        dir.iter()
            .position(|n| n.as_deref() == Some(name))
            .map(owner_of)
    }

    /// Every registered structure, with its owner id.
    pub fn structures(&self) -> Vec<(String, OwnerId)> {
        let dir = self.directory();
        dir.iter()
            .enumerate()
            .filter_map(|(i, n)| n.clone().map(|n| (n, owner_of(i))))
            .collect()
    }
}

impl Heap {
    /// The directory's names in DRAM, by slot.
    fn directory(&self) -> MutexGuard<'_, Vec<Option<String>>> {
        self.shared()
            .directory
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn owner_of(index: usize) -> OwnerId {
    OwnerId(u32::try_from(index + 1).unwrap_or(u32::MAX))
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX || name.as_bytes().contains(&0) {
        return Err(Error::BadName {
            len: name.len(),
            max: NAME_MAX,
        });
    }
    Ok(())
}

/// The directory's names. A registration torn by a crash never returned its id to anyone,
/// so `read_entries` clears it.
pub(super) fn read_directory(media: &Media, geometry: &Geometry) -> Result<Vec<Option<String>>> {
    table::read_entries(media, DIRECTORY, geometry.creation_id, |index, entry| {
        let name_bytes = &entry[..NAME_MAX];
        let end = name_bytes.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
        let owner = u64::from_le_bytes(
            entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        let name = std::str::from_utf8(&name_bytes[..end]).ok()?;
        (owner == index + 1 && !name.is_empty()).then(|| name.to_owned())
    })
}
