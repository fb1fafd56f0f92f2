//! Creates a heap file, registers a structure, allocates, updates and deletes payloads in
//! operations, syncs, closes the heap, reopens it and prints what recovery found.
//!
//! `cargo run --release --example recover [PATH]`

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

use montage::{Heap, HeapConfig, ScanFilter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os().nth(1).map_or_else(
        || std::env::temp_dir().join("montage-example.heap"),
        std::path::PathBuf::from,
    );
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let config = HeapConfig::new(&path).size(16 << 20);

    let heap = Heap::create(&config)?;
    let owner = heap.register("greetings")?;
    let words = ["hello", "bonjour", "hola", "ciao", "hallo", "ola"];
    let mut blocks = Vec::new();
    for word in words {
        // Each operation runs in one epoch; its payload is written back in the background.
        blocks.push(heap.run_op(|op| op.alloc(owner, 0, word.as_bytes()))?);
    }
    // Update one payload and delete every other one.
    blocks[1] = heap.run_op(|op| op.update(blocks[1], b"bonjour, le monde"))?;
    for block in blocks.iter().step_by(2) {
        heap.run_op(|op| op.delete(*block))?;
    }
    // Everything so far is durable once sync returns: the moment to acknowledge a client.
    heap.sync()?;
    println!(
        "created {} ({} MiB), wrote {} payloads, deleted {}, synced at epoch {}",
        path.display(),
        heap.size() >> 20,
        blocks.len(),
        blocks.len().div_ceil(2),
        heap.epoch()
    );
    heap.close()?;

    let heap = Heap::open(&config)?;
    let report = heap.recovery_report();
    println!(
        "reopened: clean shutdown = {}, {} spans and {} block slots scanned in {:?}",
        report.clean_shutdown, report.spans_scanned, report.blocks_scanned, report.duration
    );
    let owner = heap
        .lookup("greetings")
        .ok_or("structure `greetings` was not recovered")?;
    for info in heap.collect(ScanFilter::all().owner(owner))? {
        let payload = heap.read_payload(info.block)?;
        println!(
            "  uid {:>2} at offset {:#9x}: {:?}",
            info.spec.uid,
            info.block.offset(),
            String::from_utf8_lossy(&payload)
        );
    }
    heap.close()?;
    std::fs::remove_file(&path)?;
    Ok(())
}
