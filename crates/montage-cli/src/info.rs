//! `montage info`: what a heap is and holds.

use std::path::Path;

use montage_core::{Heap, Usage};
use serde_json::json;

use crate::Outcome;
use crate::open::{follow, open_or_say, progress_bar};
use crate::output::{human, print_json, type_name};

/// Runs `montage info`.
pub(crate) fn run(
    path: &Path,
    as_json: bool,
    quiet: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let Some(heap) = open_or_say(path, quiet)? else {
        return Ok(Outcome::Damaged);
    };
    let bar = progress_bar(quiet, "scan");
    let usage = heap.usage(follow(&bar))?;
    bar.finish_and_clear();
    let report = describe(&heap, path, &usage);
    if as_json {
        print_json(&report)?;
    } else {
        print_text(&report);
    }
    heap.close()?;
    Ok(if heap_is_clean(&report) {
        Outcome::Clean
    } else {
        Outcome::Damaged
    })
}

fn heap_is_clean(report: &serde_json::Value) -> bool {
    report["recovery"]["quarantined"] == 0
}

/// Everything `info` reports, as JSON (the text form is printed from it).
fn describe(heap: &Heap, path: &Path, usage: &Usage) -> serde_json::Value {
    let report = heap.recovery_report();
    let epoch = heap.epoch().get();
    let journal = Heap::journal_path(path);
    let structures: Vec<serde_json::Value> = usage
        .structures
        .iter()
        .map(|s| {
            let kinds: Vec<String> = s.type_ids.iter().map(|&id| type_name(id)).collect();
            json!({
                "name": s.name,
                "owner": s.owner.get(),
                "blocks": s.blocks,
                "bytes": s.bytes,
                "payload_types": kinds,
            })
        })
        .collect();
    let classes: Vec<serde_json::Value> = usage
        .classes
        .iter()
        .filter(|c| c.spans > 0)
        .map(|c| {
            json!({
                "block_size": c.block_size,
                "spans": c.spans,
                "blocks": c.blocks,
                "used_blocks": c.live_blocks,
                "free_blocks": c.blocks - c.live_blocks,
                "payload_bytes": c.live_bytes,
            })
        })
        .collect();
    let registered: Vec<serde_json::Value> = heap
        .registered_types()
        .into_iter()
        .map(|(name, id)| json!({ "name": name, "type_id": format!("{id:#018x}") }))
        .collect();
    json!({
        "heap": path.display().to_string(),
        "format_version": heap.format_version(),
        "creation_id": format!("{:#018x}", heap.creation_id()),
        "size": heap.size(),
        "grows": heap.format_version() >= 4,
        "epoch": epoch,
        "durable_epoch": epoch.saturating_sub(2),
        "clean_shutdown": report.clean_shutdown,
        "journal": {
            "file": journal.exists().then(|| journal.display().to_string()),
            "records_replayed": report.journal_records,
            "bytes_replayed": report.journal_bytes,
        },
        "recovery": {
            "blocks_scanned": report.blocks_scanned,
            "blocks_kept": report.blocks_kept,
            "blocks_dropped": report.blocks_dropped,
            "spans_released": report.spans_released,
            "quarantined": report.quarantined.len(),
        },
        "structures": structures,
        "unowned": { "blocks": usage.unowned.blocks, "bytes": usage.unowned.bytes },
        "registered_types": registered,
        "space": {
            "span_size": usage.span_size,
            "spans": usage.spans,
            "free_spans": usage.free_spans,
            "classes": classes,
            "large": {
                "blocks": usage.large.blocks,
                "spans": usage.large.spans,
                "used_blocks": usage.large.live_blocks,
                "payload_bytes": usage.large.live_bytes,
            },
        },
    })
}

#[allow(clippy::print_stdout)] // the command's output
fn print_text(r: &serde_json::Value) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    println!("heap            {}", r["heap"].as_str().unwrap_or(""));
    println!(
        "format          version {}, created with id {}",
        r["format_version"],
        r["creation_id"].as_str().unwrap_or("")
    );
    let grows = if r["grows"] == true {
        "grows up to the opener's HeapConfig::max_size (by default, as far as its file system has room)"
    } else {
        "does not grow (format 3)"
    };
    println!(
        "size            {} ({}); {grows}",
        human(n(&r["size"])),
        n(&r["size"])
    );
    println!(
        "epoch           {} (durable through {})",
        r["epoch"], r["durable_epoch"]
    );
    println!(
        "closed cleanly  {}",
        if r["clean_shutdown"] == true {
            "yes"
        } else {
            "no: the last run crashed or is still open"
        }
    );
    match r["journal"]["file"].as_str() {
        Some(file) => println!(
            "journal         {file}; replayed {} records, {} bytes",
            r["journal"]["records_replayed"], r["journal"]["bytes_replayed"]
        ),
        None => println!(
            "journal         none (a heap for persistent memory, or never opened on the journal backend)"
        ),
    }
    let rec = &r["recovery"];
    println!(
        "recovery        {} block positions read, {} blocks kept, {} dropped, {} spans freed, {} quarantined",
        rec["blocks_scanned"],
        rec["blocks_kept"],
        rec["blocks_dropped"],
        rec["spans_released"],
        rec["quarantined"]
    );
    println!();
    println!(
        "{:<32} {:>10} {:>12}  payload types",
        "structure", "blocks", "bytes"
    );
    for s in r["structures"].as_array().into_iter().flatten() {
        let kinds: Vec<&str> = s["payload_types"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str())
            .collect();
        println!(
            "{:<32} {:>10} {:>12}  {}",
            s["name"].as_str().unwrap_or(""),
            n(&s["blocks"]),
            human(n(&s["bytes"])),
            kinds.join(", ")
        );
    }
    if n(&r["unowned"]["blocks"]) > 0 {
        println!(
            "{:<32} {:>10} {:>12}",
            "(no structure)",
            n(&r["unowned"]["blocks"]),
            human(n(&r["unowned"]["bytes"]))
        );
    }
    let registered = r["registered_types"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if !registered.is_empty() {
        println!();
        println!("{:<42} layout (type id)", "registered payload type");
        for t in registered {
            println!(
                "{:<42} {}",
                t["name"].as_str().unwrap_or(""),
                t["type_id"].as_str().unwrap_or("")
            );
        }
    }
    print_space(&r["space"]);
}

/// The space table of `info`'s text form.
#[allow(clippy::print_stdout)] // the command's output
fn print_space(space: &serde_json::Value) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    println!();
    println!(
        "space           {} spans of {}: {} free",
        n(&space["spans"]),
        human(n(&space["span_size"])),
        n(&space["free_spans"])
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10} {:>12}",
        "block size", "spans", "blocks", "used", "free", "payload"
    );
    for c in space["classes"].as_array().into_iter().flatten() {
        println!(
            "{:>10} {:>8} {:>10} {:>10} {:>10} {:>12}",
            human(n(&c["block_size"])),
            n(&c["spans"]),
            n(&c["blocks"]),
            n(&c["used_blocks"]),
            n(&c["free_blocks"]),
            human(n(&c["payload_bytes"]))
        );
    }
    let large = &space["large"];
    if n(&large["blocks"]) > 0 {
        println!(
            "{:>10} {:>8} {:>10} {:>10} {:>10} {:>12}",
            "large",
            n(&large["spans"]),
            n(&large["blocks"]),
            n(&large["used_blocks"]),
            n(&large["blocks"]) - n(&large["used_blocks"]),
            human(n(&large["payload_bytes"]))
        );
    }
}
