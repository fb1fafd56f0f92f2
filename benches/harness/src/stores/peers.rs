//! The embedded stores a Rust user would pick instead, each on a fresh directory on disk,
//! in its fastest mode that still recovers a consistent state after a power failure, and
//! with its own durable commit for `sync` and `insert_durable`.
//!
//! * redb: commits with `Durability::None` (crash-safe: a crash rolls back to the last
//!   durable commit), with a durable commit at least every 50 ms, as montage's clock ticks
//!   (redb frees pages only in durable commits, so without them the file grows without
//!   bound); durable commits are `Durability::Immediate`.
//! * sled: its default mode (log-structured, crash-consistent, flushed every 500 ms);
//!   `flush` for durability.
//! * fjall: its default mode (the journal buffered, recovered to a consistent prefix);
//!   `persist(SyncAll)` for durability.
//! * heed (LMDB): `NO_META_SYNC`, which keeps atomicity and consistency and may lose the last
//!   transactions (LMDB has no consistent mode without a data sync per commit);
//!   `force_sync` for durability.
//! * rocksdb: the write-ahead log without sync (recovered to a point in time); writes with
//!   `sync` set, or `flush_wal(true)`, for durability.

// Keys are big-endian so that the ordered stores keep them in numeric order, as their users
// would write them; the project's own rule for little-endian media integers is not about them.
#![allow(clippy::big_endian_bytes)]

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Contender, Dirs, MapStore, Result, Sizing};
use crate::workload::fill_value;

/// How often redb commits durably in its fast mode: montage's default epoch length.
const REDB_DURABLE_EVERY: Duration = Duration::from_millis(50);

pub(crate) fn with_map(
    contender: Contender,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn MapStore) -> Result,
) -> Result {
    let dir = super::scratch_dir(&dirs.disk, "peer")?;
    let path = dir.path();
    match contender {
        Contender::Redb => f(&Redb::open(path)?),
        Contender::Sled => f(&Sled(sled::Config::new().path(path).open()?)),
        Contender::Fjall => f(&Fjall::open(path)?),
        Contender::Heed => f(&Heed::open(path, sizing)?),
        Contender::Rocksdb => f(&Rocks::open(path)?),
        _ => Err(format!("{} is not an embedded store", contender.name()).into()),
    }
}

fn values(keys: &[u64], value_size: usize) -> impl Iterator<Item = (u64, Vec<u8>)> + '_ {
    keys.iter().map(move |&key| {
        let mut value = vec![0; value_size];
        fill_value(&mut value, key);
        (key, value)
    })
}

// ---- redb -------------------------------------------------------------------------------

const REDB_TABLE: redb::TableDefinition<'_, u64, &[u8]> = redb::TableDefinition::new("bench");

struct Redb {
    db: redb::Database,
    last_durable: Mutex<Instant>,
}

impl Redb {
    fn open(dir: &std::path::Path) -> Result<Redb> {
        let db = redb::Database::create(dir.join("bench.redb"))?;
        let redb = Redb {
            db,
            last_durable: Mutex::new(Instant::now()),
        };
        redb.write(true, |_| Ok(()))?;
        Ok(redb)
    }

    /// One write transaction running `f`, durable if asked or if the last durable commit is
    /// older than [`REDB_DURABLE_EVERY`].
    fn write(
        &self,
        durable: bool,
        f: impl FnOnce(&mut redb::Table<'_, u64, &[u8]>) -> Result,
    ) -> Result {
        let durable = durable || {
            let mut last = self
                .last_durable
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = last.elapsed() >= REDB_DURABLE_EVERY;
            if due {
                *last = Instant::now();
            }
            due
        };
        let mut txn = self.db.begin_write()?;
        txn.set_durability(if durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        });
        {
            let mut table = txn.open_table(REDB_TABLE)?;
            f(&mut table)?;
        }
        txn.commit()?;
        Ok(())
    }
}

impl MapStore for Redb {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(REDB_TABLE)?;
        Ok(table.get(key)?.map(|v| v.value().to_vec().len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        self.write(false, |t| {
            t.insert(key, value)?;
            Ok(())
        })
    }

    fn remove(&self, key: u64) -> Result {
        self.write(false, |t| {
            t.remove(key)?;
            Ok(())
        })
    }

    fn sync(&self) -> Result {
        self.write(true, |_| Ok(()))
    }

    fn insert_durable(&self, key: u64, value: &[u8]) -> Result {
        self.write(true, |t| {
            t.insert(key, value)?;
            Ok(())
        })
    }

    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        self.write(false, |t| {
            for (key, value) in values(keys, value_size) {
                t.insert(key, value.as_slice())?;
            }
            Ok(())
        })
    }
}

// ---- sled -------------------------------------------------------------------------------

struct Sled(sled::Db);

impl MapStore for Sled {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        Ok(self.0.get(key.to_be_bytes())?.map(|v| v.to_vec().len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        self.0.insert(key.to_be_bytes(), value)?;
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        self.0.remove(key.to_be_bytes())?;
        Ok(())
    }

    fn sync(&self) -> Result {
        self.0.flush()?;
        Ok(())
    }

    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        let mut batch = sled::Batch::default();
        for (key, value) in values(keys, value_size) {
            batch.insert(&key.to_be_bytes(), value);
        }
        self.0.apply_batch(batch)?;
        Ok(())
    }
}

// ---- fjall ------------------------------------------------------------------------------

struct Fjall {
    keyspace: fjall::Keyspace,
    partition: fjall::PartitionHandle,
}

impl Fjall {
    fn open(dir: &std::path::Path) -> Result<Fjall> {
        let keyspace = fjall::Config::new(dir).open()?;
        let partition =
            keyspace.open_partition("bench", fjall::PartitionCreateOptions::default())?;
        Ok(Fjall {
            keyspace,
            partition,
        })
    }
}

impl MapStore for Fjall {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        Ok(self
            .partition
            .get(key.to_be_bytes())?
            .map(|v| v.to_vec().len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        self.partition.insert(key.to_be_bytes(), value)?;
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        self.partition.remove(key.to_be_bytes())?;
        Ok(())
    }

    fn sync(&self) -> Result {
        self.keyspace.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }

    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        let mut batch = self.keyspace.batch();
        for (key, value) in values(keys, value_size) {
            batch.insert(&self.partition, key.to_be_bytes(), value);
        }
        batch.commit()?;
        Ok(())
    }
}

// ---- heed (LMDB) ------------------------------------------------------------------------

type HeedDb = heed::Database<heed::types::U64<heed::byteorder::BigEndian>, heed::types::Bytes>;

struct Heed {
    env: heed::Env,
    db: HeedDb,
}

impl Heed {
    #[allow(unsafe_code)]
    fn open(dir: &std::path::Path, sizing: Sizing) -> Result<Heed> {
        let mut options = heed::EnvOpenOptions::new();
        options
            .map_size((sizing.heap_bytes() * 2) as usize)
            .max_dbs(1);
        // SAFETY: NO_META_SYNC is one of LMDB's documented modes; it is set before the
        // environment is opened, and no other process or environment uses this directory.
        unsafe {
            options.flags(heed::EnvFlags::NO_META_SYNC);
        }
        // SAFETY: the directory is new and private to this process, so it is opened once and
        // never by another environment, and its memory map is not modified from outside.
        let env = unsafe { options.open(dir)? };
        let mut txn = env.write_txn()?;
        let db: HeedDb = env.create_database(&mut txn, Some("bench"))?;
        txn.commit()?;
        Ok(Heed { env, db })
    }
}

impl MapStore for Heed {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let txn = self.env.read_txn()?;
        Ok(self.db.get(&txn, &key)?.map(|v| v.to_vec().len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        let mut txn = self.env.write_txn()?;
        self.db.put(&mut txn, &key, value)?;
        txn.commit()?;
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        let mut txn = self.env.write_txn()?;
        self.db.delete(&mut txn, &key)?;
        txn.commit()?;
        Ok(())
    }

    fn sync(&self) -> Result {
        self.env.force_sync()?;
        Ok(())
    }

    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        let mut txn = self.env.write_txn()?;
        for (key, value) in values(keys, value_size) {
            self.db.put(&mut txn, &key, &value)?;
        }
        txn.commit()?;
        Ok(())
    }
}

// ---- rocksdb ----------------------------------------------------------------------------

struct Rocks {
    db: rocksdb::DB,
    fast: rocksdb::WriteOptions,
    durable: rocksdb::WriteOptions,
}

impl Rocks {
    fn open(dir: &std::path::Path) -> Result<Rocks> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let db = rocksdb::DB::open(&options, dir)?;
        let mut fast = rocksdb::WriteOptions::default();
        fast.set_sync(false);
        let mut durable = rocksdb::WriteOptions::default();
        durable.set_sync(true);
        Ok(Rocks { db, fast, durable })
    }
}

impl MapStore for Rocks {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        Ok(self.db.get(key.to_be_bytes())?.map(|v| v.len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        self.db.put_opt(key.to_be_bytes(), value, &self.fast)?;
        Ok(())
    }

    fn remove(&self, key: u64) -> Result {
        self.db.delete_opt(key.to_be_bytes(), &self.fast)?;
        Ok(())
    }

    fn sync(&self) -> Result {
        self.db.flush_wal(true)?;
        Ok(())
    }

    fn insert_durable(&self, key: u64, value: &[u8]) -> Result {
        self.db.put_opt(key.to_be_bytes(), value, &self.durable)?;
        Ok(())
    }

    fn insert_batch(&self, keys: &[u64], value_size: usize) -> Result {
        let mut batch = rocksdb::WriteBatch::default();
        for (key, value) in values(keys, value_size) {
            batch.put(key.to_be_bytes(), value);
        }
        self.db.write_opt(batch, &self.fast)?;
        Ok(())
    }
}
