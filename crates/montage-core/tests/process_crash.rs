//! Real process crashes on the file backend (`Journal`): a child process writes
//! keys through operations and prints each one only after `sync()` returned; the parent kills
//! it at a random moment, reopens the heap, and checks that every acknowledged write is there
//! and that the state is a prefix of what the child did. Twenty rounds on one heap file,
//! each continuing from what the previous one recovered.
//!
//! Two kinds of crash: a SIGKILL (the page cache survives it), and a power cut on the
//! `montage-powercut` FUSE file system: after the SIGKILL the FUSE connection is aborted (the
//! kernel's dirty pages never reach the file system) and every write no `fsync` covered is
//! lost, or kept torn at sectors. Without `/dev/fuse` or the right to mount, the power-cut
//! tests say so and skip.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Duration;

use common::{Key, kv_state, write_key};
use montage_core::sim::SplitMix64;
use montage_core::{BackendKind, EpochLength, Heap, HeapConfig};
use montage_powercut::Mounted;

const KEYS: u64 = 16;
const ROUNDS: u64 = 20;

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path)
        .size(8 << 20)
        .backend(BackendKind::Journal)
        .epoch_length(EpochLength::Every(Duration::from_millis(5)))
}

fn main() -> std::process::ExitCode {
    if let (Some(path), Some(seed)) = (
        std::env::var_os("MONTAGE_CHILD_HEAP"),
        std::env::var("MONTAGE_CHILD_SEED").ok(),
    ) {
        child_writer(Path::new(&path), &seed);
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
    rounds(&dir.path().join("kill.heap"), Cut::Kill);
}

fn every_acknowledged_write_survives_a_power_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = match Mounted::mount(dir.path()) {
        Ok(mounted) => mounted,
        Err(e) => {
            eprintln!("skipped: cannot mount the power-cut file system: {e}");
            return;
        }
    };
    let path = mounted.dir().join("cut.heap");
    rounds(&path, Cut::Power(mounted));
}

/// The child process the test starts: opens (or creates) the heap at `path`, then writes
/// random keys until it is killed, printing `MONTAGE begin <key> <value|-1>` before and
/// `MONTAGE ack` after each synced operation.
fn child_writer(path: &Path, seed: &str) -> ! {
    let heap = if path.exists() {
        Heap::open(&config(path)).unwrap()
    } else {
        Heap::create(&config(path)).unwrap()
    };
    let owner = heap.register("kv").unwrap();
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
            *slot = attempt;
            Ok(())
        })
        .unwrap();
        heap.sync().unwrap();
        writeln!(out, "MONTAGE ack").unwrap();
        out.flush().unwrap();
    }
}

fn rounds(path: &Path, mut cut: Cut) {
    let path = path.to_path_buf();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut rng = SplitMix64::new(42);
    let mut total_acks = 0;
    for round in 0..ROUNDS {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env("MONTAGE_CHILD_HEAP", &path)
            .env("MONTAGE_CHILD_SEED", round.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(at) = line.find("MONTAGE ") {
                    if lines.is_empty() {
                        let _ = ready_tx.send(());
                    }
                    lines.push(line[at + 8..].to_owned());
                }
            }
            lines
        });
        // Once the child has recovered the heap, let it run 5 to 200 ms, then pull the plug.
        let came_up = ready_rx.recv_timeout(Duration::from_secs(60)).is_ok();
        std::thread::sleep(Duration::from_millis(5 + rng.next_u64() % 195));
        child.kill().unwrap();
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        if let Cut::Power(mounted) = cut {
            let survived = mounted.power_cut(rng.next_u64()).unwrap();
            cut = Cut::Power(survived.remount().unwrap());
        }
        assert!(came_up, "round {round}: the child did not start");
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

        let heap = Heap::open(&config(&path)).unwrap();
        let owner = heap.lookup("kv").unwrap();
        let got: BTreeMap<u64, u64> = kv_state(&heap, owner)
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect();
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
}
