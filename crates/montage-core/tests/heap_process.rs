//! Heap locking across processes, and what a process that dies without closing leaves
//! behind. The test binary runs itself as the second process.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::path::{Path, PathBuf};

use montage_core::Epoch;
use montage_core::raw;
use montage_core::raw::BlockSpec;
use montage_core::{Error, Heap, HeapConfig, ScanFilter};

const SIZE: u64 = 4 << 20;

fn heap_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("test.heap")
}

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path).size(SIZE)
}

/// A closed heap file holding three persisted payloads, of an epoch its clock covers (a
/// cleanly closed heap has no newer block, and `Heap::open` refuses one that has).
fn make_heap(path: &Path) {
    let heap = Heap::create(&config(path)).unwrap();
    heap.advance_epoch().unwrap();
    heap.advance_epoch().unwrap();
    for uid in 1..=3u64 {
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::new(1), uid), &[uid as u8; 8])
            .unwrap();
        heap.raw().persist_block(block).unwrap();
    }
    heap.close().unwrap();
}

fn main() -> std::process::ExitCode {
    if let (Some(mode), Some(path)) = (
        std::env::var_os("MONTAGE_CHILD_MODE"),
        std::env::var_os("MONTAGE_CHILD_HEAP"),
    ) {
        child_probe(&mode, Path::new(&path));
    }
    montage_testkit::run_tests(&[(
        "a_second_process_is_locked_out_and_a_dead_one_leaves_an_unclean_heap",
        a_second_process_is_locked_out_and_a_dead_one_leaves_an_unclean_heap,
    )])
}

/// The child process the tests start: `open` opens the heap at `path` and reports the
/// result through its exit code; `die` writes a payload, makes it durable and exits without
/// closing the heap, as a crashing process would.
fn child_probe(mode: &std::ffi::OsStr, path: &Path) -> ! {
    let code = if mode == "die" {
        let heap = raw::open_with(&config(path), |_| montage_core::raw::Verdict::Keep).unwrap();
        let block = heap
            .raw()
            .alloc_bytes(BlockSpec::new(Epoch::new(1), 77), b"from the child")
            .unwrap();
        heap.raw().persist_block(block).unwrap();
        std::process::exit(0);
    } else {
        match Heap::open(&config(path)) {
            Ok(_) => 0,
            Err(Error::Locked { .. }) => 3,
            Err(_) => 4,
        }
    };
    std::process::exit(code);
}

fn run_child(mode: &str, path: &Path) -> Option<i32> {
    std::process::Command::new(std::env::current_exe().unwrap())
        .env("MONTAGE_CHILD_MODE", mode)
        .env("MONTAGE_CHILD_HEAP", path)
        .status()
        .unwrap()
        .code()
}

/// One test, so that no other test of this binary forks a child while a heap is open: a
/// forked child shares the parent's open file descriptions, and with them the heap lock,
/// until it execs.
fn a_second_process_is_locked_out_and_a_dead_one_leaves_an_unclean_heap() {
    a_second_process_is_locked_out();
    a_process_that_exits_without_closing_leaves_an_unclean_heap_with_its_durable_data();
}

fn a_second_process_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    let heap = Heap::open(&config(&path)).unwrap();
    assert_eq!(
        run_child("open", &path),
        Some(3),
        "the child must see Err(Locked)"
    );
    heap.close().unwrap();
    assert_eq!(
        run_child("open", &path),
        Some(0),
        "after close the child can open the heap"
    );
}

fn a_process_that_exits_without_closing_leaves_an_unclean_heap_with_its_durable_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = heap_path(&dir);
    make_heap(&path);
    assert_eq!(run_child("die", &path), Some(0));
    let heap = raw::open_with(&config(&path), |_| montage_core::raw::Verdict::Keep).unwrap();
    assert!(!heap.recovery_report().clean_shutdown);
    let found = heap.collect(ScanFilter::all()).unwrap();
    let child = found.iter().find(|b| b.spec.uid == 77).unwrap();
    assert_eq!(heap.read_payload(child.block).unwrap(), b"from the child");
    assert_eq!(found.len(), 4);
}
