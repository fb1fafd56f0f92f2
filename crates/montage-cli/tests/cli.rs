//! The `montage` binary on real heap files, good and damaged: what each subcommand prints,
//! its exit status, and that it never changes the heap file or its journal.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

use std::path::{Path, PathBuf};
use std::process::Output;

use montage_collections::{Graph, HashMap, Queue, SortedMap};
use montage_core::{Heap, HeapConfig, PBlock, ScanFilter};

/// Runs `montage` with `args`.
fn montage(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_montage"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            stdout(output),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn config(path: &Path) -> HeapConfig {
    HeapConfig::new(path).size(4 << 20).max_size(4 << 20)
}

/// Opens the heap at `config`, as [`Heap::open`], waiting out a lock held only by a child
/// process that another test is starting: the heap file's lock belongs to its open file
/// description, which a child forked by a parallel test shares until it executes its
/// program (the descriptor is close-on-exec). A heap that stays locked is still an error.
fn open(config: &HeapConfig) -> Heap {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match Heap::open(config) {
            Err(montage_core::Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            opened => return opened.unwrap(),
        }
    }
}

fn journal_of(path: &Path) -> PathBuf {
    Heap::journal_path(path)
}

/// The heap file's and its journal's bytes.
fn files(path: &Path) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(path).unwrap(),
        std::fs::read(journal_of(path)).unwrap_or_default(),
    )
}

/// A closed heap holding one structure of each kind; returns the block of `hits`' key "b".
fn make_heap(path: &Path) -> PBlock {
    let heap = Heap::create(&config(path)).unwrap();
    let hits = HashMap::<String, u64>::open(&heap, "hits").unwrap();
    for (key, value) in [("c", 3), ("a", 1), ("b", 2)] {
        hits.insert(key.to_owned(), value).unwrap();
    }
    let blobs = SortedMap::<u64, Vec<u8>>::open(&heap, "blobs").unwrap();
    blobs.insert(7, b"seven".to_vec()).unwrap();
    blobs.insert(1, vec![0xff, 0x00]).unwrap();
    let jobs = Queue::<String>::open(&heap, "jobs").unwrap();
    for job in ["first", "second", "third"] {
        jobs.push_back(job.to_owned()).unwrap();
    }
    jobs.pop_front().unwrap();
    let graph = Graph::<i32, bool>::open(&heap, "graph").unwrap();
    graph.add_vertex(1, &-1).unwrap();
    graph.add_vertex(2, &-2).unwrap();
    graph.add_edge(1, 2, &true).unwrap();
    let owner = heap.lookup("hits").unwrap();
    let b = heap
        .collect(ScanFilter::all().owner(owner).live())
        .unwrap()
        .into_iter()
        .find(|info| {
            heap.read_payload(info.block)
                .unwrap()
                .ends_with(&2u64.to_le_bytes())
        })
        .unwrap()
        .block;
    drop((hits, blobs, jobs, graph));
    heap.close().unwrap();
    b
}

#[test]
fn info_describes_the_heap_and_each_structure() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("info.heap");
    make_heap(&path);
    let before = files(&path);
    let out = montage(&["info", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let info = json(&out);
    assert_eq!(info["format_version"], 4);
    assert_eq!(info["size"], 4 << 20);
    assert_eq!(info["clean_shutdown"], true);
    assert_eq!(info["recovery"]["quarantined"], 0);
    assert!(info["journal"]["file"].is_string());
    let structure = |name: &str| {
        info["structures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(structure("hits")["blocks"], 3);
    assert_eq!(
        structure("hits")["payload_types"],
        serde_json::json!(["hash-map<String, u64>"])
    );
    assert_eq!(structure("blobs")["blocks"], 2);
    assert_eq!(
        structure("blobs")["payload_types"],
        serde_json::json!(["sorted-map<u64, Vec<u8>>"])
    );
    assert_eq!(structure("jobs")["blocks"], 2);
    assert_eq!(structure("graph")["blocks"], 3);
    let used: u64 = info["space"]["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["used_blocks"].as_u64().unwrap())
        .sum();
    assert_eq!(used, 10);

    let text = montage(&["info", path.to_str().unwrap()]);
    assert!(text.status.success());
    let text = stdout(&text);
    assert!(text.contains("format          version 4"), "{text}");
    assert!(text.contains("sorted-map<u64, Vec<u8>>"), "{text}");
    assert!(files(&path) == before, "info wrote to the heap");
}

#[test]
fn dump_prints_each_structures_entries_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dump.heap");
    make_heap(&path);
    let before = files(&path);
    let heap = path.to_str().unwrap();
    let lines = |args: &[&str]| {
        let out = montage(args);
        assert!(out.status.success(), "{out:?}");
        stdout(&out)
    };
    assert_eq!(
        lines(&["dump", heap, "hits"]),
        "{\"key\":\"a\",\"value\":1}\n{\"key\":\"b\",\"value\":2}\n{\"key\":\"c\",\"value\":3}\n"
    );
    assert_eq!(
        lines(&["dump", heap, "blobs"]),
        "{\"key\":1,\"value\":{\"hex\":\"ff00\"}}\n{\"key\":7,\"value\":\"seven\"}\n"
    );
    assert_eq!(
        lines(&["dump", "--hex", heap, "blobs"]),
        "{\"key\":1,\"value\":{\"hex\":\"ff00\"}}\n{\"key\":7,\"value\":{\"hex\":\"736576656e\"}}\n"
    );
    // The queue in its order, by sequence number; the popped element is gone.
    let jobs = lines(&["dump", heap, "jobs"]);
    let values: Vec<serde_json::Value> = jobs
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["value"].clone())
        .collect();
    assert_eq!(values, ["second", "third"]);
    assert_eq!(
        lines(&["dump", heap, "graph"]),
        "{\"from\":1,\"to\":2,\"value\":true}\n{\"id\":1,\"value\":-1}\n{\"id\":2,\"value\":-2}\n"
    );
    let mut unsorted: Vec<String> = lines(&["dump", "--unsorted", heap, "hits"])
        .lines()
        .map(str::to_owned)
        .collect();
    unsorted.sort();
    assert_eq!(unsorted.len(), 3);

    let missing = montage(&["dump", heap, "nothing"]);
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("no structure named `nothing`") && err.contains("hits"),
        "{err}"
    );
    assert!(files(&path) == before, "dump wrote to the heap");
}

#[test]
fn check_passes_a_sound_heap_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sound.heap");
    make_heap(&path);
    let before = files(&path);
    let out = montage(&["check", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report = json(&out);
    assert_eq!(report["ok"], true);
    assert_eq!(report["problems"], serde_json::json!([]));
    assert_eq!(report["payloads_decoded"], 10);
    let text = montage(&["check", path.to_str().unwrap()]);
    assert!(stdout(&text).contains(": ok"), "{}", stdout(&text));
    assert!(files(&path) == before, "check wrote to the heap");
}

/// Damages a copy of a sound heap with `damage`, then checks it: exit status 1, a report
/// that is not ok, whose problems' text contains `expect`, and the files as they were.
fn check_finds(name: &str, damage: impl FnOnce(&Path, PBlock), expect: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let b = make_heap(&path);
    damage(&path, b);
    let before = files(&path);
    let out = montage(&["check", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{name}: {out:?}");
    let report = json(&out);
    assert_eq!(report["ok"], false, "{name}");
    let problems = report["problems"].to_string();
    assert!(problems.contains(expect), "{name}: {problems}");
    assert!(files(&path) == before, "{name}: check wrote to the heap");
    let text = montage(&["check", path.to_str().unwrap()]);
    assert_eq!(text.status.code(), Some(1));
    assert!(stdout(&text).contains("problem"), "{}", stdout(&text));
    report
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn check_finds_a_damaged_block_header() {
    let report = check_finds(
        "header.heap",
        |path, b| flip(path, b.offset() + 0x18),
        "its header fails its checksum",
    );
    assert_eq!(report["problems"][0]["structure"], "hits");
}

#[test]
fn check_finds_a_damaged_payload() {
    // The value's last byte, after the key's length word and the key.
    check_finds(
        "payload.heap",
        |path, b| flip(path, b.payload_offset() + 4 + 1 + 7),
        "its payload fails its checksum",
    );
}

#[test]
fn check_finds_a_damaged_superblock() {
    check_finds("superblock.heap", |path, _| flip(path, 0x30), "superblock");
}

#[test]
fn check_finds_a_damaged_directory_entry() {
    check_finds(
        "directory.heap",
        |path, _| {
            let bytes = std::fs::read(path).unwrap();
            let at = bytes[..0x4000]
                .windows(5)
                .position(|w| w == b"blobs")
                .unwrap();
            flip(path, at as u64 + 1);
        },
        "cannot be recovered",
    );
}

#[test]
fn check_finds_a_truncated_heap() {
    check_finds(
        "truncated.heap",
        |path, _| {
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(3 << 20).unwrap();
        },
        "truncated",
    );
}

#[test]
fn check_finds_a_missing_journal() {
    check_finds(
        "journal.heap",
        |path, _| std::fs::remove_file(journal_of(path)).unwrap(),
        "journal",
    );
}

#[test]
fn a_heap_open_in_a_process_is_refused_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("open.heap");
    make_heap(&path);
    let heap = open(&config(&path));
    for command in ["info", "check"] {
        let out = montage(&[command, path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{command}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("locked"));
    }
    heap.close().unwrap();
    let out = montage(&["check", dir.path().join("none.heap").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

/// Repairs a damaged copy of a sound heap with `montage repair` (on a copy of it), and
/// checks the report, the repaired heap, and that the damaged heap was left as it was.
fn repairs(
    name: &str,
    damage: impl FnOnce(&Path, PBlock),
    expect: &str,
    hits: &str,
) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let b = make_heap(&path);
    damage(&path, b);
    let before = files(&path);
    let out = montage(&["repair", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
    let report = json(&out);
    assert_eq!(report["ok"], true, "{name}: {report}");
    let said = format!("{}{}", report["repairs"], report["dropped"]);
    assert!(said.contains(expect), "{name}: {said}");
    assert!(
        files(&path) == before,
        "{name}: repair wrote to the damaged heap"
    );
    let repaired = format!("{}.repaired", path.display());
    assert_eq!(montage(&["check", &repaired]).status.code(), Some(0));
    let dump = montage(&["dump", &repaired, "hits"]);
    assert_eq!(stdout(&dump), hits, "{name}");
    report
}

const ALL_HITS: &str =
    "{\"key\":\"a\",\"value\":1}\n{\"key\":\"b\",\"value\":2}\n{\"key\":\"c\",\"value\":3}\n";

#[test]
fn repair_drops_a_block_whose_header_is_damaged_and_keeps_the_rest() {
    let report = repairs(
        "header.heap",
        |path, b| flip(path, b.offset() + 0x18),
        "its header failed its checksum",
        "{\"key\":\"a\",\"value\":1}\n{\"key\":\"c\",\"value\":3}\n",
    );
    assert_eq!(report["dropped"][0]["structure"], "hits");
}

#[test]
fn repair_drops_a_damaged_payload_and_keeps_the_rest() {
    repairs(
        "payload.heap",
        |path, b| flip(path, b.payload_offset() + 4 + 1 + 7),
        "its payload failed its checksum",
        "{\"key\":\"a\",\"value\":1}\n{\"key\":\"c\",\"value\":3}\n",
    );
}

#[test]
fn repair_restores_a_superblock_and_a_directory_entry() {
    repairs(
        "superblock.heap",
        |path, _| flip(path, 0x30),
        "superblock",
        ALL_HITS,
    );
    repairs(
        "directory.heap",
        |path, _| {
            let bytes = std::fs::read(path).unwrap();
            let at = bytes[..0x4000]
                .windows(4)
                .position(|w| w == b"hits")
                .unwrap();
            flip(path, at as u64 + 1);
        },
        "directory entry 0",
        ALL_HITS,
    );
}

#[test]
fn repair_extends_a_truncated_heap_and_takes_the_heap_file_without_its_journal() {
    repairs(
        "truncated.heap",
        |path, _| {
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.set_len(3 << 20).unwrap();
        },
        "extended with zeros",
        ALL_HITS,
    );
    repairs(
        "journal.heap",
        |path, _| std::fs::remove_file(journal_of(path)).unwrap(),
        "missing",
        ALL_HITS,
    );
}

#[test]
fn repair_in_place_changes_the_heap_and_a_sound_heap_needs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inplace.heap");
    let b = make_heap(&path);
    flip(&path, b.offset() + 0x18);
    let heap = path.to_str().unwrap();
    assert_eq!(montage(&["check", heap]).status.code(), Some(1));
    let out = montage(&["repair", "--in-place", heap]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains("dropped: the block at offset"),
        "{}",
        stdout(&out)
    );
    assert_eq!(montage(&["check", heap]).status.code(), Some(0));
    let again = montage(&["repair", "--in-place", heap]);
    assert!(
        stdout(&again).contains("nothing needed repair"),
        "{}",
        stdout(&again)
    );
    // The default copy exists already: a second repair to it is refused.
    let copy = montage(&["repair", heap]);
    assert_eq!(copy.status.code(), Some(0));
    let refused = montage(&["repair", heap]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--output"));
}

#[test]
fn a_heap_beyond_repair_is_said_so_and_its_copy_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lost.heap");
    make_heap(&path);
    flip(&path, 0x10);
    flip(&path, 0x20);
    let before = files(&path);
    let out = montage(&["repair", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be repaired"));
    assert!(!dir.path().join("lost.heap.repaired").exists());
    assert!(files(&path) == before);
}

#[test]
fn copy_packs_a_heap_that_grew_and_was_mostly_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grown.heap");
    make_heap(&path);
    let config = HeapConfig::new(&path).max_size(64 << 20);
    let heap = open(&config);
    let blobs = SortedMap::<u64, Vec<u8>>::open(&heap, "blobs").unwrap();
    for key in 100..20_100u64 {
        blobs.insert(key, vec![key as u8; 1000]).unwrap();
    }
    for key in 100..19_900u64 {
        blobs.remove(&key).unwrap();
    }
    drop(blobs);
    heap.close().unwrap();
    let before = files(&path);
    let copy = dir.path().join("copy.heap");
    let out = montage(&[
        "copy",
        "--json",
        path.to_str().unwrap(),
        copy.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let report = json(&out);
    assert_eq!(report["verified"], true);
    let (size, packed) = (
        report["size"].as_u64().unwrap(),
        report["copy_size"].as_u64().unwrap(),
    );
    assert!(
        size >= 16 << 20 && packed * 16 <= size,
        "{size} -> {packed}"
    );
    assert!(files(&path) == before, "copy wrote to the heap");
    // The copy holds the same entries, in the same order for the queue, and checks clean.
    for name in ["hits", "blobs", "jobs", "graph"] {
        let of = |heap: &Path| stdout(&montage(&["dump", heap.to_str().unwrap(), name]));
        assert_eq!(of(&copy), of(&path), "{name}");
    }
    assert_eq!(
        montage(&["check", copy.to_str().unwrap()]).status.code(),
        Some(0)
    );
    // A second copy to the same place is refused.
    let again = montage(&["copy", path.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
}

#[test]
fn copy_refuses_raw_blocks_and_damaged_heaps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.heap");
    let b = make_heap(&path);
    let heap = open(&config(&path));
    let spec = montage_core::raw::BlockSpec::new(montage_core::Epoch::new(1), 1 << 40);
    let block = heap.raw().alloc_bytes(spec, b"raw").unwrap();
    heap.raw().persist_block(block).unwrap();
    heap.close().unwrap();
    let copy = dir.path().join("copy.heap");
    let out = montage(&["copy", path.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("raw blocks"));
    assert!(!copy.exists());

    let path = dir.path().join("damaged.heap");
    let b2 = make_heap(&path);
    assert_eq!(b.offset(), b2.offset());
    flip(&path, b2.offset() + 0x18);
    let out = montage(&["copy", path.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("repair"));
    assert!(!copy.exists());
}
