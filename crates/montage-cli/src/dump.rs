//! `montage dump`: a structure's entries as JSON lines.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use montage_collections::inspect::{Value, format_of};
use montage_core::{Heap, ScanFilter};

use crate::Outcome;
use crate::open::{each_payload, open_or_say};
use crate::output::fields_json;

/// Runs `montage dump`.
pub(crate) fn run(
    path: &Path,
    name: &str,
    hex: bool,
    unsorted: bool,
    quiet: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let Some(heap) = open_or_say(path, quiet)? else {
        return Ok(Outcome::Damaged);
    };
    let result = dump(&heap, name, hex, unsorted);
    heap.close()?;
    result
}

fn dump(
    heap: &Heap,
    name: &str,
    hex: bool,
    unsorted: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let Some(owner) = heap.lookup(name) else {
        let names: Vec<String> = heap.structures().into_iter().map(|(n, _)| n).collect();
        return Err(format!(
            "the heap has no structure named `{name}`; it has: {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )
        .into());
    };
    let quarantined = heap.recovery_report().quarantined_in(name).count();
    if quarantined > 0 {
        eprintln!(
            "montage: `{name}` lost {quarantined} damaged payload(s); `montage check` lists them"
        );
    }
    let out = Mutex::new(Output {
        out: std::io::BufWriter::new(std::io::stdout()),
        failed: None,
    });
    let records = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());
    // In heap order, one thread, when printing as the scan goes.
    let threads = if unsorted {
        1
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    };
    each_payload(heap, ScanFilter::all().owner(owner), threads, |info, bytes| {
        let offset = info.block.offset();
        let Some(format) = format_of(info.spec.type_id) else {
            return Err(montage_core::Error::Corrupted {
                offset,
                what: "dump knows only the collections of plain keys and values, and this payload is of another type",
            });
        };
        match format.decode(&bytes) {
            Some(fields) if unsorted => lock(&out).line(&fields, hex),
            Some(fields) => lock(&records).push(fields),
            None => lock(&failures).push(offset),
        }
        Ok(())
    })
    .map_err(|err| match err {
        montage_core::Error::Corrupted { offset, what } => {
            format!("`{name}`: the payload at offset {offset:#x}: {what}").into()
        }
        other => Box::<dyn std::error::Error>::from(other),
    })?;
    let mut records = records
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    records.sort_unstable();
    let mut out = out
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for fields in &records {
        out.line(fields, hex);
    }
    out.finish()?;
    let failures = failures
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for offset in &failures {
        eprintln!("montage: `{name}`: the payload at offset {offset:#x} does not decode");
    }
    Ok(if failures.is_empty() && quarantined == 0 {
        Outcome::Clean
    } else {
        Outcome::Damaged
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Standard output, written until the first error: one that [`finish`](Self::finish)
/// reports, unless it is only that the reader has gone (`montage dump ... | head`).
struct Output<W: Write> {
    out: W,
    failed: Option<std::io::Error>,
}

impl<W: Write> Output<W> {
    fn line(&mut self, fields: &[(&str, Value)], hex: bool) {
        if self.failed.is_some() {
            return;
        }
        let written = serde_json::to_writer(&mut self.out, &fields_json(fields, hex))
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        self.failed = written.err();
    }

    fn finish(mut self) -> std::io::Result<()> {
        let result = match self.failed.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        };
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        }
    }
}
