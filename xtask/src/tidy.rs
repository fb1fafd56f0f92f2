//! Conventions as checks: module headers, where `unsafe` may appear, no leftovers, PERSIST
//! comments on write-backs, workspace lints everywhere, ASCII sources.

use std::path::{Path, PathBuf};

use crate::Result;

/// The only files allowed to contain `unsafe` (STYLE.md 3.4).
const UNSAFE_ALLOWED: &[&str] = &[
    "crates/montage-core/src/base/crc.rs",
    "crates/montage-core/src/base/region.rs",
    "crates/montage-core/src/base/mapping.rs",
    "crates/montage-core/src/persist/x86.rs",
    // A slice's iterator of bytes, known by its type id, read as the slice it is.
    "crates/montage-core/src/payload/serde_write.rs",
    "crates/montage-core/src/epoch/tracker.rs",
    "crates/montage-core/src/epoch/nodes.rs",
    "crates/montage-core/src/verified/atomic.rs",
    "crates/montage-core/src/verified/list.rs",
    "crates/montage-core/src/verified/queue.rs",
    // A test's private tmpfs mount and a thread's priority are C library calls (unshare,
    // mount, setpriority); the test kit has no other.
    "crates/montage-testkit/src/tmpfs.rs",
    // Opening an LMDB environment (heed) is an `unsafe` call; the harness has no other.
    "benches/harness/src/stores/peers.rs",
];

/// The layers of `montage-core`, lowest first (docs/ARCHITECTURE.md draws them). A module
/// may use only modules of lower layers; modules of one layer do not use each other. The
/// crate root (`lib.rs`) sits on top and may use any.
const CORE_LAYERS: &[&[&str]] = &[
    &[
        "error",
        "primitive",
        "thread_id",
        "fingerprint",
        "random",
        "race",
        "spare",
    ],
    &["config"],
    &["base"],
    &["persist"],
    &["meta"],
    &["alloc"],
    &["recovery", "epoch"],
    &["verified"],
    &["heap"],
    &["payload"],
];

/// Where the core's modules live.
const CORE_SRC: &str = "crates/montage-core/src/";

pub(crate) fn run(root: &Path) -> Result {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for dir in ["src", "crates", "xtask", "examples", "benches", "tests"] {
        collect(&root.join(dir), &mut files);
    }
    files.push(root.join("Cargo.toml"));
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .to_string_lossy()
            .replace('\\', "/");
        let Ok(text) = std::fs::read_to_string(path) else {
            problems.push(format!("{rel}: not UTF-8"));
            continue;
        };
        if !text.is_ascii() {
            problems.push(format!("{rel}: contains non-ASCII characters"));
        }
        if rel.ends_with("Cargo.toml") {
            if rel != "Cargo.toml" && !text.contains("[lints]\nworkspace = true") {
                problems.push(format!("{rel}: missing `[lints] workspace = true`"));
            }
            continue;
        }
        check_rust(&rel, &text, &mut problems);
    }
    if problems.is_empty() {
        println!("tidy: {} files checked", files.len());
        Ok(())
    } else {
        Err(format!(
            "tidy found {} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ))
    }
}

fn check_rust(rel: &str, text: &str, problems: &mut Vec<String>) {
    let is_ui = rel.starts_with("crates/montage-derive/tests/ui/");
    if !is_ui && !text.starts_with("//!") && !text.starts_with("#![doc") {
        problems.push(format!("{rel}: must start with a `//!` module comment"));
    }
    let lines: Vec<&str> = text.lines().collect();
    // Unit-test modules sit at the end of a file; the PERSIST rule is for production code.
    let tests_start = lines
        .windows(2)
        .position(|w| w[0] == "#[cfg(test)]" && w[1].starts_with("mod tests"))
        .unwrap_or(lines.len());
    if rel.starts_with(CORE_SRC) {
        check_layers(rel, &lines, problems);
    }
    let persist_rule = rel.starts_with("crates/montage-core/src/")
        && !rel.starts_with("crates/montage-core/src/persist/");
    let unsafe_token = ["un", "safe"].concat();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let at = format!("{rel}:{}", i + 1);
        if contains_word(code, &unsafe_token) && !UNSAFE_ALLOWED.contains(&rel) {
            problems.push(format!(
                "{at}: `{unsafe_token}` outside the allow-listed modules"
            ));
        }
        if code.contains(&["dbg", "!("].concat()) {
            problems.push(format!("{at}: leftover debugging macro"));
        }
        if code.contains(&["#[should", "_panic"].concat())
            || code.contains(&["#[ig", "nore"].concat())
        {
            problems.push(format!(
                "{at}: tests assert on results; no should_panic or ignore"
            ));
        }
        let persist_call = [".flush(", ".fence(", ".persist("]
            .iter()
            .any(|call| code.contains(call));
        if persist_rule
            && i < tests_start
            && persist_call
            && !is_definition(code)
            && !persist_commented(&lines, i)
        {
            problems.push(format!(
                "{at}: flush/fence/persist call without a `// PERSIST:` comment"
            ));
        }
    }
}

/// The layer of the core module `name`, if it has one.
fn layer_of(name: &str) -> Option<usize> {
    CORE_LAYERS.iter().position(|layer| layer.contains(&name))
}

/// Checks that a `montage-core` source file uses no module of its own or a higher layer (see
/// [`CORE_LAYERS`]), and no item through the crate root, which would hide the module it
/// comes from. Unit-test modules at the end of a file may use anything.
fn check_layers(rel: &str, lines: &[&str], problems: &mut Vec<String>) {
    let path = &rel[CORE_SRC.len()..];
    if path == "lib.rs" {
        return;
    }
    let module = path
        .split('/')
        .next()
        .unwrap_or(path)
        .trim_end_matches(".rs");
    let Some(own) = layer_of(module) else {
        problems.push(format!(
            "{rel}: module `{module}` is in no layer; add it to CORE_LAYERS in xtask/src/tidy.rs"
        ));
        return;
    };
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let next = lines.get(i + 1).map_or("", |l| l.trim_start());
        if trimmed.starts_with("#[cfg(") && trimmed.contains("test") && next.starts_with("mod ") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            // `$crate::` in an exported macro names the crate from the caller's side.
            if code[..at].ends_with('$') {
                continue;
            }
            let rest = &code[at + "crate::".len()..];
            let used: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let line_no = i + 1;
            if used.is_empty() {
                problems.push(format!(
                    "{rel}:{line_no}: import from one module per `use crate::...` line, so the \
                     layer check can see it"
                ));
                continue;
            }
            if used == module {
                continue;
            }
            match layer_of(&used) {
                Some(layer) if layer < own => {}
                Some(_) => problems.push(format!(
                    "{rel}:{line_no}: `{module}` uses `{used}`, which is not in a lower layer"
                )),
                None => problems.push(format!(
                    "{rel}:{line_no}: `crate::{used}` is not a layered module; name the module \
                     it comes from"
                )),
            }
        }
    }
}

/// Whether line `i`, or the comment block right above it (up to two code lines further up),
/// carries a `// PERSIST:` comment.
fn persist_commented(lines: &[&str], i: usize) -> bool {
    if lines[i].contains("// PERSIST:") {
        return true;
    }
    let mut code_lines = 0;
    for line in lines[..i].iter().rev() {
        let trimmed = line.trim_start();
        if trimmed.contains("// PERSIST:") {
            return true;
        }
        if !trimmed.starts_with("//") {
            code_lines += 1;
            if code_lines > 2 {
                return false;
            }
        }
    }
    false
}

/// Whether `word` occurs in `code` as a whole identifier.
fn contains_word(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back().is_none_or(|c| !ident(c));
        let after = code[at + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        before && after
    })
}

fn is_definition(code: &str) -> bool {
    code.contains("fn ") || code.trim_start().starts_with("///")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            || path.file_name().is_some_and(|n| n == "Cargo.toml")
        {
            out.push(path);
        }
    }
}
