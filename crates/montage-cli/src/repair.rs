//! `montage repair`: keep what a damaged heap's checksums prove intact, drop the rest, and
//! say what was dropped; on a copy unless `--in-place`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use montage_core::{Heap, HeapConfig, QuarantineReason};
use serde_json::json;

use crate::Outcome;
use crate::check;
use crate::open::{is_damage, lock_shared, open_showing};
use crate::output::print_json;

/// Runs `montage repair`.
pub(crate) fn run(
    path: &Path,
    output: Option<PathBuf>,
    in_place: bool,
    as_json: bool,
    quiet: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let target = if in_place {
        path.to_path_buf()
    } else {
        let target = output.unwrap_or_else(|| {
            let mut name = path.as_os_str().to_owned();
            name.push(".repaired");
            PathBuf::from(name)
        });
        copy_files(path, &target)?;
        target
    };
    let opened = open_showing(HeapConfig::new(&target).repair(true), quiet, "repair");
    let heap = match opened {
        Ok(heap) => heap,
        Err(err) if !is_damage(&err) => {
            if !in_place {
                let _ = Heap::remove(&target);
            }
            return Err(err.into());
        }
        Err(err) => {
            let mut what = format!("{} cannot be repaired: {err}", path.display());
            if !in_place {
                // The copy holds nothing the heap does not.
                let _ = Heap::remove(&target);
                let _ = write!(what, "; the copy {} was removed", target.display());
            }
            eprintln!("montage: {what}");
            return Ok(Outcome::Damaged);
        }
    };
    let recovery = heap.recovery_report().clone();
    heap.close()?;
    let repairs: Vec<serde_json::Value> = recovery
        .repairs
        .iter()
        .map(|r| json!({ "offset": r.offset, "what": r.what }))
        .collect();
    let dropped: Vec<serde_json::Value> = recovery
        .dropped_damaged
        .iter()
        .map(|q| {
            let why = match q.why {
                QuarantineReason::DamagedHeader => "its header failed its checksum",
                QuarantineReason::DamagedPayload => "its payload failed its checksum",
                QuarantineReason::SameUid => "another version of its payload was damaged",
                _ => "it was damaged",
            };
            json!({ "offset": q.offset, "structure": q.structure, "why": why })
        })
        .collect();
    let after = check::report(&target, quiet)?;
    let ok = after["ok"] == true;
    let report = json!({
        "heap": path.display().to_string(),
        "repaired": target.display().to_string(),
        "in_place": in_place,
        "repairs": repairs,
        "dropped": dropped,
        "check": after,
        "ok": ok,
    });
    if as_json {
        print_json(&report)?;
    } else {
        print_text(&report);
    }
    Ok(if ok { Outcome::Clean } else { Outcome::Damaged })
}

/// Copies the heap file at `from` and its journal, if it has one, to `to` (which must not
/// exist), holding `from`'s shared lock so that no process changes it meanwhile.
fn copy_files(from: &Path, to: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let journal_to = Heap::journal_path(to);
    for path in [to, journal_to.as_path()] {
        if path.exists() {
            return Err(format!(
                "{} exists; say where the copy goes with --output",
                path.display()
            )
            .into());
        }
    }
    let _lock = lock_shared(from)?;
    std::fs::copy(from, to)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    let journal_from = Heap::journal_path(from);
    if journal_from.exists() {
        std::fs::copy(&journal_from, &journal_to).map_err(|e| {
            format!(
                "copying {} to {}: {e}",
                journal_from.display(),
                journal_to.display()
            )
        })?;
    }
    for path in [to, journal_to.as_path()] {
        if path.exists() {
            std::fs::File::open(path)
                .and_then(|file| file.sync_all())
                .map_err(|e| format!("syncing {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

#[allow(clippy::print_stdout)] // the command's output
fn print_text(r: &serde_json::Value) {
    let target = r["repaired"].as_str().unwrap_or("");
    let repairs = r["repairs"].as_array().map_or(&[][..], Vec::as_slice);
    let dropped = r["dropped"].as_array().map_or(&[][..], Vec::as_slice);
    if repairs.is_empty() && dropped.is_empty() {
        println!("{target}: nothing needed repair");
    }
    for repair in repairs {
        println!("repaired: {}", repair["what"].as_str().unwrap_or(""));
    }
    for block in dropped {
        println!(
            "dropped: the block at offset {:#x} in `{}`: {}",
            block["offset"].as_u64().unwrap_or(0),
            block["structure"].as_str().unwrap_or("-"),
            block["why"].as_str().unwrap_or("")
        );
    }
    check::print_text(&r["check"]);
}
