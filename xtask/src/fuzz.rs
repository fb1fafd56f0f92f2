//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/`, each started from its checked-in
//! seeds (`fuzz/seeds/<target>`) with a working corpus in `fuzz/corpus/<target>` (not
//! checked in), under the address sanitizer on the nightly toolchain.
//!
//! `--smoke` (CI) runs every target for a few seconds; `--seconds N` sets how long each
//! target runs; naming targets runs only those. Skipped, with a message, where `cargo
//! +nightly`, its sanitizer runtime or `cargo fuzz` is missing (`cargo install cargo-fuzz`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Result, asan_unavailable, nightly_command, project_root, run_cargo};

/// Every target in `fuzz/Cargo.toml`.
const TARGETS: [&str; 5] = [
    "heap_damage",
    "heap_bytes",
    "entry_decode",
    "payload_fields",
    "kv_protocol",
];

/// How long `--smoke` runs each target.
const SMOKE_SECONDS: u64 = 10;

pub(crate) fn run_targets(args: &[String]) -> Result {
    let usage = || "usage: cargo xtask fuzz [--smoke | --seconds N] [TARGET...]".to_owned();
    let mut seconds = None;
    let mut chosen = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => seconds = Some(SMOKE_SECONDS),
            "--seconds" => {
                let n = args.next().and_then(|n| n.parse().ok()).ok_or_else(usage)?;
                seconds = Some(n);
            }
            name if TARGETS.contains(&name) => chosen.push(name),
            _ => return Err(usage()),
        }
    }
    let seconds = seconds.ok_or_else(usage)?;
    if chosen.is_empty() {
        chosen.extend(TARGETS);
    }
    if let Some(why) = fuzz_unavailable() {
        println!("xtask fuzz: skipped: {why}");
        return Ok(());
    }
    let root = project_root();
    let fuzz = root.join("fuzz");
    // One build of every target first (they share all but their last crate), then the runs
    // side by side, as many at once as the machine has cores (libFuzzer runs one thread):
    // each run's output is printed whole when it ends.
    let build = ["+nightly", "fuzz", "build", "--fuzz-dir", "fuzz"];
    println!("$ cargo {}", build.join(" "));
    run_cargo(nightly_command(&build, &[]), &build)?;
    let time = format!("-max_total_time={seconds}");
    let mut runs = Vec::new();
    for target in &chosen {
        let corpus = fuzz.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        let seeds = fuzz.join("seeds").join(target);
        runs.push((
            *target,
            corpus.to_string_lossy().into_owned(),
            seeds.to_string_lossy().into_owned(),
        ));
    }
    let print = Mutex::new(());
    side_by_side(&runs, |(target, corpus, seeds)| {
        run_target(target, corpus, seeds, &time, &print)
    })
}

/// Runs `target` for `time` (a libFuzzer `-max_total_time=` flag) from its `corpus` and
/// `seeds`; prints its output whole, under `print`, when it ends.
fn run_target(target: &str, corpus: &str, seeds: &str, time: &str, print: &Mutex<()>) -> Result {
    let args = [
        "+nightly",
        "fuzz",
        "run",
        "--fuzz-dir",
        "fuzz",
        target,
        corpus,
        seeds,
        "--",
        time,
        // The heap targets map a heap per input; libFuzzer's default 2 GiB counts the
        // sanitizer's shadow memory too.
        "-rss_limit_mb=4096",
        // As in `cargo xtask asan`: threads that exit leave glibc's thread-local
        // destructor list and crossbeam-epoch's deferred garbage behind, which are not
        // leaks of ours.
        "-detect_leaks=0",
        "-print_final_stats=1",
    ];
    let started = std::time::Instant::now();
    let output = nightly_command(&args, &[])
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let _printing = print
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    println!("$ cargo {}", args.join(" "));
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    println!(
        "  (fuzz target {target}: {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("fuzz target {target} failed"))
    }
}

/// Runs `each` on every item, as many at once as the machine has cores; fails if any did,
/// after all have run.
fn side_by_side<T: Sync>(items: &[T], each: impl Fn(&T) -> Result + Sync) -> Result {
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len());
    let failed: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut failed = Vec::new();
                    while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = each(item) {
                            failed.push(e);
                        }
                    }
                    failed
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec!["a runner panicked".to_owned()])
            })
            .collect()
    });
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Why the fuzz targets cannot run here, if they cannot.
fn fuzz_unavailable() -> Option<String> {
    if let Some(why) = asan_unavailable() {
        return Some(why);
    }
    let fuzz = nightly_command(&["+nightly", "fuzz", "--version"], &[]).output();
    match fuzz {
        Ok(out) if out.status.success() => None,
        _ => Some("`cargo fuzz` is not installed (`cargo install cargo-fuzz`)".to_owned()),
    }
}
