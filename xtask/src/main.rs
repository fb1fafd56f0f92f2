//! The project's own automation: `cargo xtask <command>`.
//!
//! * `ci`: everything CI checks, in order, failing fast;
//! * `tidy`: the conventions the compiler cannot check;
//! * `crash [--seeds N] [--from S] [--heap]`: the epoch model crash test (or the heap
//!   layer's crash suites) with many seeds, in release mode, ending with
//!   `N passed, M failed, K simulated power failures`;
//! * `loom`: the loom tests of the epoch handshake and the verified CAS;
//! * `asan`: the core's unit tests (the verified structures, the heap, the region), the
//!   lock-free stress tests and the heap-file tests under the address sanitizer, with the
//!   strict-provenance lints denied, on the nightly
//!   toolchain (skipped, with a message, where `cargo +nightly` or its sanitizer runtime is
//!   missing);
//! * `fuzz [--smoke | --seconds N] [TARGET...]`: the cargo-fuzz targets in `fuzz/` (heap open
//!   and recovery on damaged files, the collections' entry decoding, typed payload reads, the
//!   memcached protocol parser), each for a few seconds (`--smoke`) or `N` seconds, under
//!   the address sanitizer (skipped, with a message, where the nightly toolchain or `cargo fuzz`
//!   is missing);
//! * `ui [--bless]`: the derive's compile-fail tests (`--bless` rewrites the expected text);
//! * `bench [--no-peers] [ARGS]`: the throughput harness with every contender (the embedded
//!   stores too, unless `--no-peers`), passing `ARGS` on (`--quick` for a short run;
//!   `--help` lists them);
//!   `bench --criterion`: the criterion micro-benchmarks;
//! * `kv-conformance`: memcached's `memccapable` against the `montage-kv` server;
//! * `bench-kv [ARGS]`: `memcaslap` against `montage-kv` and a real `memcached`;
//!   `bench-kv --evict [ARGS]`: hit ratio and throughput of a Zipfian cache-aside load four
//!   times the memory limit, against memcached's; `bench-kv --meta [ARGS]`: the meta
//!   protocol's `mg`/`ms` throughput against memcached's.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod fuzz;
mod kv;
mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("tidy") => tidy::run(&project_root()),
        Some("crash") => crash(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("loom") => loom(),
        Some("asan") => asan(),
        Some("fuzz") => fuzz::run_targets(&args[1..]),
        Some("ui") => ui(&args[1..]),
        Some("kv-conformance") => kv::conformance(),
        Some("bench-kv") => kv::bench(&args[1..]),
        _ => Err(
            "usage: cargo xtask <ci | tidy | crash [--seeds N] [--from S] [--heap] | loom | asan | fuzz [--smoke | --seconds N] | ui [--bless] | bench [--criterion | --no-peers ARGS] | kv-conformance | bench-kv [--evict | --meta] [ARGS]>"
                .to_owned(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs cargo with `args` from the project root, with extra environment variables.
fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result {
    run_cargo(cargo_command(args, env), args)
}

/// [`run`] for `command`, a cargo invocation with `args`.
fn run_cargo(command: Command, args: &[&str]) -> Result {
    run(
        command,
        &cargo_step(args),
        &format!("cargo {}", args.join(" ")),
    )
}

/// How a step's time is labelled: `cargo test` for `args` `["test", ...]`.
fn cargo_step(args: &[&str]) -> String {
    format!("cargo {}", args.first().copied().unwrap_or_default())
}

/// Runs `command` (`line`, for the failure message) and fails if it does; says how long
/// `name` took (CI has a time limit, and this shows where the time goes).
fn run(mut command: Command, name: &str, line: &str) -> Result {
    let started = std::time::Instant::now();
    let ran = command.status().map(|status| status.success());
    let spawned = ran.is_ok();
    let (timing, result) = outcome(name, line, started, ran);
    if spawned {
        println!("{timing}");
    }
    result
}

/// How a step that began at `started` ended, given whether its command could be run and
/// succeeded: the line saying how long `name` took, and the step's result (`line` names
/// the command in a failure).
fn outcome(
    name: &str,
    line: &str,
    started: std::time::Instant,
    ran: std::io::Result<bool>,
) -> (String, Result) {
    let timing = format!("  ({name}: {:.0} s)", started.elapsed().as_secs_f64());
    let result = match ran {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("step failed: {line}")),
        Err(e) => Err(format!("cannot run {name}: {e}")),
    };
    (timing, result)
}

/// Builds every binary and example of the workspace in the `test` profile, with the features
/// `cargo test --workspace` unifies: after that command, only what it did not need (the
/// binaries of packages without integration tests, for instance) is compiled.
fn build_test_profile() -> Result {
    cargo(
        &[
            "build",
            "--workspace",
            "--profile",
            "test",
            "--bins",
            "--examples",
        ],
        &[("RUSTFLAGS", "-D warnings")],
    )
}

/// The path of `name` (a binary, or `examples/<name>`) as [`build_test_profile`] built it.
fn built(name: &str) -> PathBuf {
    project_root().join("target").join("debug").join(name)
}

/// Runs `name` as [`build_test_profile`] built it, with `args`, from the project root.
fn run_built(name: &str, args: &[&str]) -> Result {
    let path = built(name);
    let line = format!("{} {}", path.display(), args.join(" "));
    println!("$ {line}");
    let mut command = Command::new(&path);
    command.args(args).current_dir(project_root());
    run(command, name, &line)
}

/// The cargo invocation `args` with extra environment `env`, from the project root, echoed.
fn cargo_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    println!("$ cargo {}", args.join(" "));
    quiet_cargo_command(args, env)
}

/// [`cargo_command`] without the echo.
fn quiet_cargo_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .args(args)
        .envs(env.iter().copied())
        .current_dir(project_root());
    command
}

/// `cargo test --release -p montage-core --test <test>`, then `extra`.
fn release_core_test<'a>(test: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "test",
        "--release",
        "--package",
        "montage-core",
        "--test",
        test,
    ];
    args.extend_from_slice(extra);
    args
}

fn ci() -> Result {
    let started = std::time::Instant::now();
    let result = ci_steps();
    println!("xtask ci: {:.0} s in all", started.elapsed().as_secs_f64());
    result
}

fn ci_steps() -> Result {
    let deny = [
        ("RUSTFLAGS", "-D warnings"),
        ("RUSTDOCFLAGS", "-D warnings"),
    ];
    cargo(&["fmt", "--all", "--", "--check"], &[])?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &deny,
    )?;
    // The test command README.md gives.
    cargo(&["test", "--workspace"], &deny)?;
    // Everything after this runs what that command built, in its profile (`test`: opt-level
    // 1, debug assertions and overflow checks on), so that CI compiles the workspace once:
    // the binaries and examples it did not build, with the features it unified.
    build_test_profile()?;
    crash_runs(deny[0])?;
    // The main example, which checks what it recovers.
    run_built("examples/ledger", &[])?;
    loom()?;
    asan()?;
    fuzz::run_targets(&["--smoke".to_owned()])?;
    cargo(&["doc", "--workspace", "--no-deps"], &deny)?;
    // The internal docs too: their links break where the public ones cannot show it (an
    // ambiguous name inside the crate, a private item).
    cargo(
        &[
            "doc",
            "--workspace",
            "--no-deps",
            "--document-private-items",
        ],
        &deny,
    )?;
    // The criterion benches are not built here: clippy above checks them (`--all-targets`),
    // and building them optimised took two minutes of CI's twenty; `cargo xtask bench
    // --criterion` builds and runs them.
    // The throughput harness and the memory measurement end to end, tiny and without the
    // embedded stores (their builds are long; `cargo xtask bench` measures them, optimised).
    run_built(
        "montage-bench",
        &[
            "--quick",
            "--key-range",
            "2000",
            "--duration-ms",
            "20",
            "--out",
            "target/bench-ci",
        ],
    )?;
    run_built("montage-memory", &["20000"])?;
    // The memcached server against memcached's own conformance tool.
    kv::conformance()?;
    tidy::run(&project_root())?;
    println!("xtask ci: all steps passed");
    Ok(())
}

/// One command of [`crash_runs`]: the workspace's test targets `tests` with
/// `MONTAGE_CRASH_SEEDS=seeds`.
struct CrashRun {
    tests: &'static [&'static str],
    seeds: &'static str,
}

/// The crash-simulator tests again with more seeds than the debug run: 300 seeds per mode of
/// the heap tests (7,200 simulated power failures), 300 per model of a crash during repair,
/// of the typed payloads with verified swaps and of the collections (each run in two models
/// with two crashes each), and 5,000 seeds of the epoch model test, each run in a
/// persistent-memory model and the file model with three crashes each (30,000 simulated
/// power failures); and the lock-free indexes under a moving clock. Built and run with
/// `rustflags` (the variable and its value), as the build before them was.
///
/// Run one after the other, these binaries keep CI's two cores only partly busy (`crash_sim`
/// 1.6 cores, `repair` and `map_crash` 1.1 to 1.3: one long test, or one outlasting the
/// others), so once one build has made them all, `crash_sim` runs in one lane and the
/// smaller heap and collection suites in another, side by side, each its own `cargo test`
/// (77 s for both lanes, against 56 s and 42 s one after the other). The tests whose workers
/// and clock yield the processor at every retry and tick run on their own afterwards: beside
/// another busy process each yield waits out that process's time slice (`epoch_model` took
/// 113 s instead of 50 s beside a lane of `crash_sim` and `logged`, and two halves of
/// `payload_crash`'s seeds side by side 542 s, against 21 s for all of them alone).
fn crash_runs(rustflags: (&str, &str)) -> Result {
    const LANES: [CrashRun; 2] = [
        CrashRun {
            tests: &["crash_sim"],
            seeds: "300",
        },
        CrashRun {
            tests: &[
                "repair",
                "map_crash",
                "graph",
                "queue_crash",
                "lockfree_stress",
            ],
            seeds: "300",
        },
    ];
    const ALONE: [CrashRun; 2] = [
        CrashRun {
            tests: &["epoch_model"],
            seeds: "5000",
        },
        CrashRun {
            tests: &["payload_crash", "logged"],
            seeds: "300",
        },
    ];
    let args = |tests: &[&'static str], extra: &[&'static str]| {
        let mut args = vec!["test", "--workspace"];
        args.extend_from_slice(extra);
        for test in tests {
            args.extend(["--test", test]);
        }
        args
    };
    let env = |run: &CrashRun| [("MONTAGE_CRASH_SEEDS", run.seeds), rustflags];
    let all: Vec<&str> = LANES
        .iter()
        .chain(&ALONE)
        .flat_map(|run| run.tests.iter().copied())
        .collect();
    cargo(&args(&all, &["--no-run"]), &[rustflags])?;
    let started = std::time::Instant::now();
    let lanes: Vec<(Result, String)> = std::thread::scope(|s| {
        let lanes: Vec<_> = LANES
            .iter()
            .map(|run| s.spawn(move || run_captured(&args(run.tests, &[]), &env(run))))
            .collect();
        lanes
            .into_iter()
            .map(|lane| {
                lane.join().unwrap_or_else(|_| {
                    (Err("a crash-run lane panicked".to_owned()), String::new())
                })
            })
            .collect()
    });
    for (_, report) in &lanes {
        print!("{report}");
    }
    println!(
        "  (crash runs in two lanes: {:.0} s)",
        started.elapsed().as_secs_f64()
    );
    for (result, _) in lanes {
        result?;
    }
    for run in &ALONE {
        cargo(&args(run.tests, &[]), &env(run))?;
    }
    Ok(())
}

/// [`run_cargo`] for `cargo args` with extra environment `env`, with its output (the command
/// line, what cargo and the tests printed, and how long it took) captured and returned
/// instead of printed: for commands that run side by side.
fn run_captured(args: &[&str], env: &[(&str, &str)]) -> (Result, String) {
    let line = format!("cargo {}", args.join(" "));
    let mut report = format!("$ {line}\n");
    let started = std::time::Instant::now();
    let ran = quiet_cargo_command(args, env).output().map(|output| {
        report.push_str(&String::from_utf8_lossy(&output.stderr));
        report.push_str(&String::from_utf8_lossy(&output.stdout));
        output.status.success()
    });
    let (timing, result) = outcome(&cargo_step(args), &line, started, ran);
    report.push_str(&timing);
    report.push('\n');
    (result, report)
}

/// Runs the throughput harness, optimised and with the embedded stores (unless
/// `--no-peers`), passing the other `args` on; or, with `--criterion`, the criterion
/// micro-benchmarks.
fn bench(args: &[String]) -> Result {
    if let [flag] = args
        && flag == "--criterion"
    {
        return cargo(&["bench", "--workspace"], &[]);
    }
    let peers = !args.iter().any(|a| a == "--no-peers");
    if peers && !has_libclang() {
        return Err(
            "the embedded stores need rocksdb, whose build needs libclang \
                    (`apt-get install libclang-dev`); or pass --no-peers"
                .to_owned(),
        );
    }
    let mut command = vec!["run", "--release", "--package", "montage-bench"];
    if peers {
        command.extend(["--features", "peers"]);
    }
    command.extend(["--bin", "montage-bench", "--"]);
    command.extend(
        args.iter()
            .map(String::as_str)
            .filter(|a| *a != "--no-peers"),
    );
    cargo(&command, &[])
}

/// Whether the dynamic linker knows a libclang (bindgen, for rocksdb's build, loads it).
fn has_libclang() -> bool {
    Command::new("ldconfig").arg("-p").output().is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout).lines().any(|line| {
            let name = line.trim_start();
            name.starts_with("libclang.so")
                || (name.starts_with("libclang-")
                    && name[9..].starts_with(|c: char| c.is_ascii_digit()))
        })
    }) || std::env::var_os("LIBCLANG_PATH").is_some()
}

/// Runs the derive's UI tests; with `--bless`, records the compiler's current output as the
/// expected text (review the diff before committing it).
fn ui(args: &[String]) -> Result {
    let env: &[(&str, &str)] = match args {
        [] => &[],
        [flag] if flag == "--bless" => &[("TRYBUILD", "overwrite")],
        _ => return Err("usage: cargo xtask ui [--bless]".to_owned()),
    };
    cargo(
        &["test", "--package", "montage-derive", "--test", "ui"],
        env,
    )
}

/// The target triple the sanitizer build names explicitly, so that build scripts and
/// proc-macros (which run on the host) are built without the sanitizer.
const ASAN_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Runs the code with `unsafe` in it under the address sanitizer: the core's unit tests (the
/// verified structures, the heap and the region among them), the lock-free stress tests and
/// the heap-file tests, in a target directory of their own; the build also denies nightly's
/// strict-provenance lints (no integer-to-pointer or pointer-to-integer casts). Needs a
/// nightly toolchain with
/// the sanitizer runtime; without one it says so and succeeds, as CI machines without a nightly
/// must still pass. Leak detection is off: crossbeam-epoch may still hold deferred garbage
/// when a test process exits, which is not a leak.
fn asan() -> Result {
    if let Some(why) = asan_unavailable() {
        println!("xtask asan: skipped: {why}");
        return Ok(());
    }
    let target = project_root().join("target").join("asan");
    let target = target.to_string_lossy();
    let mut args = vec![
        "+nightly",
        "test",
        // Dependencies unoptimised: the cold build took 77 s instead of 93 s, the run 19 s
        // instead of 12 s.
        "--config",
        "profile.test.package.'*'.opt-level=0",
        "--target",
        ASAN_TARGET,
        "--package",
        "montage-core",
        "--lib",
    ];
    for test in [
        "lockfree_stress",
        "heap_file",
        "alloc_model",
        "epoch_stress",
    ] {
        args.extend(["--test", test]);
    }
    let env = [
        (
            "RUSTFLAGS",
            "-Zsanitizer=address -Zcrate-attr=feature(strict_provenance_lints) \
             -Dfuzzy_provenance_casts -Dlossy_provenance_casts",
        ),
        ("RUSTDOCFLAGS", "-Zsanitizer=address"),
        ("CARGO_TARGET_DIR", &*target),
        ("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1"),
    ];
    println!("$ cargo {}", args.join(" "));
    run_cargo(nightly_command(&args, &env), &args)
}

/// `cargo args` with extra environment `env` through the rustup proxy, so that `+nightly`
/// picks the toolchain for cargo and rustc alike, whatever toolchain runs this xtask; from
/// the project root, not echoed.
fn nightly_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new("cargo");
    command
        .args(args)
        .envs(env.iter().copied())
        .current_dir(project_root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    command
}

/// Why the sanitizer run cannot happen on this machine, if it cannot.
fn asan_unavailable() -> Option<String> {
    let version = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output();
    let sysroot = match version {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => return Some("no nightly toolchain (`rustc +nightly` failed)".to_owned()),
    };
    let runtime = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(ASAN_TARGET)
        .join("lib/librustc-nightly_rt.asan.a");
    if runtime.exists() {
        None
    } else {
        Some(format!(
            "the nightly has no ASan runtime ({})",
            runtime.display()
        ))
    }
}

/// Runs the loom tests of the epoch handshake (every interleaving up to three preemptions),
/// in a target directory of their own so the loom build does not evict the normal one.
/// Only the code the model checker runs is optimised: the core, loom and its coroutines;
/// the other dependencies (the test-only ones, which the unit-test build needs but the loom
/// tests never call) are built without optimisation, which took the cold build from 83 s to
/// 76 s with the run unchanged (15 s; with loom unoptimised too, it took 101 s).
fn loom() -> Result {
    let target = project_root().join("target").join("loom");
    let target = target.to_string_lossy();
    cargo(
        &[
            "test",
            "--release",
            "--config",
            "profile.release.package.'*'.opt-level=0",
            "--config",
            "profile.release.package.loom.opt-level=3",
            "--config",
            "profile.release.package.generator.opt-level=3",
            "--package",
            "montage-core",
            "--lib",
            "loom",
        ],
        &[
            ("RUSTFLAGS", "--cfg montage_loom -D warnings"),
            ("CARGO_TARGET_DIR", &target),
            ("LOOM_MAX_PREEMPTIONS", "3"),
        ],
    )
}

/// Runs the epoch model crash test (or, with `--heap`, the heap layer's crash suites) with
/// `--seeds N` seeds from `--from S` (default 0), every seed even after a failure, and ends
/// with one line `N passed, M failed, K simulated power failures` counting seeds and crash
/// images.
fn crash(args: &[String]) -> Result {
    let usage = || "usage: cargo xtask crash [--seeds N] [--from S] [--heap]".to_owned();
    let mut seeds = "2000".to_owned();
    let mut from = "0".to_owned();
    let mut test = "epoch_model";
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let target = match arg.as_str() {
            "--seeds" => &mut seeds,
            "--from" => &mut from,
            "--heap" => {
                test = "crash_sim";
                continue;
            }
            _ => return Err(usage()),
        };
        match rest.next() {
            Some(n) if n.parse::<u64>().is_ok() => target.clone_from(n),
            _ => return Err(usage()),
        }
    }
    let env = [
        ("MONTAGE_CRASH_SEEDS", seeds.as_str()),
        ("MONTAGE_CRASH_SEED_START", from.as_str()),
        ("MONTAGE_CRASH_KEEP_GOING", "1"),
    ];
    let output = cargo_command(&release_core_test(test, &["--", "--nocapture"]), &env)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (mut passed, mut failed, mut crashes) = (0u64, 0u64, 0u64);
    for line in stderr.lines() {
        if line.contains("failed at seed") {
            eprintln!("{line}");
        }
        let Some(counts) = line
            .strip_prefix("crash test `")
            .and_then(|l| l.split("`: ").nth(1))
        else {
            continue;
        };
        eprintln!("{line}");
        let numbers: Vec<u64> = counts
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        if let [p, f, c] = numbers[..] {
            passed += p;
            failed += f;
            crashes += c;
        }
    }
    if passed + failed == 0 {
        eprintln!("{stderr}");
        return Err("the crash tests did not run".to_owned());
    }
    println!("{passed} passed, {failed} failed, {crashes} simulated power failures");
    if failed == 0 && output.status.success() {
        Ok(())
    } else {
        Err(format!("{failed} crash seeds failed"))
    }
}
