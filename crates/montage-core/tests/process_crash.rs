//! Real process crashes on the file backend (`Journal`): a child process writes
//! keys through operations and prints each one only after `sync()` returned; the parent kills
//! it at a random moment, reopens the heap, and checks that every acknowledged write is there
//! and that the state is a prefix of what the child did. Twenty rounds on one heap file,
//! each continuing from what the previous one recovered.
//!
//! A third run makes the heap grow all the time: it starts at the minimum size, and each
//! operation also allocates a 10 KB payload that is never freed, so the heap grows six to
//! eleven times over the rounds (extending its file, writing its span count) with kills
//! landing at random moments around those growths; every acknowledged payload must survive.
//!
//! Two kinds of crash: a SIGKILL (the page cache survives it), and a power cut on the
//! `montage-powercut` FUSE file system: after the SIGKILL the FUSE connection is aborted (the
//! kernel's dirty pages never reach the file system) and every write no `fsync` covered is
//! lost, or kept torn at sectors. Without `/dev/fuse` or the right to mount, the power-cut
//! tests say so and skip.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::{Key, kv_state, write_key};
use montage_core::limits::MIN_HEAP_SIZE;
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, EpochLength, Heap, HeapConfig, ScanFilter};
use montage_powercut::Mounted;

const KEYS: u64 = 16;
const ROUNDS: u64 = 20;

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(8 << 20)
        .max_size(8 << 20)
        .backend(BackendKind::Journal)
        .epoch_length(EpochLength::Every(Duration::from_millis(5)))
}

/// The heap of the growing run: it starts at the minimum size.
fn growing_config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(MIN_HEAP_SIZE)
        .max_size(256 << 20)
        .backend(BackendKind::Journal)
        .epoch_length(EpochLength::Every(Duration::from_millis(5)))
}

/// The payload each operation of the growing run adds, under the owner "ballast".
const BALLAST: usize = 10_000;

/// Whether a run grows its heap.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Growth {
    Fixed,
    Growing,
}

impl Growth {
    fn config(self, path: &Path) -> HeapConfig {
        match self {
            Growth::Fixed => config(path),
            Growth::Growing => growing_config(path),
        }
    }
}

fn main() -> std::process::ExitCode {
    if let (Some(path), Some(seed)) = (
        std::env::var_os("MONTAGE_CHILD_HEAP"),
        std::env::var("MONTAGE_CHILD_SEED").ok(),
    ) {
        let growth = if std::env::var_os("MONTAGE_CHILD_GROWS").is_some() {
            Growth::Growing
        } else {
            Growth::Fixed
        };
        child_writer(Path::new(&path), &seed, growth);
    }
    montage_testkit::run_tests(&[
        (
            "every_acknowledged_write_survives_sigkill_on_a_journaled_file",
            every_acknowledged_write_survives_sigkill,
        ),
        (
            "every_acknowledged_write_survives_a_power_cut_on_a_journaled_file",
            every_acknowledged_write_survives_a_power_cut,
        ),
        (
            "every_acknowledged_write_survives_sigkill_while_the_heap_grows",
            every_acknowledged_write_survives_sigkill_while_the_heap_grows,
        ),
        (
            "every_acknowledged_write_survives_a_power_cut_while_the_heap_grows",
            every_acknowledged_write_survives_a_power_cut_while_the_heap_grows,
        ),
    ])
}

/// How a round ends.
enum Cut {
    /// SIGKILL the child.
    Kill,
    /// SIGKILL the child, then cut the power of the file system the heap is on.
    Power(Mounted),
}

fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    rounds(&dir.path().join("kill.heap"), Cut::Kill, Growth::Fixed);
}

fn every_acknowledged_write_survives_sigkill_while_the_heap_grows() {
    let dir = tempfile::tempdir().unwrap();
    rounds(&dir.path().join("grow.heap"), Cut::Kill, Growth::Growing);
}

fn every_acknowledged_write_survives_a_power_cut() {
    power_cut_rounds(Growth::Fixed);
}

fn every_acknowledged_write_survives_a_power_cut_while_the_heap_grows() {
    power_cut_rounds(Growth::Growing);
}

/// The rounds on the power-cut file system (skipped, saying so, where it cannot be mounted).
fn power_cut_rounds(growth: Growth) {
    let dir = tempfile::tempdir().unwrap();
    let mounted = match Mounted::mount(dir.path()) {
        Ok(mounted) => mounted,
        Err(e) => {
            eprintln!("skipped: cannot mount the power-cut file system: {e}");
            return;
        }
    };
    let path = mounted.dir().join("cut.heap");
    rounds(&path, Cut::Power(mounted), growth);
}

/// The child process the test starts: opens (or creates) the heap at `path`, then writes
/// random keys until it is killed, printing `MONTAGE begin <key> <value|-1>` before and
/// `MONTAGE ack` after each synced operation.
fn child_writer(path: &Path, seed: &str, growth: Growth) -> ! {
    let heap = if path.exists() {
        Heap::open(&growth.config(path)).unwrap()
    } else {
        Heap::create(&growth.config(path)).unwrap()
    };
    let owner = heap.register("kv").unwrap();
    let ballast = heap.register("ballast").unwrap();
    let mut slots: BTreeMap<u64, Key> = kv_state(&heap, owner)
        .into_iter()
        .map(|(k, (_, b))| {
            let key = Key {
                block: Some(b),
                stamp: 0,
            };
            (k, key)
        })
        .collect();
    let mut rng = SplitMix64::new(seed.parse().unwrap());
    let mut out = std::io::stdout().lock();
    writeln!(out, "MONTAGE ready").unwrap();
    out.flush().unwrap();
    loop {
        let key = rng.next_u64() % KEYS;
        let value = (!rng.next_u64().is_multiple_of(4)).then(|| rng.next_u64() % 1_000_000);
        writeln!(
            out,
            "MONTAGE begin {key} {}",
            value.map_or(-1, u64::cast_signed)
        )
        .unwrap();
        out.flush().unwrap();
        let slot = slots.entry(key).or_default();
        heap.run_op(|op| {
            let mut attempt = *slot;
            write_key(op, owner, &mut attempt, key, value)?;
            if growth == Growth::Growing {
                op.alloc(ballast, 1, &[0xBA; BALLAST])?;
            }
            *slot = attempt;
            Ok(())
        })
        .unwrap();
        heap.sync().unwrap();
        writeln!(out, "MONTAGE ack").unwrap();
        out.flush().unwrap();
    }
}

/// In the growing run, after a round that began `begun` operations and acknowledged
/// `acked`, with `before` ballast payloads recovered after the round before: one ballast
/// payload per operation, at least one per acknowledged operation and at most one per begun
/// one, each whole. Returns how many there are now.
fn check_ballast(heap: &Heap, round: u64, before: usize, acked: usize, begun: usize) -> usize {
    let owner = heap.lookup("ballast").unwrap();
    let found = heap.collect(ScanFilter::all().owner(owner)).unwrap();
    for info in &found {
        assert_eq!(heap.read_payload(info.block).unwrap(), [0xBA; BALLAST]);
    }
    assert!(
        found.len() >= before + acked && found.len() <= before + begun,
        "round {round}: {} ballast payloads after {before} and {acked} acknowledged of {begun} \
         begun",
        found.len(),
    );
    found.len()
}

/// The keys and values of the "kv" structure.
fn state(heap: &Heap) -> BTreeMap<u64, u64> {
    let owner = heap.lookup("kv").unwrap();
    kv_state(heap, owner)
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect()
}

/// Opens the heap as `config` says, after checking that a read-only open recovers the
/// same state and changes neither file; returns it with its state.
fn reopen(config: &HeapConfig, round: u64) -> (Heap, BTreeMap<u64, u64>) {
    let path = config.path().unwrap();
    let files = files_digest(path);
    let reader = Heap::open(&config.clone().read_only(true)).unwrap();
    let seen = state(&reader);
    reader.close().unwrap();
    assert_eq!(
        files_digest(path),
        files,
        "round {round}: a read-only open wrote"
    );
    let heap = Heap::open(config).unwrap();
    let got = state(&heap);
    assert_eq!(
        seen, got,
        "round {round}: the read-only open saw another state"
    );
    (heap, got)
}

/// A checksum of the heap file and its journal (0 for a journal that is not there).
fn files_digest(path: &Path) -> (u32, u32) {
    let journal = std::fs::read(Heap::journal_path(path)).map_or(0, |bytes| crc32c::crc32c(&bytes));
    (crc32c::crc32c(&std::fs::read(path).unwrap()), journal)
}

fn rounds(path: &Path, mut cut: Cut, growth: Growth) {
    let path = path.to_path_buf();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut rng = SplitMix64::new(42);
    let mut total_acks = 0;
    // The growing run: ballast payloads recovered after the last round, and the heap's sizes.
    let mut ballast = 0;
    let mut sizes = Vec::new();
    for round in 0..ROUNDS {
        let seed = round.to_string();
        let mut env = vec![
            ("MONTAGE_CHILD_HEAP", path.as_os_str()),
            ("MONTAGE_CHILD_SEED", seed.as_ref()),
        ];
        if growth == Growth::Growing {
            env.push(("MONTAGE_CHILD_GROWS", "1".as_ref()));
        }
        // Once the child has recovered the heap, let it run 5 to 200 ms, then pull the plug.
        let run_for = Duration::from_millis(5 + rng.next_u64() % 195);
        let lines = montage_testkit::kill_child_after(&env, run_for);
        if let Cut::Power(mounted) = cut {
            let survived = mounted.power_cut(rng.next_u64()).unwrap();
            cut = Cut::Power(survived.remount().unwrap());
        }
        let lines = lines.unwrap_or_else(|| panic!("round {round}: the child did not start"));
        assert!(
            lines.first().is_some_and(|l| l == "ready"),
            "round {round}: the child never came up: {lines:?}"
        );

        // The operations the child began, and how many it acknowledged.
        let mut ops: Vec<(u64, Option<u64>)> = Vec::new();
        let mut acked = 0;
        for line in &lines[1..] {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["begin", key, value] => {
                    let value: i64 = value.parse().unwrap();
                    ops.push((key.parse().unwrap(), u64::try_from(value).ok()));
                }
                ["ack"] => acked = ops.len(),
                _ => panic!("unexpected line {line:?}"),
            }
        }
        total_acks += acked;

        // Every third round after a SIGKILL opens the journal heap on another backend, which
        // recovers it on its journal and then removes the journal (the next round's child
        // makes a new one).
        let mut config = growth.config(&path);
        if matches!(cut, Cut::Kill) && round % 3 == 2 {
            config = config.backend(BackendKind::Eadr);
        }
        let (heap, got) = reopen(&config, round);
        if growth == Growth::Growing {
            ballast = check_ballast(&heap, round, ballast, acked, ops.len());
            sizes.push(heap.size());
        }
        heap.close().unwrap();
        // Some prefix of the operations, at least every acknowledged one, explains the state.
        let mut candidate = model.clone();
        let mut prefixes = Vec::new();
        for (i, &(key, value)) in ops.iter().enumerate() {
            if i >= acked {
                prefixes.push(candidate.clone());
            }
            match value {
                Some(v) => candidate.insert(key, v),
                None => candidate.remove(&key),
            };
        }
        prefixes.push(candidate);
        let Some(matched) = prefixes.into_iter().find(|p| *p == got) else {
            panic!(
                "round {round}: recovered state is no prefix containing the {acked} acknowledged \
                 of {} begun operations",
                ops.len()
            );
        };
        model = matched;
    }
    assert!(total_acks > 0, "the children never acknowledged a write");
    if growth == Growth::Growing {
        // Each growth doubles the heap: over the rounds it doubled at least six times, in
        // at least three rounds (how far depends on the build's speed: a debug build on the
        // power-cut file system does a few hundred operations a round).
        let grew = sizes.windows(2).filter(|w| w[1] > w[0]).count();
        let last = sizes.last().copied().unwrap_or(0);
        assert!(
            grew >= 3 && last >= 64 * MIN_HEAP_SIZE,
            "the heap grew in only {grew} of {ROUNDS} rounds, to {last} bytes: {sizes:?}"
        );
    }
}
