//! Measuring: prefill a store, run a workload's traces on N threads for a fixed time, repeat,
//! and keep the median.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::stores::{MapStore, QueueStore, Result};
use crate::workload::{self, KeyDist, Op, Workload};

/// How long and how often each point is measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) duration: Duration,
    pub(crate) repeats: usize,
}

/// How many keys one prefill batch holds.
const PREFILL_BATCH: usize = 1000;

/// Fills `store` with every other key of the range, from `threads` threads.
pub(crate) fn prefill(
    store: &dyn MapStore,
    key_range: u64,
    value_size: usize,
    threads: usize,
) -> Result {
    let keys: Vec<u64> = workload::prefill_keys(key_range).collect();
    let chunks: Vec<&[u64]> = keys.chunks(PREFILL_BATCH).collect();
    let per_thread = chunks.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = chunks
            .chunks(per_thread)
            .map(|mine| {
                scope.spawn(move || {
                    mine.iter()
                        .try_for_each(|batch| store.insert_batch(batch, value_size))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "a prefill thread panicked")?)
    })?;
    // What was prefilled is durable before anything is measured.
    store.sync()
}

/// Runs `body(thread)` on `threads` threads until `timing.duration` has passed, `repeats`
/// times; returns each repeat's operations per second. `body` counts its operations and
/// checks the stop flag between them.
fn repeat_timed(
    threads: usize,
    timing: Timing,
    body: &(dyn Fn(usize, &AtomicBool) -> Result<u64> + Sync),
) -> Result<Vec<f64>> {
    (0..timing.repeats)
        .map(|_| {
            let stop = AtomicBool::new(false);
            let start = Barrier::new(threads + 1);
            std::thread::scope(|scope| {
                let workers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (stop, start) = (&stop, &start);
                        scope.spawn(move || {
                            start.wait();
                            let ops = body(t, stop);
                            (ops, Instant::now())
                        })
                    })
                    .collect();
                start.wait();
                let began = Instant::now();
                std::thread::sleep(timing.duration);
                stop.store(true, Ordering::Relaxed);
                let mut total = 0;
                let mut last = began;
                for worker in workers {
                    let (ops, ended) = worker.join().map_err(|_| "a bench thread panicked")?;
                    total += ops?;
                    last = last.max(ended);
                }
                Ok(total as f64 / last.duration_since(began).as_secs_f64())
            })
        })
        .collect()
}

/// Runs `workload` on a prefilled map; returns each repeat's throughput.
pub(crate) fn map_workload(
    store: &dyn MapStore,
    workload: Workload,
    dist: KeyDist,
    threads: usize,
    key_range: u64,
    value_size: usize,
    timing: Timing,
) -> Result<Vec<f64>> {
    let traces: Vec<Vec<Op>> = (0..threads)
        .map(|t| workload::trace(workload, dist, key_range, t))
        .collect();
    let sync_every = workload.sync_every();
    repeat_timed(threads, timing, &|t, stop| {
        let trace = &traces[t];
        let mut value = vec![0u8; value_size];
        let mut ops = 0u64;
        let mut unsynced = 0;
        for op in trace.iter().cycle() {
            if ops.is_multiple_of(32) && stop.load(Ordering::Relaxed) {
                break;
            }
            match *op {
                Op::Get(key) => {
                    std::hint::black_box(store.get(key)?);
                }
                Op::Insert(key) => {
                    workload::fill_value(&mut value, key);
                    match sync_every {
                        Some(1) => store.insert_durable(key, &value)?,
                        Some(n) => {
                            store.insert(key, &value)?;
                            unsynced += 1;
                            if unsynced == n {
                                store.sync()?;
                                unsynced = 0;
                            }
                        }
                        None => store.insert(key, &value)?,
                    }
                }
                Op::Remove(key) => store.remove(key)?,
            }
            ops += 1;
        }
        Ok(ops)
    })
}

/// How many elements a queue holds before measuring.
pub(crate) const QUEUE_PREFILL: usize = 1024;

/// Fills a queue with [`QUEUE_PREFILL`] elements of `value_size` bytes, as
/// [`queue_pairs`] expects it.
pub(crate) fn prefill_queue(store: &dyn QueueStore, value_size: usize) -> Result {
    let value = vec![7u8; value_size];
    for _ in 0..QUEUE_PREFILL {
        store.push(&value)?;
    }
    Ok(())
}

/// Enqueue/dequeue pairs on a queue that [`prefill_queue`] filled (each pair leaves its
/// length as it was); an operation is one enqueue or one dequeue.
pub(crate) fn queue_pairs(
    store: &dyn QueueStore,
    threads: usize,
    value_size: usize,
    timing: Timing,
) -> Result<Vec<f64>> {
    let value = vec![7u8; value_size];
    repeat_timed(threads, timing, &|_, stop| {
        let mut ops = 0u64;
        while !ops.is_multiple_of(32) || !stop.load(Ordering::Relaxed) {
            store.push(&value)?;
            std::hint::black_box(store.pop()?);
            ops += 2;
        }
        Ok(ops)
    })
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(&[4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-12);
    }

    #[test]
    fn a_transient_map_runs_every_workload() {
        let store = crate::stores::baseline::TransientMap::new();
        prefill(&store, 1000, 8, 2).unwrap();
        assert_eq!(store.get(0).unwrap(), Some(8));
        assert_eq!(store.get(1).unwrap(), None);
        let timing = Timing {
            duration: Duration::from_millis(5),
            repeats: 2,
        };
        for workload in Workload::MAP.into_iter().chain(Workload::SYNC) {
            let rates = map_workload(&store, workload, KeyDist::Zipf, 2, 1000, 8, timing).unwrap();
            assert_eq!(rates.len(), 2);
            assert!(rates.iter().all(|&r| r > 0.0), "{rates:?}");
        }
    }
}
