//! `montage copy`: a compacted copy of a heap, holding what recovery keeps and nothing else,
//! packed into as few spans as its payloads need.
//!
//! Payloads are copied one by one into a new heap, so each lands at a new offset. That is
//! right for the collections, whose payloads never hold the offsets of others, and wrong for
//! payloads that may (`#[derive(Payload)]` types with `POff` fields, raw blocks): a heap with
//! registered payload types or raw blocks is refused rather than copied into one whose
//! offsets point nowhere.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Mutex;

use montage_core::limits::{MIN_HEAP_SIZE, SPAN_SIZE};
use montage_core::{Heap, HeapConfig, ScanFilter, Usage};
use serde_json::json;

use crate::Outcome;
use crate::open::{each_payload, open, open_or_say, progress_bar};
use crate::output::{human, print_json};

/// Payloads copied per operation: enough to amortise an operation, few enough that one
/// operation does not hold the clock back.
const BATCH: usize = 256;

/// Runs `montage copy`.
pub(crate) fn run(
    from: &Path,
    to: &Path,
    as_json: bool,
    quiet: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let Some(source) = open_or_say(from, quiet)? else {
        return Ok(Outcome::Damaged);
    };
    if !source.recovery_report().quarantined.is_empty() {
        eprintln!(
            "montage: {} has damaged blocks; `montage repair` it, then copy the repaired heap",
            from.display()
        );
        return Ok(Outcome::Damaged);
    }
    let usage = source.usage(|_| {})?;
    refuse_what_cannot_move(&source, &usage)?;
    let size = packed_size(&usage);
    let mut config = HeapConfig::new(to)
        .size(size)
        .max_size(size.max(source.size()).saturating_mul(2));
    // The copy's journal is as large as the heap's: whoever sized that sized it for the
    // heap's writes (the default would be half the copy's size).
    if let Ok(journal) = std::fs::metadata(Heap::journal_path(from)) {
        config = config.journal_size(journal.len());
    }
    let target = Heap::create(&config)?;
    let copied = copy_payloads(&source, &target, &usage, quiet);
    let finished = copied.and_then(|copied| {
        target.sync()?;
        Ok(copied)
    });
    let new_size = target.size();
    target.close()?;
    let copied = match finished {
        Ok(copied) => copied,
        Err(err) => {
            // What was copied is of no use without the rest.
            let _ = Heap::remove(to);
            return Err(err.into());
        }
    };
    // Read the copy back: the same payloads under the same names.
    let check = open(to, quiet)?;
    let expected: BTreeMap<String, Digest> = copied
        .iter()
        .map(|(name, copied)| (name.clone(), copied.digest))
        .collect();
    let verified = digests(&check)? == expected;
    check.close()?;
    let report = json!({
        "heap": from.display().to_string(),
        "copy": to.display().to_string(),
        "size": source.size(),
        "copy_size": new_size,
        "structures": copied.iter().map(|(name, copied)| json!({
            "name": name, "payloads": copied.digest.payloads, "bytes": copied.bytes,
        })).collect::<Vec<_>>(),
        "verified": verified,
    });
    source.close()?;
    if as_json {
        print_json(&report)?;
    } else {
        print_text(&report);
    }
    if verified {
        Ok(Outcome::Clean)
    } else {
        Err(format!(
            "the copy {} does not hold what the heap holds",
            to.display()
        )
        .into())
    }
}

/// Refuses a heap whose payloads may hold the offsets of other payloads.
fn refuse_what_cannot_move(source: &Heap, usage: &Usage) -> Result<(), String> {
    let types = source.registered_types();
    if !types.is_empty() {
        let names: Vec<&str> = types.iter().map(|(name, _)| name.as_str()).collect();
        return Err(format!(
            "the heap holds #[derive(Payload)] types ({}), whose payloads may hold the offsets \
             (POff) of others, which a packed copy would move; copy its files instead",
            names.join(", ")
        ));
    }
    if usage.unowned.blocks > 0 {
        return Err(format!(
            "the heap holds {} raw blocks of no structure, which the tool cannot tell are safe \
             to move; copy its files instead",
            usage.unowned.blocks
        ));
    }
    Ok(())
}

/// A heap size that holds the live blocks of `usage` packed: their spans per class and their
/// large blocks, a span for the delete reserve, and a few spare (the copy may still grow).
fn packed_size(usage: &Usage) -> u64 {
    let class_spans: u64 = usage
        .classes
        .iter()
        .filter(|class| class.live_blocks > 0)
        .map(|class| {
            class
                .live_blocks
                .div_ceil(class.blocks / class.spans.max(1))
        })
        .sum();
    let spans = class_spans + usage.large.spans + 4;
    // The superblock, directory, registry and first span table take the first span.
    (spans + 1).saturating_mul(SPAN_SIZE).max(MIN_HEAP_SIZE)
}

/// Copies every live payload of every structure of `source` into `target`, under the same
/// names; returns each structure's payloads and bytes copied.
fn copy_payloads(
    source: &Heap,
    target: &Heap,
    usage: &Usage,
    quiet: bool,
) -> montage_core::Result<BTreeMap<String, Copied>> {
    let bar = progress_bar(quiet, "copy");
    bar.set_length(usage.structures.iter().map(|s| s.blocks).sum());
    let mut copied = BTreeMap::new();
    for (name, owner) in source.structures() {
        let owner_there = target.register(&name)?;
        let batch: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::with_capacity(BATCH));
        let totals = Mutex::new(Copied::default());
        let flush = |batch: &mut Vec<(u64, Vec<u8>)>| -> montage_core::Result<()> {
            target.run_op(|op| {
                for (type_id, bytes) in batch.iter() {
                    op.alloc(owner_there, *type_id, bytes)?;
                }
                Ok(())
            })?;
            bar.inc(batch.len() as u64);
            batch.clear();
            Ok(())
        };
        each_payload(source, ScanFilter::all().owner(owner), 1, |info, bytes| {
            let mut totals = lock(&totals);
            totals.bytes += bytes.len() as u64;
            totals.digest.add(info.spec.type_id, &bytes);
            let mut batch = lock(&batch);
            batch.push((info.spec.type_id, bytes));
            if batch.len() >= BATCH {
                flush(&mut batch)?;
            }
            Ok(())
        })?;
        flush(&mut lock(&batch))?;
        copied.insert(name, *lock(&totals));
    }
    bar.finish_and_clear();
    Ok(copied)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What was copied of one structure: its payload bytes, and the digest of its payloads the
/// copy is checked against.
#[derive(Debug, Clone, Copy, Default)]
struct Copied {
    bytes: u64,
    digest: Digest,
}

/// The count and an order-independent digest (a sum of hashes) of a structure's payloads,
/// each its type id and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Digest {
    payloads: u64,
    sum: u64,
}

impl Digest {
    fn add(&mut self, type_id: u64, bytes: &[u8]) {
        let mut hasher = std::hash::DefaultHasher::new();
        (type_id, bytes).hash(&mut hasher);
        self.payloads += 1;
        self.sum = self.sum.wrapping_add(hasher.finish());
    }
}

/// Per structure name, the digest of its live payloads.
fn digests(heap: &Heap) -> montage_core::Result<BTreeMap<String, Digest>> {
    let mut out = BTreeMap::new();
    for (name, owner) in heap.structures() {
        let digest = Mutex::new(Digest::default());
        each_payload(heap, ScanFilter::all().owner(owner), 1, |info, bytes| {
            lock(&digest).add(info.spec.type_id, &bytes);
            Ok(())
        })?;
        out.insert(name, *lock(&digest));
    }
    Ok(out)
}

#[allow(clippy::print_stdout)] // the command's output
fn print_text(r: &serde_json::Value) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    println!(
        "copied {} ({}) to {} ({})",
        r["heap"].as_str().unwrap_or(""),
        human(n(&r["size"])),
        r["copy"].as_str().unwrap_or(""),
        human(n(&r["copy_size"]))
    );
    for s in r["structures"].as_array().into_iter().flatten() {
        println!(
            "  {:<32} {:>10} payloads {:>12}",
            s["name"].as_str().unwrap_or(""),
            n(&s["payloads"]),
            human(n(&s["bytes"]))
        );
    }
    println!("the copy holds exactly what the heap holds");
}
