//! The workloads: operation mixes over a key range, with uniform or Zipfian keys, turned into
//! per-thread traces before the clock starts so that every contender pays the same (zero) cost
//! for choosing its next operation.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::scramble::scramble;

/// One measured operation mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// Montage's read-mostly mix: 90% get, 5% insert, 5% remove.
    ReadMostly,
    /// Montage's write-heavy mix: 50% get, 25% insert, 25% remove.
    WriteHeavy,
    /// YCSB A: 50% read, 50% update.
    YcsbA,
    /// YCSB B: 95% read, 5% update.
    YcsbB,
    /// YCSB C: read only.
    YcsbC,
    /// YCSB A's mix where every write is made durable before the next operation.
    SyncEach,
    /// YCSB A's mix where each thread makes its writes durable after every 100 of them.
    Sync100,
    /// Queue: each thread enqueues then dequeues, in pairs.
    QueuePairs,
}

impl Workload {
    /// The map workloads every map contender runs, in the order they run (reads first, so
    /// that the prefilled state is what the read-only mix sees).
    pub(crate) const MAP: [Workload; 5] = [
        Workload::YcsbC,
        Workload::YcsbB,
        Workload::ReadMostly,
        Workload::YcsbA,
        Workload::WriteHeavy,
    ];

    /// The workloads that make writes durable as they go.
    pub(crate) const SYNC: [Workload; 2] = [Workload::SyncEach, Workload::Sync100];

    /// Every workload, in report order.
    pub(crate) const ALL: [Workload; 8] = [
        Workload::ReadMostly,
        Workload::WriteHeavy,
        Workload::YcsbA,
        Workload::YcsbB,
        Workload::YcsbC,
        Workload::SyncEach,
        Workload::Sync100,
        Workload::QueuePairs,
    ];

    /// The name used in results and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::ReadMostly => "90-5-5",
            Workload::WriteHeavy => "50-25-25",
            Workload::YcsbA => "ycsb-a",
            Workload::YcsbB => "ycsb-b",
            Workload::YcsbC => "ycsb-c",
            Workload::SyncEach => "sync-each",
            Workload::Sync100 => "sync-100",
            Workload::QueuePairs => "queue-pairs",
        }
    }

    /// Percentages of (get, insert, remove); updates count as inserts of keys that exist.
    fn mix(self) -> (u32, u32, u32) {
        match self {
            Workload::ReadMostly => (90, 5, 5),
            Workload::WriteHeavy => (50, 25, 25),
            Workload::YcsbA | Workload::SyncEach | Workload::Sync100 => (50, 50, 0),
            Workload::YcsbB => (95, 5, 0),
            Workload::YcsbC => (100, 0, 0),
            Workload::QueuePairs => (0, 50, 50),
        }
    }

    /// How many writes a thread makes between two `sync`s (`None`: it never syncs).
    pub(crate) fn sync_every(self) -> Option<u32> {
        match self {
            Workload::SyncEach => Some(1),
            Workload::Sync100 => Some(100),
            _ => None,
        }
    }
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyDist {
    /// Every key of the range equally likely.
    Uniform,
    /// YCSB's scrambled Zipfian (constant 0.99): a few hot keys spread over the range.
    Zipf,
}

impl KeyDist {
    /// The name used in results and reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            KeyDist::Uniform => "uniform",
            KeyDist::Zipf => "zipf",
        }
    }
}

/// One operation of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Get(u64),
    Insert(u64),
    Remove(u64),
}

/// How many operations a trace holds before a thread starts it over.
pub(crate) const TRACE_LEN: usize = 1 << 20;

/// The YCSB Zipfian constant.
const ZIPF_THETA: f64 = 0.99;

/// Thread `thread`'s trace of `workload` over keys `0..key_range` (deterministic per thread).
pub(crate) fn trace(workload: Workload, dist: KeyDist, key_range: u64, thread: usize) -> Vec<Op> {
    let (get, insert, _) = workload.mix();
    let mut rng = SmallRng::seed_from_u64(0x6d6f_6e74 ^ (thread as u64).wrapping_mul(0x9E37));
    let zipf = Zipf::new(key_range as f64, ZIPF_THETA).ok();
    let len = TRACE_LEN.min(key_range.saturating_mul(4).max(1024) as usize);
    (0..len)
        .map(|_| {
            let key = match (dist, &zipf) {
                (KeyDist::Zipf, Some(zipf)) => {
                    scramble(zipf.sample(&mut rng) as u64 - 1, key_range)
                }
                _ => rng.random_range(0..key_range),
            };
            let roll = rng.random_range(0..100);
            if roll < get {
                Op::Get(key)
            } else if roll < get + insert {
                Op::Insert(key)
            } else {
                Op::Remove(key)
            }
        })
        .collect()
}

/// The keys a store holds before measuring: every other key, half the range.
pub(crate) fn prefill_keys(key_range: u64) -> impl Iterator<Item = u64> + Clone {
    (0..key_range).step_by(2)
}

/// The value written for `key`: `value_size` bytes starting with the key, so every value
/// differs and a store cannot deduplicate them.
pub(crate) fn fill_value(buf: &mut [u8], key: u64) {
    let tag = key.to_le_bytes();
    let n = tag.len().min(buf.len());
    buf[..n].copy_from_slice(&tag[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_follow_their_mix() {
        let ops = trace(Workload::ReadMostly, KeyDist::Uniform, 1000, 0);
        let gets = ops.iter().filter(|op| matches!(op, Op::Get(_))).count();
        let share = gets as f64 / ops.len() as f64;
        assert!((0.88..0.92).contains(&share), "get share {share}");
        assert!(ops.iter().all(|op| match op {
            Op::Get(k) | Op::Insert(k) | Op::Remove(k) => *k < 1000,
        }));
    }

    #[test]
    fn zipf_traces_are_skewed() {
        let ops = trace(Workload::YcsbC, KeyDist::Zipf, 100_000, 1);
        let mut counts = std::collections::HashMap::new();
        for op in &ops {
            if let Op::Get(k) = op {
                *counts.entry(*k).or_insert(0u32) += 1;
            }
        }
        let hottest = counts.values().max().copied().unwrap_or(0);
        // Under uniform keys a key appears about 4 times in a trace of this length.
        assert!(hottest > 1000, "hottest key seen {hottest} times");
    }
}
