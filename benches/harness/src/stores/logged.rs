//! Structures a user already has, made persistent by `Logged`: a `BTreeMap` (one, and
//! sharded) and a `VecDeque`, each with its methods logged by `#[montage::logged]` and
//! snapshots by the default policy (and the one `BTreeMap` with none while it runs, to
//! show what the policy costs). Their DRAM baselines are in `baseline`.

use std::collections::{BTreeMap, VecDeque};

use montage::collections::logged::SnapshotPolicy;
use montage::collections::{Logged, LoggedShards};

use super::{Backend, Contender, Dirs, MapStore, QueueStore, Result, Sizing};

/// How many shards the sharded contenders have (and how many locked maps their baseline).
pub(crate) const SHARDS: usize = 8;

/// An ordered map of byte strings, as a user would have it.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Tree {
    map: BTreeMap<u64, Vec<u8>>,
}

#[montage::logged(snapshot)]
impl Tree {
    pub(crate) fn insert(&mut self, key: u64, value: Vec<u8>) {
        self.map.insert(key, value);
    }

    pub(crate) fn remove(&mut self, key: u64) {
        self.map.remove(&key);
    }

    /// A copy of `key`'s value, as every contender's read makes.
    fn get(&self, key: u64) -> Option<Vec<u8>> {
        self.map.get(&key).cloned()
    }
}

/// A FIFO queue of byte strings, as a user would have it.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Fifo {
    queue: VecDeque<Vec<u8>>,
}

#[montage::logged(snapshot)]
impl Fifo {
    pub(crate) fn push(&mut self, value: Vec<u8>) {
        self.queue.push_back(value);
    }

    pub(crate) fn pop(&mut self) -> Option<Vec<u8>> {
        self.queue.pop_front()
    }
}

pub(crate) fn with_map(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn MapStore) -> Result,
) -> Result {
    super::montage::with_heap(contender, backend, dirs, sizing, |heap| {
        if contender == Contender::LoggedBTreeMapSharded {
            let shards = LoggedShards::<Tree>::open(heap, "bench", SHARDS)?;
            f(&shards)?;
            Ok(shards.close()?)
        } else {
            let tree = Logged::<Tree>::open(heap, "bench")?;
            if contender == Contender::LoggedBTreeMapUnsnapped {
                tree.set_snapshot_policy(SnapshotPolicy::manual());
            }
            f(&tree)?;
            Ok(tree.close()?)
        }
    })
}

pub(crate) fn with_queue(
    contender: Contender,
    backend: Backend,
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&dyn QueueStore) -> Result,
) -> Result {
    super::montage::with_heap(contender, backend, dirs, sizing, |heap| {
        let fifo = Logged::<Fifo>::open(heap, "bench")?;
        f(&fifo)?;
        Ok(fifo.close()?)
    })
}

impl MapStore for Logged<Tree> {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let value = self.read(|t| t.get(key))?;
        Ok(value.map(|v| std::hint::black_box(v).len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        Ok(TreeLogged::insert(self, key, value.to_vec())?)
    }

    fn remove(&self, key: u64) -> Result {
        Ok(TreeLogged::remove(self, key)?)
    }

    fn sync(&self) -> Result {
        Ok(self.heap().sync()?)
    }
}

impl MapStore for LoggedShards<Tree> {
    fn get(&self, key: u64) -> Result<Option<usize>> {
        let value = self.read(&key, |t| t.get(key))?;
        Ok(value.map(|v| std::hint::black_box(v).len()))
    }

    fn insert(&self, key: u64, value: &[u8]) -> Result {
        Ok(self.shard(&key)?.insert(key, value.to_vec())?)
    }

    fn remove(&self, key: u64) -> Result {
        Ok(self.shard(&key)?.remove(key)?)
    }

    fn sync(&self) -> Result {
        Ok(self.heap().sync()?)
    }
}

impl QueueStore for Logged<Fifo> {
    fn push(&self, value: &[u8]) -> Result {
        Ok(FifoLogged::push(self, value.to_vec())?)
    }

    fn pop(&self) -> Result<Option<usize>> {
        Ok(FifoLogged::pop(self)?.map(|v| v.len()))
    }
}
