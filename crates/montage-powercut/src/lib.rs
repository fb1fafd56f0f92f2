//! A FUSE file system for power-failure tests of real processes, in the spirit of `LazyFS`.
//!
//! A `SIGKILL` leaves the page cache intact, so it never tests what an unflushed write
//! loses. This file system keeps every write in its own cache until an `fsync` or
//! `fdatasync` of the file covers it. [`Mounted::power_cut`] then does what a power cut
//! does: it aborts the FUSE connection, so dirty pages the kernel still holds (of a shared
//! mapping, say) never reach the file system, and keeps of each file its synced bytes plus,
//! per 512-byte sector, a seeded random prefix of the writes no sync covered (a disk may
//! have written any of them, torn at sectors). [`Survived::remount`] serves what survived.
//!
//! File sizes and the directory (create, unlink, rename) are durable at once, as on a
//! file system that journals its metadata; only file contents are lost.
//!
//! Mounting needs `/dev/fuse` and the right to mount (root, here); [`Mounted::mount`]
//! fails with an error that says which is missing, so a test can skip.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

/// The unit a disk writes atomically.
const SECTOR: u64 = 512;
/// Attributes are not cached by the kernel: sizes change under it at every power cut.
const TTL: Duration = Duration::ZERO;

/// One file: what reads return, what is durable, and the writes in between.
#[derive(Debug, Clone, Default)]
struct FileData {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    pending: Vec<(u64, Vec<u8>)>,
}

impl FileData {
    fn write(&mut self, offset: u64, bytes: &[u8]) {
        let end = offset as usize + bytes.len();
        if self.current.len() < end {
            self.current.resize(end, 0);
        }
        self.current[offset as usize..end].copy_from_slice(bytes);
        self.pending.push((offset, bytes.to_vec()));
    }

    fn set_len(&mut self, len: u64) {
        self.current.resize(len as usize, 0);
        self.durable.resize(len as usize, 0);
        // Writes beyond the new end are gone for good.
        for (offset, bytes) in &mut self.pending {
            let keep = len.saturating_sub(*offset).min(bytes.len() as u64);
            bytes.truncate(keep as usize);
        }
        self.pending.retain(|(_, bytes)| !bytes.is_empty());
    }

    fn sync(&mut self) {
        self.durable.clone_from(&self.current);
        self.pending.clear();
    }

    /// What a power cut leaves: the durable bytes and, per sector, a random prefix of the
    /// unsynced writes to it.
    fn cut(&self, rng: &mut SplitMix) -> Vec<u8> {
        let mut image = self.durable.clone();
        image.resize(self.current.len(), 0);
        // Per sector: the pieces of pending writes that fall in it, in order.
        let mut sectors: BTreeMap<u64, Vec<(u64, &[u8])>> = BTreeMap::new();
        for (offset, bytes) in &self.pending {
            let mut at = *offset;
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                let room = (SECTOR - at % SECTOR) as usize;
                let (piece, tail) = rest.split_at(room.min(rest.len()));
                sectors.entry(at / SECTOR).or_default().push((at, piece));
                at += piece.len() as u64;
                rest = tail;
            }
        }
        for pieces in sectors.values() {
            let keep = match rng.next() % 3 {
                0 => 0,
                1 => pieces.len(),
                _ => (rng.next() % (pieces.len() as u64 + 1)) as usize,
            };
            for &(at, piece) in &pieces[..keep] {
                let at = at as usize;
                if at + piece.len() <= image.len() {
                    image[at..at + piece.len()].copy_from_slice(piece);
                }
            }
        }
        image
    }
}

/// The files of the one directory this file system has.
#[derive(Debug, Default)]
struct State {
    /// Inode number (from 2) to name and data.
    files: BTreeMap<u64, (String, FileData)>,
    next_ino: u64,
    /// Set by a power cut: from then on every request fails, as on a dead disk.
    dead: bool,
}

impl State {
    fn by_name(&self, name: &OsStr) -> Option<u64> {
        let name = name.to_str()?;
        self.files
            .iter()
            .find(|(_, (n, _))| n == name)
            .map(|(&ino, _)| ino)
    }
}

/// The FUSE side: every request against [`State`].
#[derive(Debug)]
struct PowerCutFs {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn attr(ino: u64, size: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(SECTOR),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: if kind == FileType::Directory {
            0o755
        } else {
            0o644
        },
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl PowerCutFs {
    /// Runs `f` on the state, or fails with EIO after a power cut.
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Errno>) -> Result<T, Errno> {
        let mut state = lock(&self.state);
        if state.dead {
            return Err(Errno::EIO);
        }
        f(&mut state)
    }

    fn file_attr(state: &State, ino: u64) -> Result<FileAttr, Errno> {
        if ino == u64::from(INodeNo::ROOT) {
            return Ok(attr(ino, 0, FileType::Directory));
        }
        let (_, data) = state.files.get(&ino).ok_or(Errno::ENOENT)?;
        Ok(attr(ino, data.current.len() as u64, FileType::RegularFile))
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.with(|state| {
            if parent != INodeNo::ROOT {
                return Err(Errno::ENOENT);
            }
            let ino = state.by_name(name).ok_or(Errno::ENOENT)?;
            Self::file_attr(state, ino)
        });
        match found {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|state| Self::file_attr(state, ino.into())) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.with(|state| {
            if let Some(size) = size {
                let (_, data) = state.files.get_mut(&ino.into()).ok_or(Errno::ENOENT)?;
                data.set_len(size);
            }
            Self::file_attr(state, ino.into())
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|state| Self::file_attr(state, ino.into())) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.with(|state| {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            if parent != INodeNo::ROOT {
                return Err(Errno::ENOENT);
            }
            if state.by_name(OsStr::new(name)).is_some() {
                return Err(Errno::EEXIST);
            }
            let ino = state.next_ino.max(2);
            state.next_ino = ino + 1;
            state
                .files
                .insert(ino, (name.to_owned(), FileData::default()));
            Self::file_attr(state, ino)
        });
        match result {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let result = self.with(|state| {
            let (_, data) = state.files.get(&ino.into()).ok_or(Errno::ENOENT)?;
            let start = (offset as usize).min(data.current.len());
            let end = (start + size as usize).min(data.current.len());
            Ok(data.current[start..end].to_vec())
        });
        match result {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.with(|state| {
            let (_, file) = state.files.get_mut(&ino.into()).ok_or(Errno::ENOENT)?;
            file.write(offset, data);
            Ok(data.len() as u32)
        });
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.with(|state| {
            let (_, data) = state.files.get_mut(&ino.into()).ok_or(Errno::ENOENT)?;
            data.sync();
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The directory is durable at once.
        reply.ok();
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.with(|state| {
            if parent != INodeNo::ROOT {
                return Err(Errno::ENOENT);
            }
            let ino = state.by_name(name).ok_or(Errno::ENOENT)?;
            state.files.remove(&ino);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = self.with(|state| {
            if parent != INodeNo::ROOT || newparent != INodeNo::ROOT {
                return Err(Errno::ENOENT);
            }
            let ino = state.by_name(name).ok_or(Errno::ENOENT)?;
            let newname = newname.to_str().ok_or(Errno::EINVAL)?.to_owned();
            if let Some(old) = state.by_name(OsStr::new(&newname)) {
                state.files.remove(&old);
            }
            if let Some((n, _)) = state.files.get_mut(&ino) {
                *n = newname;
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.with(|state| {
            if ino != INodeNo::ROOT {
                return Err(Errno::ENOTDIR);
            }
            let mut entries = vec![
                (1, FileType::Directory, ".".to_owned()),
                (1, FileType::Directory, "..".to_owned()),
            ];
            entries.extend(
                state
                    .files
                    .iter()
                    .map(|(&ino, (name, _))| (ino, FileType::RegularFile, name.clone())),
            );
            Ok(entries)
        });
        match result {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }
}

/// A small deterministic generator (splitmix64) for the power cut's choices.
#[derive(Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The power-cut file system mounted at a directory.
#[derive(Debug)]
pub struct Mounted {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

impl Mounted {
    /// Mounts an empty file system at `dir` (an existing, empty directory).
    ///
    /// # Errors
    ///
    /// If `/dev/fuse` is missing or the mount is refused (not root, no `CAP_SYS_ADMIN`).
    pub fn mount(dir: &Path) -> io::Result<Mounted> {
        Self::mount_state(dir, State::default())
    }

    fn mount_state(dir: &Path, state: State) -> io::Result<Mounted> {
        if !Path::new("/dev/fuse").exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/dev/fuse is missing",
            ));
        }
        let state = Arc::new(Mutex::new(state));
        let fs = PowerCutFs {
            state: Arc::clone(&state),
        };
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("montage-powercut".to_owned())];
        config.n_threads = Some(2);
        let session = fuser::spawn_mount(fs, dir, &config)?;
        Ok(Mounted {
            dir: dir.to_path_buf(),
            state,
            session: Some(session),
        })
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cuts the power: aborts the FUSE connection (the kernel's dirty pages for it are
    /// lost), fails every later request, unmounts, and keeps of every file what a disk might
    /// hold (see the module docs), chosen by `seed`. Kill the processes that use the mount
    /// first. [`Survived::remount`] serves the result.
    ///
    /// # Errors
    ///
    /// If the connection cannot be aborted or the file system not unmounted.
    pub fn power_cut(mut self, seed: u64) -> io::Result<Survived> {
        let connection = connection_dir(&self.dir)?;
        std::fs::write(connection.join("abort"), b"1")?;
        let mut rng = SplitMix(seed);
        let files = {
            let mut state = lock(&self.state);
            state.dead = true;
            state
                .files
                .iter()
                .map(|(&ino, (name, data))| {
                    let bytes = data.cut(&mut rng);
                    (ino, name.clone(), bytes)
                })
                .collect()
        };
        if let Some(session) = self.session.take() {
            // The session thread ends with the aborted connection; unmounting may report
            // that it is gone already.
            let _ = session.umount_and_join();
        }
        Ok(Survived {
            dir: self.dir.clone(),
            files,
        })
    }

    /// Unmounts cleanly (nothing lost: every write is in the file system's cache, and a
    /// later [`power_cut`](Self::power_cut) is not possible).
    ///
    /// # Errors
    ///
    /// If the file system cannot be unmounted.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(session) => session.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

/// What a power cut left on the disk.
#[derive(Debug)]
pub struct Survived {
    dir: PathBuf,
    files: Vec<(u64, String, Vec<u8>)>,
}

impl Survived {
    /// Mounts the file system again, serving what survived (all of it durable now).
    ///
    /// # Errors
    ///
    /// As [`Mounted::mount`].
    pub fn remount(self) -> io::Result<Mounted> {
        let mut state = State::default();
        for (ino, name, bytes) in self.files {
            let data = FileData {
                current: bytes.clone(),
                durable: bytes,
                pending: Vec::new(),
            };
            state.files.insert(ino, (name, data));
            state.next_ino = state.next_ino.max(ino + 1);
        }
        Mounted::mount_state(&self.dir, state)
    }
}

/// Where the FUSE control file system lists connections.
const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// The control directory of the FUSE connection of the mount at `dir` (named by the minor
/// device number of its `st_dev`), mounting the control file system first if it is not.
fn connection_dir(dir: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir)?.dev();
    let minor = (dev & 0xff) | ((dev >> 12) & 0xf_ff00);
    let connection = Path::new(CONNECTIONS).join(minor.to_string());
    if !connection.exists() {
        let status = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", CONNECTIONS])
            .status()?;
        if !status.success() || !connection.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no FUSE control directory {}", connection.display()),
            ));
        }
    }
    Ok(connection)
}
