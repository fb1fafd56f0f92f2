//! The directory of named structures: a persistent table of names, each with the owner id
//! its structure's payloads carry, so one heap holds several structures.

use std::sync::{MutexGuard, PoisonError};

use super::Heap;
use crate::alloc::block::OwnerId;
use crate::base::layout::{
    DIR_OWNER_OFFSET, DIRECTORY, DIRECTORY_CAPACITY, ENTRY_VALID_OFFSET, Geometry, NAME_MAX,
};
use crate::error::{Error, Result};
use crate::meta::{structure_name, table};
use crate::persist::Media;
use crate::recovery::Quarantined;

impl Heap {
    /// The owner id of the structure called `name`, registering it if it is new. The
    /// registration is durable when this returns.
    ///
    /// # Errors
    ///
    /// [`Error::BadName`] for an empty or over-long name (or one containing NUL bytes),
    /// [`Error::DirectoryFull`] when every slot is taken, [`Error::ReadOnly`] for a new name
    /// on a heap opened read-only.
    pub fn register(&self, name: &str) -> Result<OwnerId> {
        check_name(name)?;
        self.shared().runtime.epochs.check_open()?;
        let mut dir = self.directory();
        if let Some(index) = dir.iter().position(|n| n.as_deref() == Some(name)) {
            return Ok(owner_of(index));
        }
        self.shared().runtime.writable()?;
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

/// A named structure attached to its heap by [`Heap::attach`]: its owner id, held by one
/// handle at a time. Dropping it detaches the structure, and the name can be attached again.
///
/// A structure keeps its index in DRAM and rebuilds it from the heap when it is opened; two
/// open handles of one structure would each keep an index blind to the other's writes. The
/// attachment is what makes a second open fail instead.
#[derive(Debug)]
pub struct Attached {
    heap: Heap,
    owner: OwnerId,
    existed: bool,
}

impl Attached {
    /// The owner id the structure's payloads carry.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// Whether the structure was registered before this attachment (so it has payloads to
    /// rebuild from); `false` when `attach` created it.
    pub fn existed(&self) -> bool {
        self.existed
    }

    /// The heap the structure lives in.
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// The structure's blocks that recovery quarantined when the heap was opened
    /// ([`HeapConfig::quarantine_damaged`](crate::HeapConfig::quarantine_damaged)): what it
    /// lost to damage. Empty unless quarantine was asked for and found damage here.
    pub fn quarantined(&self) -> Vec<Quarantined> {
        let report = &self.heap.shared().report;
        if report.quarantined.is_empty() {
            return Vec::new();
        }
        let Some(name) = structure_name(&self.heap.directory(), self.owner.0) else {
            return Vec::new();
        };
        report.quarantined_in(&name).cloned().collect()
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut attached = self
            .heap
            .shared()
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *attached &= !(1u128 << self.owner.0);
    }
}

impl Heap {
    /// Attaches the structure called `name`, registering it if the heap has none of that
    /// name (durably, before this returns). The structure stays attached until the returned
    /// [`Attached`] is dropped; the collections hold theirs for as long as they are open.
    ///
    /// # Errors
    ///
    /// [`Error::StructureOpen`] while another [`Attached`] of `name` lives;
    /// as [`register`](Self::register) when registering it.
    pub fn attach(&self, name: &str) -> Result<Attached> {
        let existing = self.lookup(name);
        let owner = match existing {
            Some(owner) => owner,
            None => self.register(name)?,
        };
        let mut attached = self
            .shared()
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let bit = 1u128 << owner.0;
        if *attached & bit != 0 {
            return Err(Error::StructureOpen {
                name: name.to_owned(),
            });
        }
        *attached |= bit;
        Ok(Attached {
            heap: self.clone(),
            owner,
            existed: existing.is_some(),
        })
    }

    /// The directory's names in DRAM, by slot.
    fn directory(&self) -> MutexGuard<'_, Vec<Option<String>>> {
        self.shared()
            .runtime
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

/// The directory's names. A registration torn by a crash reads as an empty slot (its owner id
/// was never handed out); a damaged entry, or one whose owner id is not its slot's, is
/// [`Error::Corrupted`].
pub(super) fn read_directory(media: &Media, geometry: &Geometry) -> Result<Vec<Option<String>>> {
    table::read_entries(media, DIRECTORY, geometry.creation_id, parse_entry)
}

/// The name directory entry `index` holds, if its body is one the directory writes: a
/// UTF-8 name and the slot's own owner id.
pub(super) fn parse_entry(index: u64, entry: &table::Body) -> Option<String> {
    let name_bytes = &entry[..NAME_MAX];
    let end = name_bytes.iter().position(|&b| b == 0).unwrap_or(NAME_MAX);
    let owner = u64::from_le_bytes(
        entry[DIR_OWNER_OFFSET as usize..DIR_OWNER_OFFSET as usize + 8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let name = std::str::from_utf8(&name_bytes[..end]).ok()?;
    (owner == index + 1 && !name.is_empty()).then(|| name.to_owned())
}
