//! Real process crashes of logged structures on heap files: a child process calls a
//! `Logged<History>` alone and together with a shard of a `LoggedShards<History>`, a
//! `HashMap` and a `Queue` (each together puts its id in both, bumps a count in the map, and
//! every fourth also takes the queue's front out of both), with snapshots taken by the
//! background policy all along, and prints each call's id before it and an acknowledgement
//! after `sync()` returned; the parent kills it with SIGKILL at a random moment, reopens the
//! heap, and checks that each history is the one before the round followed by a prefix of
//! the round's calls that holds every acknowledged one, and that every call made together is
//! in all four structures or in none. Twelve rounds on one heap file, alternating the
//! journal and the pmem backends (each open of the other kind recovers on what the last one
//! left).

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use montage_collections::logged::{Replay, SnapshotPolicy};
use montage_collections::{Change, HashMap, Logged, LoggedShards, Queue, together};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, EpochLength, Heap, HeapConfig};

const ROUNDS: u64 = 12;
const SHARDS: usize = 3;

/// The ids of the calls, in order; snapshots in serde's form.
#[derive(Default, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct History(Vec<u64>);

impl Replay for History {
    type Op = u64;
    type Output = ();

    fn apply(&mut self, id: u64) {
        self.0.push(id);
    }

    montage_collections::serde_snapshots!();
}

fn config(path: &Path, round: u64) -> HeapConfig {
    let backend = if round.is_multiple_of(2) {
        BackendKind::Journal
    } else {
        BackendKind::Pmem
    };
    HeapConfig::new(path)
        .size(16 << 20)
        .max_size(16 << 20)
        .backend(backend)
        .epoch_length(EpochLength::Every(Duration::from_millis(5)))
}

/// Whether the call with this id goes to both structures.
fn together_id(id: u64) -> bool {
    id % 2 == 1
}

/// Whether the together with this id also takes the queue's front out of the queue and the
/// map.
fn takes_front(id: u64) -> bool {
    id % 8 == 7
}

/// The key of the count of togethers in the map.
const COUNT: u64 = u64::MAX;

/// The structures: a history, its sharded twin, and the map and queue changed together.
struct Structures {
    a: Logged<History>,
    b: LoggedShards<History>,
    map: HashMap<u64, u64>,
    queue: Queue<u64>,
}

fn open(heap: &Heap) -> Structures {
    let a = Logged::<History>::open(heap, "a").unwrap();
    let b = LoggedShards::<History>::open(heap, "b", SHARDS).unwrap();
    a.set_snapshot_policy(SnapshotPolicy::log_bytes(512).relative_to_snapshot(50));
    b.set_snapshot_policy(SnapshotPolicy::log_bytes(256).relative_to_snapshot(50));
    let map = HashMap::open(heap, "map").unwrap();
    let queue = Queue::open(heap, "queue").unwrap();
    Structures { a, b, map, queue }
}

/// The map's entries (sorted) and the queue's elements that the togethers of `history`
/// leave.
fn derived(history: &[u64]) -> (Vec<(u64, u64)>, Vec<u64>) {
    let mut queue = std::collections::VecDeque::new();
    let mut count = 0;
    for &id in history.iter().filter(|&&id| together_id(id)) {
        queue.push_back(id);
        count += 1;
        if takes_front(id) {
            queue.pop_front();
        }
    }
    let mut map: Vec<(u64, u64)> = queue.iter().map(|&id| (id, id)).collect();
    if count > 0 {
        map.push((COUNT, count));
    }
    map.sort_unstable();
    (map, queue.into())
}

/// The child: opens (or creates) the heap, then calls until it is killed, printing
/// `MONTAGE begin <id>` before and `MONTAGE ack` after each synced call.
fn child(path: &Path, round: u64) -> ! {
    let config = config(path, round);
    let heap = if path.exists() {
        Heap::open(&config).unwrap()
    } else {
        Heap::create(&config).unwrap()
    };
    let Structures { a, b, map, queue } = open(&heap);
    let mut out = std::io::stdout().lock();
    writeln!(out, "MONTAGE ready").unwrap();
    out.flush().unwrap();
    for i in 0.. {
        let id = (round << 32) | i;
        writeln!(out, "MONTAGE begin {id}").unwrap();
        out.flush().unwrap();
        if together_id(id) {
            together(&heap, |tx| {
                tx.log(&a, id)?;
                tx.log_shard(&b.shard(&id)?, id)?;
                let front = tx.queue(&queue, |q| {
                    q.push_back(id)?;
                    if takes_front(id) {
                        q.pop_front()
                    } else {
                        Ok(None)
                    }
                })?;
                tx.hash_map(&map, |m| {
                    m.put(id, id)?;
                    m.compute(&COUNT, |n| (Change::Set(n.unwrap_or(0) + 1), ()))?;
                    match front {
                        Some(front) => m.delete(&front).map(drop),
                        None => Ok(()),
                    }
                })
            })
            .unwrap();
        } else {
            a.apply(id).unwrap();
        }
        heap.sync().unwrap();
        writeln!(out, "MONTAGE ack").unwrap();
        out.flush().unwrap();
    }
    unreachable!("the child runs until it is killed")
}

fn main() -> std::process::ExitCode {
    if let (Some(path), Some(round)) = (
        std::env::var_os("MONTAGE_CHILD_HEAP"),
        std::env::var("MONTAGE_CHILD_ROUND").ok(),
    ) {
        child(Path::new(&path), round.parse().unwrap());
    }
    montage_testkit::run_tests(&[(
        "every_acknowledged_logged_call_survives_sigkill_on_journal_and_pmem_files",
        every_acknowledged_logged_call_survives_sigkill,
    )])
}

/// Runs one child for `round` on the heap at `path`, kills it after 5 to 200 ms; returns the
/// ids it began and how many of them it acknowledged.
fn run_child(path: &Path, round: u64, rng: &mut SplitMix64) -> (Vec<u64>, usize) {
    let round_text = round.to_string();
    let lines = montage_testkit::kill_child_after(
        &[
            ("MONTAGE_CHILD_HEAP", path.as_os_str()),
            ("MONTAGE_CHILD_ROUND", round_text.as_ref()),
        ],
        Duration::from_millis(5 + rng.next_u64() % 195),
    )
    .unwrap_or_else(|| panic!("round {round}: the child did not start"));
    let mut begun = Vec::new();
    let mut acked = 0;
    for line in &lines[1..] {
        match line.split(' ').collect::<Vec<_>>()[..] {
            ["begin", id] => begun.push(id.parse().unwrap()),
            ["ack"] => acked = begun.len(),
            _ => panic!("round {round}: unexpected line {line:?}"),
        }
    }
    (begun, acked)
}

fn every_acknowledged_logged_call_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("logged.heap");
    let mut rng = SplitMix64::new(7);
    let mut a_before: Vec<u64> = Vec::new();
    let mut total_acked = 0;
    for round in 0..ROUNDS {
        let (begun, acked) = run_child(&path, round, &mut rng);
        total_acked += acked;
        // The next round's backend recovers what this one left.
        let heap = Heap::open(&config(&path, round + 1)).unwrap();
        let Structures { a, b, map, queue } = open(&heap);
        let got = a.read(|h| h.0.clone()).unwrap();
        assert!(
            got.starts_with(&a_before),
            "round {round}: the history before the round changed"
        );
        let new = &got[a_before.len()..];
        assert!(
            begun.starts_with(new) && new.len() >= acked,
            "round {round}: recovered {} calls of the {} begun ({acked} acknowledged), not a prefix",
            new.len(),
            begun.len()
        );
        let in_b: std::collections::BTreeSet<u64> = (0..SHARDS)
            .flat_map(|i| b.shard_at(i).unwrap().read(|h| h.0.clone()).unwrap())
            .collect();
        let together_in_a: std::collections::BTreeSet<u64> =
            got.iter().copied().filter(|&id| together_id(id)).collect();
        assert_eq!(
            together_in_a, in_b,
            "round {round}: a call made together was torn"
        );
        let mut entries: Vec<(u64, u64)> = map.iter().map(Result::unwrap).collect();
        entries.sort_unstable();
        assert_eq!(
            (entries, queue.to_vec().unwrap()),
            derived(&got),
            "round {round}: a together was torn in the map or the queue"
        );
        assert!(a.verify_replay().unwrap() && b.verify_replay().unwrap());
        a_before = got;
        a.close().unwrap();
        b.close().unwrap();
        heap.close().unwrap();
    }
    assert!(
        total_acked > 0,
        "no call was acknowledged in {ROUNDS} rounds"
    );
}
