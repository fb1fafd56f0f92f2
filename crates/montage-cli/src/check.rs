//! `montage check`: a read-only verification of a whole heap.
//!
//! Opening the heap read-only runs everything recovery checks, in this process's memory:
//! the superblock and its checksum, the journal the heap names (header, records), the span
//! count word, the clean-shutdown flag and the epoch word, every directory and registry
//! entry, the span table, every block header's checksum and every durable payload's
//! checksum, and the epoch rule's consistency checks. Damaged blocks are quarantined rather
//! than fatal, so each is reported. Then every live payload of the collections' plain
//! formats is decoded. Nothing is written.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;

use montage_collections::inspect::format_of;
use montage_core::{Heap, QuarantineReason, ScanFilter};
use serde_json::json;

use crate::Outcome;
use crate::open::{each_payload, is_damage, open};
use crate::output::print_json;

/// Runs `montage check`.
pub(crate) fn run(
    path: &Path,
    as_json: bool,
    quiet: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let report = report(path, quiet)?;
    if as_json {
        print_json(&report)?;
    } else {
        print_text(&report);
    }
    Ok(if report["ok"] == true {
        Outcome::Clean
    } else {
        Outcome::Damaged
    })
}

/// The check of the heap at `path`, as JSON (`"ok"` says whether it passed).
///
/// # Errors
///
/// The heap could not be read at all.
pub(crate) fn report(
    path: &Path,
    quiet: bool,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    Ok(match open(path, quiet) {
        Ok(heap) => {
            let report = check_open(&heap, path)?;
            heap.close()?;
            report
        }
        Err(err) if is_damage(&err) => json!({
            "heap": path.display().to_string(),
            "ok": false,
            "opened": false,
            "problems": [{ "what": "the heap cannot be recovered", "error": err.to_string() }],
        }),
        Err(err) => return Err(err.into()),
    })
}

/// The report on a heap that opened.
fn check_open(heap: &Heap, path: &Path) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let recovery = heap.recovery_report();
    let mut problems: Vec<serde_json::Value> = recovery
        .quarantined
        .iter()
        .map(|q| {
            let why = match q.why {
                QuarantineReason::DamagedHeader => "its header fails its checksum",
                QuarantineReason::DamagedPayload => "its payload fails its checksum",
                QuarantineReason::SameUid => "another version of its payload is damaged",
                _ => "it is damaged",
            };
            json!({
                "what": "a block is damaged and left out",
                "offset": q.offset,
                "structure": q.structure,
                "why": why,
            })
        })
        .collect();
    let names: Vec<(u32, String)> = heap
        .structures()
        .into_iter()
        .map(|(name, owner)| (owner.get(), name))
        .collect();
    let undecodable = Mutex::new(Vec::new());
    let decoded = std::sync::atomic::AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    each_payload(heap, ScanFilter::all(), threads, |info, bytes| {
        let Some(format) = format_of(info.spec.type_id) else {
            return Ok(());
        };
        if format.decode(&bytes).is_none() {
            undecodable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((info.block.offset(), info.spec.owner.get()));
        }
        // ORDERING: a count read after the scan joined.
        decoded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })?;
    let mut undecodable = undecodable
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    undecodable.sort_unstable();
    for (offset, owner) in undecodable {
        let structure = names.iter().find(|(o, _)| *o == owner).map(|(_, n)| n);
        problems.push(json!({
            "what": "a payload does not decode as its structure's entries",
            "offset": offset,
            "structure": structure,
        }));
    }
    Ok(json!({
        "heap": path.display().to_string(),
        "ok": problems.is_empty(),
        "opened": true,
        "format_version": heap.format_version(),
        "clean_shutdown": recovery.clean_shutdown,
        "recovery": {
            "journal_records_replayed": recovery.journal_records,
            "blocks_scanned": recovery.blocks_scanned,
            "blocks_kept": recovery.blocks_kept,
            "blocks_dropped": recovery.blocks_dropped,
            "spans_released": recovery.spans_released,
            "quarantined": recovery.quarantined.len(),
        },
        "payloads_decoded": decoded.into_inner(),
        "problems": problems,
    }))
}

#[allow(clippy::print_stdout)] // the command's output
pub(crate) fn print_text(r: &serde_json::Value) {
    let heap = r["heap"].as_str().unwrap_or("");
    if r["opened"] == true {
        let rec = &r["recovery"];
        println!(
            "{heap}: format {}, {}",
            r["format_version"],
            if r["clean_shutdown"] == true {
                "closed cleanly"
            } else {
                "not closed cleanly (a crash, or a process still has it open)"
            }
        );
        println!(
            "recovery would replay {} journal records, keep {} blocks, drop {} (of epochs not \
             yet durable, or superseded) and free {} spans; {} payloads decoded",
            rec["journal_records_replayed"],
            rec["blocks_kept"],
            rec["blocks_dropped"],
            rec["spans_released"],
            r["payloads_decoded"]
        );
    }
    let problems = r["problems"].as_array().map_or(&[][..], Vec::as_slice);
    if problems.is_empty() {
        println!("{heap}: ok");
        return;
    }
    println!("{heap}: {} problem(s)", problems.len());
    for p in problems {
        let mut line = format!("  {}", p["what"].as_str().unwrap_or(""));
        if let Some(offset) = p["offset"].as_u64() {
            let _ = write!(line, " at offset {offset:#x}");
        }
        if let Some(structure) = p["structure"].as_str() {
            let _ = write!(line, " in `{structure}`");
        }
        for detail in [&p["why"], &p["error"]] {
            if let Some(detail) = detail.as_str() {
                let _ = write!(line, ": {detail}");
            }
        }
        println!("{line}");
    }
}
