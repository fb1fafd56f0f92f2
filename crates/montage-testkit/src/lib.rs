//! Crash-test support for montage heaps: what every buffered-durability crash test needs
//! beside the power-failure simulator (`montage_core::sim`, which this crate turns on and
//! re-exports).
//!
//! * seeds: [`crash_seeds`] and [`for_each_seed`], which read `MONTAGE_CRASH_SEED`,
//!   `MONTAGE_CRASH_SEEDS` and `MONTAGE_CRASH_KEEP_GOING`, print the seed of a failure and
//!   how to replay it, and end with `N passed, M failed`;
//! * worker threads running operations while another thread moves the clock
//!   ([`run_with_clock`]; for crash tests a random mix of `sync` and plain advances,
//!   [`run_against_clock`]);
//! * a record of which syncs returned and what they covered, and the check that the
//!   recovered clock covers every sync that returned before the crash ([`check_synced`],
//!   [`crash_generation`]).
//!
//! It is a separate crate so that the runtime carries none of this: it reads environment
//! variables, catches panics and prints. Depend on it from `[dev-dependencies]`.
//!
//! ```
//! use montage_core::{Heap, HeapConfig, ScanFilter};
//! use montage_testkit::for_each_seed;
//! use montage_testkit::sim::SimMode;
//!
//! for_each_seed("doc", 8, |seed| {
//!     let config = HeapConfig::simulated(1 << 20, SimMode::Prefix);
//!     let heap = Heap::create(&config).unwrap();
//!     let owner = heap.register("log").unwrap();
//!     heap.run_op(|op| op.alloc(owner, 0, b"synced")).unwrap();
//!     heap.sync().unwrap();
//!     heap.run_op(|op| op.alloc(owner, 0, b"not synced")).unwrap();
//!     let image = heap.simulator().unwrap().crash(seed);
//!     let heap = Heap::open_image(image, &config).unwrap();
//!     let kept = heap.collect(ScanFilter::all().owner(owner)).unwrap();
//!     assert_eq!(kept.len(), 1, "seed {seed}");
//! });
//! ```
//!
//! Beside those, for tests of a heap file on a tmpfs mounted for huge pages:
//! [`on_huge_tmpfs`] and [`lowest_priority`] (the only code here that calls the C library
//! directly, in `tmpfs.rs`; the rest is safe Rust).

#![deny(unsafe_code)]

#[allow(unsafe_code)] // system calls, each with its safety argument
mod tmpfs;

pub use tmpfs::{lowest_priority, on_huge_tmpfs};

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use montage_core::sim::{CrashImage, SplitMix64};
use montage_core::{Epoch, Heap};

/// The power-failure simulator, re-exported so that a crash test needs this crate only.
pub use montage_core::sim;

/// A sync that returned during [`run_against_clock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncRecord {
    /// The newest epoch of an operation reported [`Ended`] when the sync was called: the
    /// sync promises that epoch durable.
    pub covered: Epoch,
    /// The simulator's event count when the sync returned.
    pub returned_at: u64,
}

/// Where workers report each operation that ended having written something, by its epoch.
#[derive(Debug, Default)]
pub struct Ended(AtomicU64);

impl Ended {
    /// Reports an ended operation of `epoch` that wrote something.
    pub fn record(&self, epoch: Epoch) {
        // ORDERING: SeqCst, so that a sync that reads this value was called after the
        // operation ended.
        self.0.fetch_max(epoch.get(), Ordering::SeqCst);
    }
}

/// Runs `work(t)` on `threads` threads while one more thread calls `tick` in a loop, until
/// every worker returns; a worker's panic is re-raised after the clock thread has stopped
/// (the scope would otherwise wait for it forever).
///
/// # Panics
///
/// Re-raises a worker's or `tick`'s panic.
pub fn run_with_clock(threads: usize, mut tick: impl FnMut() + Send, work: impl Fn(usize) + Sync) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let work = &work;
        let workers: Vec<_> = (0..threads).map(|t| s.spawn(move || work(t))).collect();
        s.spawn(|| {
            // ORDERING: a stop flag; the scope's joins order everything else.
            while !done.load(Ordering::Relaxed) {
                tick();
            }
        });
        let results: Vec<_> = workers
            .into_iter()
            .map(std::thread::ScopedJoinHandle::join)
            .collect();
        done.store(true, Ordering::Relaxed);
        for result in results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// Runs `work(t, &ended)` on `threads` threads while one more thread, driven by `seed`,
/// calls `sync` (one time in three) or advances the clock, until every worker returns;
/// returns the syncs that returned. The heap must be simulated.
///
/// # Panics
///
/// If the heap is not simulated, if `sync` or an advance fails, or (re-raised) if a worker
/// panics.
pub fn run_against_clock(
    heap: &Heap,
    seed: u64,
    threads: usize,
    work: impl Fn(usize, &Ended) + Sync,
) -> Vec<SyncRecord> {
    let sim = heap
        .simulator()
        .expect("run_against_clock needs a simulated heap");
    let ended = Ended::default();
    let syncs = Mutex::new(Vec::new());
    let mut rng = SplitMix64::new(seed ^ 0xC10C);
    let tick = || {
        if rng.next_u64().is_multiple_of(3) {
            // ORDERING: SeqCst pairs with `Ended::record`.
            let covered = Epoch::new(ended.0.load(Ordering::SeqCst));
            heap.sync().expect("sync failed");
            let record = SyncRecord {
                covered,
                returned_at: sim.events(),
            };
            syncs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(record);
        } else {
            heap.advance_epoch().expect("advance failed");
        }
        std::thread::yield_now();
    };
    run_with_clock(threads, tick, |t| work(t, &ended));
    syncs
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`crash_generation`] leaves: the crash image, the event it was taken at, and the
/// epoch cut recovery will apply (the stored word minus two).
#[derive(Debug)]
pub struct Crashed {
    /// The post-crash media image.
    pub image: CrashImage,
    /// The simulator event the crash was taken at.
    pub step: u64,
    /// Recovery keeps exactly the operations of epochs `<= cut`.
    pub cut: Epoch,
}

/// One crash-test generation: arms a crash at a point `rng` picks within the next `within`
/// persistence events, runs `run` (which returns the syncs it saw, as
/// [`run_against_clock`] does), takes the crash image for `seed`, and checks every returned
/// sync's promise against the image's clock.
///
/// # Errors
///
/// A broken sync promise (see [`check_synced`]), or an image without an epoch word.
///
/// # Panics
///
/// If the heap is not simulated.
pub fn crash_generation(
    heap: &Heap,
    rng: &mut SplitMix64,
    within: u64,
    seed: u64,
    run: impl FnOnce() -> Vec<SyncRecord>,
) -> Result<Crashed, String> {
    let sim = heap
        .simulator()
        .expect("crash_generation needs a simulated heap");
    let step = sim.events() + rng.below_or_equal(within);
    sim.crash_at(step);
    let syncs = run();
    let image = sim.crash(seed);
    let word = image
        .epoch_word()
        .ok_or_else(|| "the crash image has no epoch word".to_owned())?;
    let cut = word.durable_cut();
    check_synced(&syncs, step, cut).map_err(|broken| format!("crash at event {step}: {broken}"))?;
    Ok(Crashed { image, step, cut })
}

/// Checks that a heap recovered with epoch cut `cut` (the stored word minus two) keeps
/// everything each sync that returned by simulator event `crash_step` promised.
///
/// # Errors
///
/// A description of the first sync whose promise was broken.
pub fn check_synced(syncs: &[SyncRecord], crash_step: u64, cut: Epoch) -> Result<(), String> {
    match syncs
        .iter()
        .find(|s| s.returned_at <= crash_step && s.covered > cut)
    {
        Some(s) => Err(format!(
            "a sync covering epoch {} returned before the crash (event {} <= {crash_step}), \
             but the recovered clock covers only epochs <= {cut}",
            s.covered, s.returned_at
        )),
        None => Ok(()),
    }
}

/// The bit that marks a seed as one for the file model ([`SimMode::File`](sim::SimMode::File)).
const FILE_SEED: u64 = 1 << 40;

/// The crash model a seed runs in: seeds with the file bit ([`crash_seeds`] adds one for
/// every plain seed) run [`SimMode::File`], the others cycle through the persistent-memory
/// models.
///
/// [`SimMode::File`]: montage_core::sim::SimMode::File
pub fn crash_mode(seed: u64) -> sim::SimMode {
    const OTHERS: [sim::SimMode; 3] = [
        sim::SimMode::Prefix,
        sim::SimMode::WordTear,
        sim::SimMode::Eadr,
    ];
    if seed & FILE_SEED != 0 {
        return sim::SimMode::File;
    }
    OTHERS[(seed % 3) as usize]
}

/// The seeds a crash test should run: `MONTAGE_CRASH_SEED=<n>` selects exactly one (to replay
/// a failure), `MONTAGE_CRASH_SEEDS=<count>` changes how many, and otherwise `0..default`;
/// `MONTAGE_CRASH_SEED_START=<s>` starts the range at `s` (to split a long run across
/// processes); each of those once in the model [`crash_mode`] gives it and once on the file
/// model.
/// `MONTAGE_CRASH_MODELS=file` (or `memory`) keeps only the file seeds (or only the others).
pub fn crash_seeds(default: u64) -> Vec<u64> {
    let number = |name: &str| -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
    };
    if let Some(seed) = number("MONTAGE_CRASH_SEED") {
        return vec![seed];
    }
    let count = number("MONTAGE_CRASH_SEEDS").unwrap_or(default);
    let start = number("MONTAGE_CRASH_SEED_START").unwrap_or(0);
    let plain = start..start.saturating_add(count).min(FILE_SEED);
    let models = std::env::var("MONTAGE_CRASH_MODELS").unwrap_or_default();
    let (memory, file) = match models.trim() {
        "file" => (false, true),
        "memory" => (true, false),
        _ => (true, true),
    };
    let mut seeds = Vec::new();
    if memory {
        seeds.extend(plain.clone());
    }
    if file {
        seeds.extend(plain.map(|seed| seed | FILE_SEED));
    }
    seeds
}

/// Runs `test` once per seed of [`crash_seeds`]. When one panics, prints the seed and how to
/// replay it, then lets the panic continue; with `MONTAGE_CRASH_KEEP_GOING=1` it runs every
/// seed first and fails at the end. Either way it ends with a line
/// ``crash test `name`: N passed, M failed, K simulated power failures`` on standard error,
/// counting seeds, and the crash images the test built on this thread.
///
/// # Panics
///
/// When `test` panics for a seed.
pub fn for_each_seed(name: &str, default: u64, mut test: impl FnMut(u64)) {
    let keep_going = std::env::var_os("MONTAGE_CRASH_KEEP_GOING").is_some_and(|v| v == "1");
    let (mut passed, mut failed) = (0u64, Vec::new());
    let crashes_before = sim::crashes_on_this_thread();
    let summary = |passed: u64, failed: usize| {
        let crashes = sim::crashes_on_this_thread() - crashes_before;
        format!(
            "crash test `{name}`: {passed} passed, {failed} failed, {crashes} simulated power failures"
        )
    };
    for seed in crash_seeds(default) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(seed)));
        match result {
            Ok(()) => passed += 1,
            Err(panic) => {
                eprintln!(
                    "crash test `{name}` failed at seed {seed}; replay with MONTAGE_CRASH_SEED={seed}"
                );
                failed.push(seed);
                if !keep_going {
                    eprintln!("{}", summary(passed, 1));
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
    eprintln!("{}", summary(passed, failed.len()));
    assert!(
        failed.is_empty(),
        "crash test `{name}` failed at seeds {failed:?}"
    );
}

/// The `main` of a test binary with `harness = false` whose tests spawn the binary itself
/// as a child process: runs each of `tests` (name, function) in order, reports each as
/// `test <name> ... ok` or `FAILED`, and ends with `N passed, M failed`. Such a binary's
/// `main` first checks whether it was started as a child (an environment variable its tests
/// set) and, if so, does the child's work instead; so the child's entry point is not a test,
/// and no test passes by returning early.
///
/// # Panics
///
/// Never; a test's panic is caught and counted. Returns a failing exit code if any test
/// failed.
#[must_use]
pub fn run_tests(tests: &[(&str, fn())]) -> std::process::ExitCode {
    let mut failed = Vec::new();
    for &(name, test) in tests {
        eprintln!("test {name} ...");
        if std::panic::catch_unwind(test).is_ok() {
            eprintln!("test {name} ... ok");
        } else {
            eprintln!("test {name} ... FAILED");
            failed.push(name);
        }
    }
    let passed = tests.len() - failed.len();
    // The closing line a test runner's reader looks for, on standard output.
    #[allow(clippy::print_stdout)]
    {
        println!("{passed} passed, {} failed", failed.len());
    }
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("failed: {failed:?}");
        std::process::ExitCode::FAILURE
    }
}

/// Starts the running test binary again as a child process with `env` set (the variables
/// that make its `main` do the child's work, see [`run_tests`]), waits up to a minute for the
/// first line it prints with `MONTAGE ` in it, lets it run for `run_for` more, and kills it
/// with SIGKILL. Returns the text after `MONTAGE ` of each such line it printed (the first
/// among them), or `None` if it printed none within the minute.
///
/// # Panics
///
/// If the child cannot be started, killed or waited for.
#[must_use]
pub fn kill_child_after(
    env: &[(&str, &std::ffi::OsStr)],
    run_for: std::time::Duration,
) -> Option<Vec<String>> {
    use std::io::BufRead;

    let mut command =
        std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    command.stdout(std::process::Stdio::piped());
    for &(name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start the child process");
    let stdout = child.stdout.take().expect("the child's piped output");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(at) = line.find("MONTAGE ") {
                if lines.is_empty() {
                    let _ = ready_tx.send(());
                }
                lines.push(line[at + 8..].to_owned());
            }
        }
        lines
    });
    let came_up = ready_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .is_ok();
    std::thread::sleep(run_for);
    child.kill().expect("kill the child");
    child.wait().expect("wait for the child");
    let lines = reader.join().expect("the child's output reader");
    came_up.then_some(lines)
}

/// The directory for benchmark heap files: `MONTAGE_BENCH_DIR`, else `/dev/shm` (so file
/// heaps measure the runtime rather than the disk), else the system temp directory.
pub fn bench_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("MONTAGE_BENCH_DIR") {
        return std::path::PathBuf::from(dir);
    }
    let shm = std::path::PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// A fresh heap file path named after `name` and this process in [`bench_dir`], removed
/// first (with its journal) if a previous run left it.
pub fn fresh_bench_path(name: &str) -> std::path::PathBuf {
    let path = bench_dir().join(format!("montage-bench-{}-{name}.heap", std::process::id()));
    let _ = montage_core::Heap::remove(&path);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_after_the_crash_point_promises_nothing() {
        let early = SyncRecord {
            covered: Epoch::new(5),
            returned_at: 10,
        };
        let late = SyncRecord {
            covered: Epoch::new(9),
            returned_at: 30,
        };
        assert!(check_synced(&[early, late], 20, Epoch::new(5)).is_ok());
        assert!(check_synced(&[early, late], 20, Epoch::new(4)).is_err());
        assert!(check_synced(&[early, late], 30, Epoch::new(8)).is_err());
    }
}
