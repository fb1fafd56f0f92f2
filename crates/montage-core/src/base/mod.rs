//! The ground layer: the on-media format (superblock, block headers, span and entry tables
//! as byte layouts) and the mapping of a heap file into memory, with the bounds-checked
//! region every access goes through. Nothing here knows about write-back, allocation or
//! epochs.

#[allow(unsafe_code)]
pub(crate) mod crc;
pub(crate) mod epoch;
pub(crate) mod layout;
#[allow(unsafe_code)]
pub(crate) mod mapping;
#[allow(unsafe_code)]
pub(crate) mod region;
