//! Recovery of a journal heap whose journal is full to its checkpoint bound: a child process
//! writes 1 KiB values with the clock advanced by hand (so no background checkpoint runs)
//! until three quarters of the journal's ring hold records since the last checkpoint,
//! syncs, says so, and is killed with SIGKILL; the parent then writes the page cache back
//! and drops it (as after a power cut, where it is empty; where that is not permitted the
//! table says `warm`) and times `Heap::open`, which replays every record into the heap
//! file, makes it durable, and runs the recovery scan.
//!
//! `cargo run --release -p montage-bench --bin montage-replay -- [JOURNAL_MIB...]`
//! (default 64 256 1024; the heap is four times the journal). Files go to
//! `MONTAGE_BENCH_DIR` (default `target/bench-replay`), which should be on a disk.

#![allow(clippy::print_stdout, clippy::print_stderr)]
#![allow(clippy::cast_precision_loss)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use montage_core::{BackendKind, EpochLength, Heap, HeapConfig};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const VALUE: usize = 1024;

fn config(path: &Path, journal_mib: u64) -> HeapConfig {
    HeapConfig::new(path)
        .size(journal_mib << 22)
        .journal_size(journal_mib << 20)
        .backend(BackendKind::Journal)
        .epoch_length(EpochLength::Manual)
}

/// The child: fills the journal to three quarters of its ring, syncs, and waits.
fn child(path: &Path, journal_mib: u64) -> Result {
    let heap = Heap::create(&config(path, journal_mib))?;
    let owner = heap.register("replay")?;
    // A record holds each value with a 16-byte range header; the advances add a little.
    let target = (journal_mib << 20) * 3 / 4;
    let per_value = VALUE as u64 + 40 + 16;
    let values = target / per_value * 95 / 100;
    let value = vec![7u8; VALUE];
    for i in 0..values {
        heap.run_op(|op| op.alloc(owner, 1, &value))?;
        if i % 1000 == 999 {
            heap.advance_epoch()?;
        }
    }
    heap.sync()?;
    println!("MONTAGE ready {values}");
    loop {
        std::thread::park();
    }
}

/// Writes every dirty page back and drops the page cache; whether that was permitted.
fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", b"3").is_ok()
}

fn main() -> Result {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let (Some(path), Some(mib)) = (
        std::env::var_os("MONTAGE_REPLAY_CHILD"),
        std::env::var("MONTAGE_REPLAY_MIB").ok(),
    ) {
        return child(Path::new(&path), mib.parse()?);
    }
    let sizes: Vec<u64> = if args.is_empty() {
        vec![64, 256, 1024]
    } else {
        args.iter()
            .map(|a| a.parse())
            .collect::<std::result::Result<_, _>>()?
    };
    let dir = std::env::var_os("MONTAGE_BENCH_DIR")
        .map_or_else(|| PathBuf::from("target/bench-replay"), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    println!(
        "| journal | heap | values in the journal | replayed | bytes | page cache | open (replay, sync, scan) |"
    );
    println!("|---:|---:|---:|---:|---:|---|---:|");
    for mib in sizes {
        let path = dir.join(format!("replay-{mib}.heap"));
        let journal = dir.join(format!("replay-{mib}.heap.journal"));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&journal);
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .env("MONTAGE_REPLAY_CHILD", &path)
            .env("MONTAGE_REPLAY_MIB", mib.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no child stdout")?;
        let mut values = 0u64;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(n) = line.strip_prefix("MONTAGE ready ") {
                values = n.trim().parse()?;
                break;
            }
        }
        child.kill()?;
        child.wait()?;
        if values == 0 {
            return Err("the child never filled its journal".into());
        }
        let cold = drop_page_cache();
        let config = config(&path, mib);
        let start = Instant::now();
        let heap = Heap::open(&config)?;
        let took = start.elapsed();
        let report = heap.recovery_report().clone();
        heap.close()?;
        println!(
            "| {mib} MiB | {} MiB | {values} | {} records | {:.0} MiB | {} | {:.2} s |",
            mib * 4,
            report.journal_records,
            report.journal_bytes as f64 / f64::from(1 << 20),
            if cold { "cold" } else { "warm" },
            took.as_secs_f64()
        );
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&journal);
    }
    Ok(())
}
