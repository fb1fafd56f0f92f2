//! The project's own automation: `cargo xtask <command>`.
//!
//! * `ci`: everything CI checks, in order, failing fast;
//! * `tidy`: the conventions the compiler cannot check;
//! * `crash [--seeds N]`: the crash-simulator tests with many seeds, in release mode;
//! * `bench`: the criterion benchmarks.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

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
        Some("bench") => cargo(&["bench", "--workspace"], &[]),
        _ => Err("usage: cargo xtask <ci | tidy | crash [--seeds N] | bench>".to_owned()),
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    println!("$ cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(project_root())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("step failed: cargo {}", args.join(" ")))
    }
}

fn ci() -> Result {
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
    // The crash-simulator tests again, optimised, with more seeds than the debug run.
    cargo(
        &[
            "test",
            "--release",
            "--package",
            "montage-core",
            "--test",
            "crash_sim",
        ],
        &[("MONTAGE_CRASH_SEEDS", "300"), deny[0]],
    )?;
    cargo(&["doc", "--workspace", "--no-deps"], &deny)?;
    cargo(&["bench", "--workspace", "--no-run"], &deny)?;
    tidy::run(&project_root())?;
    println!("xtask ci: all steps passed");
    Ok(())
}

fn crash(args: &[String]) -> Result {
    let seeds = match args {
        [] => "2000".to_owned(),
        [flag, n] if flag == "--seeds" => n.clone(),
        _ => return Err("usage: cargo xtask crash [--seeds N]".to_owned()),
    };
    cargo(
        &[
            "test",
            "--release",
            "--package",
            "montage-core",
            "--test",
            "crash_sim",
        ],
        &[("MONTAGE_CRASH_SEEDS", seeds.as_str())],
    )
}
