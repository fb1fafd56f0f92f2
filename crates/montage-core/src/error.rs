//! The one error type of the cold paths: setup, recovery, allocation and media access.

use std::path::PathBuf;

/// A specialised `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when creating, opening, recovering or using a heap.
///
/// Every variant names one thing a caller can act on. Media is untrusted input: whatever
/// a heap file contains, opening it returns one of these rather than panicking.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call on the heap file failed.
    #[error("{op} failed on {path}")]
    Io {
        /// What was being done (`"open"`, `"fdatasync"`, ...).
        op: &'static str,
        /// The heap file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The journal beside a heap file cannot be used with it: it is missing though the heap
    /// names one, it belongs to another heap, or it is damaged. Neither file was changed.
    #[error("journal {path} cannot be used: {what}")]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// What is wrong.
        what: &'static str,
    },
    /// The heap file is locked by another process or by another open heap in this process.
    #[error("heap file {path} is locked by another open heap")]
    Locked {
        /// The heap file.
        path: PathBuf,
    },
    /// The file system holding the heap file has too little free space for it: for a new
    /// heap, for the length a damaged heap file must be repaired to, or for a heap to grow
    /// (which an allocation then reports as [`OutOfSpace`](Error::OutOfSpace)). Nothing was
    /// written; a heap being created is removed again.
    #[error(
        "the file system holding {path} has {available} bytes free, too few for the \
         {needed} bytes the heap needs"
    )]
    NoDiskSpace {
        /// The heap file.
        path: PathBuf,
        /// The bytes the heap file needed allocated.
        needed: u64,
        /// The bytes free on its file system for an unprivileged user (what `df` shows).
        available: u64,
    },
    /// `create` was asked to make a heap where a file already exists; nothing was changed.
    #[error("heap file {path} already exists; open it instead of creating it")]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// The file does not start with the heap magic: it is not a Montage heap.
    #[error("not a montage heap: bad magic")]
    BadMagic,
    /// The heap was written by a format version this build cannot read.
    #[error("heap format version {found} is not supported (this build reads version {supported})")]
    FormatVersion {
        /// The version stored in the file.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The file is shorter than the heap its superblock describes.
    #[error("heap file is truncated: {actual} bytes on disk, superblock says {expected}")]
    Truncated {
        /// The size recorded in the superblock (or the minimum size of a superblock).
        expected: u64,
        /// The file's length.
        actual: u64,
    },
    /// Something read from the heap fails a consistency check.
    #[error("heap is corrupted at offset {offset:#x}: {what}")]
    Corrupted {
        /// Where in the heap the problem was found.
        offset: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// The requested heap size cannot hold a heap, or cannot be mapped.
    #[error("heap size {size} is not usable: {why}")]
    BadSize {
        /// The size asked for.
        size: u64,
        /// Why it does not fit.
        why: &'static str,
    },
    /// The heap has no free space left for an allocation of this many bytes. Nothing was
    /// changed. Deleting payloads gives space back once the epochs after the deletes are
    /// durable; a delete itself never fails for want of space in a heap that has a delete
    /// reserve (see `docs/design.md`, "The delete reserve").
    #[error(
        "heap is full: no space for a payload of {requested} bytes ({free_spans} spans free; \
         {free_bytes} bytes free in blocks of other sizes)"
    )]
    OutOfSpace {
        /// The payload size that could not be allocated (0 for an anti-block: a delete).
        requested: u64,
        /// Whole spans free when the allocation failed (0 unless the payload needs more
        /// contiguous spans than are free together).
        free_spans: u64,
        /// Bytes in free blocks of size classes other than the one the payload needs,
        /// which cannot hold it.
        free_bytes: u64,
    },
    /// The configuration is inconsistent.
    #[error("invalid heap configuration: {what}")]
    InvalidConfig {
        /// What is wrong with it.
        what: &'static str,
    },
    /// Something this heap or call cannot do: the backend cannot run here (the CPU lacks a
    /// flush instruction), or a call asks for what its arguments do not allow.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is missing.
        what: &'static str,
    },
    /// A block handle does not name a live block of this heap.
    #[error("no live block at offset {offset:#x}")]
    InvalidBlock {
        /// The handle's offset.
        offset: u64,
    },
    /// The block was already superseded or deleted by another operation: two operations
    /// raced on one payload without the synchronization the structure must provide.
    #[error("block at offset {offset:#x} was already superseded or deleted")]
    Retired {
        /// The block's offset.
        offset: u64,
    },
    /// The operation met a payload written in a newer epoch than its own and must be
    /// retried in a new operation ([`Heap::run_op`](crate::Heap::run_op) does this).
    #[error("operation aborted: it met a payload of a newer epoch; retry it")]
    Aborted,
    /// `begin_op` was called on a thread that already has an operation open on this heap.
    #[error("an operation is already open on this thread; operations do not nest")]
    NestedOperation,
    /// `sync` was called inside an operation; it would wait for that operation to end.
    #[error("sync called inside an operation; end the operation first")]
    SyncInOperation,
    /// The epoch clock stopped after a failure (an earlier error is in the log of the
    /// operation that hit it); durability can no longer be promised.
    #[error("the epoch clock has stopped after a failure: {reason}")]
    ClockStopped {
        /// What stopped it.
        reason: &'static str,
    },
    /// The heap was closed ([`Heap::close`](crate::Heap::close)) through another handle:
    /// nothing more can be written through this one. Open the heap again to go on.
    #[error("the heap has been closed; open it again to use it")]
    Closed,
    /// An access falls outside the block or the heap it addresses.
    #[error("access of {len} bytes at offset {offset:#x} is out of bounds")]
    OutOfBounds {
        /// Start of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
    },
    /// The heap directory has no room for another named structure.
    #[error("the heap directory is full ({capacity} names)")]
    DirectoryFull {
        /// How many names the directory holds.
        capacity: usize,
    },
    /// A structure name is empty or longer than the directory allows.
    #[error("structure name must be 1 to {max} bytes long (got {len})")]
    BadName {
        /// The name's length in bytes.
        len: usize,
        /// The longest name allowed.
        max: usize,
    },
    /// Writing dirty pages back to the heap file failed. The heap is poisoned from now on.
    #[error("write-back of the heap file failed; the heap is now poisoned")]
    WriteBack {
        /// The operating system's error from the write or flush.
        #[source]
        source: std::io::Error,
    },
    /// The heap stores payloads of a type with this name in another layout: the program's
    /// `#[derive(Payload)]` struct changed (fields added, removed, reordered or retyped)
    /// since they were written. Nothing was read or changed.
    #[error(
        "payload type `{type_name}` is stored with layout {stored:#018x}, but this program's \
         layout is {compiled:#018x}; the struct's fields changed since the heap was written"
    )]
    LayoutMismatch {
        /// The type's registry name.
        type_name: &'static str,
        /// The type id the heap recorded.
        stored: u64,
        /// The type id of the type as compiled.
        compiled: u64,
    },
    /// The heap's type registry has no room for another payload type.
    #[error("the heap's type registry is full ({capacity} types)")]
    RegistryFull {
        /// How many types the registry holds.
        capacity: usize,
    },
    /// A typed handle names a block that holds another payload type.
    #[error("block at offset {offset:#x} does not hold a `{expected}`")]
    WrongType {
        /// The block's offset.
        offset: u64,
        /// The type the handle expected.
        expected: &'static str,
    },
    /// A payload that was durable fails its checksum: the media damaged it after it was
    /// written. Nothing was returned from it and nothing was changed.
    #[error(
        "the payload at offset {offset:#x} (structure {structure}) fails its checksum: \
         the heap file is damaged"
    )]
    DamagedPayload {
        /// The block's offset.
        offset: u64,
        /// The structure the block belongs to, as the directory names it (`-` for none).
        structure: String,
    },
    /// A block's header fails its checksum although the crash could not have torn it: it
    /// was written in an epoch that had become durable (or the heap was closed cleanly),
    /// so it held a payload and the heap file is damaged there. Open refuses the heap
    /// rather than lose that payload silently, and leaves the file as it was.
    #[error(
        "the block header at offset {offset:#x} (structure {structure}, as the damaged \
         header names it) fails its checksum: the heap file is damaged"
    )]
    DamagedHeader {
        /// The block's offset.
        offset: u64,
        /// The structure the damaged header names, if it names one the directory lists
        /// (`-` otherwise); the name is only a hint, since the header is damaged.
        structure: String,
    },
    /// The named structure is open already through another handle on this heap. Two
    /// handles would keep two DRAM indexes of one set of payloads, each blind to the
    /// other's writes; share the open handle instead, or drop it before opening again.
    #[error("structure `{name}` is already open on this heap; share or drop the open handle")]
    StructureOpen {
        /// The structure's name.
        name: String,
    },
    /// An earlier write-back failed, so nothing this heap holds can be promised durable any
    /// more. Every later write and sync fails with this error; reopen the heap to recover.
    #[error("heap is poisoned by an earlier write-back failure; reopen it to recover")]
    Poisoned,
    /// A key or value has no encoding in its codec's format (for
    /// `payload::Serde`, with the `serde` feature: a path that is no UTF-8, a sequence of unknown
    /// length), or the codec cannot store values of its type at all (found when a
    /// structure opens). Nothing was written.
    #[error("values of `{type_name}` cannot be stored: {why}")]
    Encode {
        /// The type of the value.
        type_name: &'static str,
        /// What the codec reported.
        why: String,
    },
    /// A method of the named structure panicked while it changed the structure's state in
    /// memory (the replay of a `Logged` structure's operation, for example), so that state
    /// can no longer be trusted: every later call on that handle fails with this error.
    /// What is on the heap is intact; opening the structure again rebuilds it.
    #[error("a method of `{structure}` panicked; open the structure again to rebuild it")]
    Panicked {
        /// The structure's name.
        structure: String,
    },
    /// The heap was opened read-only ([`HeapConfig::read_only`](crate::HeapConfig::read_only)),
    /// and the call would change it. Nothing was changed.
    #[error("the heap was opened read-only")]
    ReadOnly,
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}
