//! `montage`: the command-line tool for montage heap files. It inspects (`info`), verifies
//! (`check`) and prints (`dump`) a heap without ever writing it: those subcommands open the
//! heap read-only (`HeapConfig::read_only`), so the heap file and its journal are left
//! byte for byte as they were, and a heap that a process has open is refused rather than
//! read while it changes. `copy` writes a new, compacted heap; `repair` a repaired copy (or,
//! asked to, the heap itself).
//!
//! Exit status: 0 when the command did what it was asked and found nothing wrong; 1 when
//! `check` (or `info` and `dump`, which run the same recovery) found the heap damaged; 2
//! when the heap could not be read at all (no such file, open elsewhere, bad arguments).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod copy;
mod dump;
mod info;
mod open;
mod output;
mod repair;

/// Inspect, check and dump montage heap files. Never writes the heap.
#[derive(Debug, Parser)]
#[command(name = "montage", version, about, long_about = None)]
struct Cli {
    /// No progress bars.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The heap's format, size, clock, structures, payload types and space per size class.
    Info {
        /// The heap file.
        heap: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Verify the whole heap read-only: superblock, journal, directory, type registry, span
    /// table, every block header's and every durable payload's checksum, and every entry of
    /// the collections' structures; say what recovery would keep and drop. Exits with 1 if
    /// anything is wrong.
    Check {
        /// The heap file.
        heap: PathBuf,
        /// Print the report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a structure's entries as JSON lines (the collections' maps, queues and graphs
    /// of byte-string, string, integer and bool keys and values).
    Dump {
        /// The heap file.
        heap: PathBuf,
        /// The structure's name.
        name: String,
        /// Write every byte string as {"hex": ...}, not as a string where it is UTF-8.
        #[arg(long)]
        hex: bool,
        /// Print in heap order as the scan finds them, holding nothing in memory, instead of
        /// in key (or sequence) order.
        #[arg(long)]
        unsorted: bool,
    },
    /// Copy a heap to a new one holding only what recovery keeps, packed (which also
    /// shrinks it), and verify the copy holds the same payloads. For heaps of the
    /// collections; a heap with #[derive(Payload)] types or raw blocks is refused.
    Copy {
        /// The heap file.
        heap: PathBuf,
        /// The new heap file (it must not exist).
        new: PathBuf,
        /// Print the report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Repair a damaged heap: keep what its checksums prove intact, drop the rest, and
    /// report both; then check the result. Works on a copy (`HEAP.repaired`, or --output)
    /// unless --in-place. Exits with 1 if the heap cannot be repaired or the repaired heap
    /// does not pass `check`.
    Repair {
        /// The heap file.
        heap: PathBuf,
        /// Where the repaired copy goes (default: the heap's path with `.repaired` added).
        #[arg(long, short, conflicts_with = "in_place")]
        output: Option<PathBuf>,
        /// Repair the heap itself rather than a copy.
        #[arg(long)]
        in_place: bool,
        /// Print the report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// How a command ended.
pub(crate) enum Outcome {
    /// Done; nothing wrong.
    Clean,
    /// The heap is damaged (the report said how).
    Damaged,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let quiet = cli.quiet;
    let result = match cli.command {
        Command::Info { heap, json } => info::run(&heap, json, quiet),
        Command::Check { heap, json } => check::run(&heap, json, quiet),
        Command::Dump {
            heap,
            name,
            hex,
            unsorted,
        } => dump::run(&heap, &name, hex, unsorted, quiet),
        Command::Copy { heap, new, json } => copy::run(&heap, &new, json, quiet),
        Command::Repair {
            heap,
            output,
            in_place,
            json,
        } => repair::run(&heap, output, in_place, json, quiet),
    };
    match result {
        Ok(Outcome::Clean) => ExitCode::SUCCESS,
        Ok(Outcome::Damaged) => ExitCode::from(1),
        Err(err) => {
            eprintln!("montage: {err}");
            let mut source = std::error::Error::source(&*err);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::from(2)
        }
    }
}
