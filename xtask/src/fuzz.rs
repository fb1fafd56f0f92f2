//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/`, each started from its checked-in
//! seeds (`fuzz/seeds/<target>`) with a working corpus in `fuzz/corpus/<target>` (not
//! checked in), under the address sanitizer on the nightly toolchain.
//!
//! `--smoke` (CI) runs every target for a few seconds; `--seconds N` sets how long each
//! target runs; naming targets runs only those. Skipped, with a message, where `cargo
//! +nightly`, its sanitizer runtime or `cargo fuzz` is missing (`cargo install cargo-fuzz`).

use std::process::Command;

use crate::{Result, asan_unavailable, command_in_root, project_root, run};

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
    let time = format!("-max_total_time={seconds}");
    for target in chosen {
        let corpus = fuzz.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        let seeds = fuzz.join("seeds").join(target);
        let corpus = corpus.to_string_lossy().into_owned();
        let seeds = seeds.to_string_lossy().into_owned();
        let args = [
            "+nightly",
            "fuzz",
            "run",
            "--fuzz-dir",
            "fuzz",
            target,
            &corpus,
            &seeds,
            "--",
            &time,
            // The heap targets map a heap per input; libFuzzer's default 2 GiB counts the
            // sanitizer's shadow memory too.
            "-rss_limit_mb=4096",
            // As in `cargo xtask asan`: threads that exit leave glibc's thread-local
            // destructor list and crossbeam-epoch's deferred garbage behind, which are not
            // leaks of ours.
            "-detect_leaks=0",
            "-print_final_stats=1",
        ];
        let mut command = command_in_root("cargo", &args, &[]);
        command
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC")
            .env_remove("RUSTDOC");
        run(command, &args)?;
    }
    Ok(())
}

/// Why the fuzz targets cannot run here, if they cannot.
fn fuzz_unavailable() -> Option<String> {
    if let Some(why) = asan_unavailable() {
        return Some(why);
    }
    let fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output();
    match fuzz {
        Ok(out) if out.status.success() => None,
        _ => Some("`cargo fuzz` is not installed (`cargo install cargo-fuzz`)".to_owned()),
    }
}
