//! The throughput harness: montage's hash maps and queues side by side with the transient
//! upper bounds, a strictly durable variant of the same runtime and the embedded stores a
//! Rust user would pick instead, on the same workloads in one run.
//!
//! `cargo xtask bench` runs it with every contender; see `docs/PERFORMANCE.md` for the
//! workloads, the contenders' modes and what one run on the project's machine measured.
//! Results go to `<out>/results.json` (one record per point), `<out>/results.md` (the tables,
//! also printed) and `<out>/plots/<workload>.svg`.

#![allow(clippy::print_stdout, clippy::print_stderr)]
// Rates and ratios: counts become floating point, far inside f64's exact range.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod report;
mod run;
mod scramble;
mod stores;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use report::Record;
use run::Timing;
use stores::{Backend, Contender, Dirs, MapStore, QueueStore, Result, Sizing};
use workload::{KeyDist, Workload};

/// Measures montage's structures against transient and embedded stores.
#[derive(Debug, Parser)]
#[allow(clippy::struct_excessive_bools)] // command-line switches
#[command(name = "montage-bench")]
struct Args {
    /// A short run for a first look (under 3 minutes on 2 cores): 100,000 keys, 256-byte
    /// values, 200 ms per point, one repeat. Explicit flags still override it.
    #[arg(long)]
    quick: bool,
    /// Key range (the stores are prefilled with half of it).
    #[arg(long)]
    key_range: Option<u64>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',')]
    value_sizes: Option<Vec<usize>>,
    /// Thread counts (default: 1, 2 and powers of two up to the cores available).
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// How long each repeat of a point runs, in milliseconds.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Repeats per point (the median is reported).
    #[arg(long)]
    repeats: Option<usize>,
    /// Only these contenders (names as in the results). Without it, every contender but the
    /// logged structures and their DRAM baselines (`logged-btreemap`,
    /// `logged-btreemap-sharded`, `logged-btreemap-unsnapped`, `locked-btreemap`,
    /// `locked-btreemap-sharded`, `logged-vecdeque`), which run only when named.
    #[arg(long, value_delimiter = ',')]
    contenders: Option<Vec<String>>,
    /// Only montage contenders on these backends (`volatile`, `pmem`, `journal`); the
    /// transient and embedded stores are kept.
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// Only these workloads (names as in the results).
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Where results, tables and plots go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Directory for `pmem`-backend heaps: a memory file system (tmpfs or DAX).
    #[arg(long, env = "MONTAGE_BENCH_PMEM_DIR", default_value = "/dev/shm")]
    pmem_dir: PathBuf,
    /// Directory on a disk for file-backend heaps, the embedded stores and the device floor
    /// (default `<out>/data`).
    #[arg(long, env = "MONTAGE_BENCH_DIR")]
    disk_dir: Option<PathBuf>,
    /// Only rebuild the tables and plots from `<out>/results.json`.
    #[arg(long)]
    report_only: bool,
    /// Keep the points already in `<out>/results.json`, replacing those measured again.
    #[arg(long)]
    append: bool,
    /// Measure the contenders side by side: at each value size open and prefill all the
    /// maps (and, for `queue-pairs`, all the queues), then run every repeat of a point on
    /// each in turn, so that drift in the machine's speed reaches every contender alike
    /// (needs the memory of all the stores at once; the sync workloads are not
    /// interleaved).
    #[arg(long)]
    interleave: bool,
    /// Keep the heap files of a montage contender whose run failed (they are removed
    /// otherwise), and say where they are, for `montage check` to look at.
    #[arg(long)]
    keep_failed: bool,
}

/// The settings of one run, defaults filled in.
struct Plan {
    key_range: u64,
    value_sizes: Vec<usize>,
    threads: Vec<usize>,
    timing: Timing,
    maps: Vec<(Contender, Backend)>,
    queues: Vec<(Contender, Backend)>,
    workloads: Vec<Workload>,
    dirs: Dirs,
    interleave: bool,
}

/// Every map contender with the backends it runs on, in the order they are measured.
fn map_contenders() -> Vec<(Contender, Backend)> {
    let mut all = vec![
        (Contender::MontageHashMap, Backend::Volatile),
        (Contender::MontageHashMap, Backend::Pmem),
        (Contender::MontageHashMap, Backend::Journal),
        (Contender::MontageHashMapVerified, Backend::Pmem),
        (Contender::MontageHashMapGrown, Backend::Pmem),
        (Contender::MontageNbHashMap, Backend::Pmem),
        (Contender::StrictDurableHashMap, Backend::Pmem),
        (Contender::TransientHashMap, Backend::None),
        (Contender::DashMap, Backend::None),
        (Contender::LoggedBTreeMap, Backend::Pmem),
        (Contender::LoggedBTreeMapSharded, Backend::Pmem),
        (Contender::LoggedBTreeMapUnsnapped, Backend::Pmem),
        (Contender::LockedBTreeMap, Backend::None),
        (Contender::LockedBTreeMapSharded, Backend::None),
        (Contender::Device, Backend::None),
    ];
    if cfg!(feature = "peers") {
        all.extend(
            [
                Contender::Redb,
                Contender::Sled,
                Contender::Fjall,
                Contender::Heed,
                Contender::Rocksdb,
            ]
            .map(|c| (c, Backend::None)),
        );
    }
    all
}

fn queue_contenders() -> Vec<(Contender, Backend)> {
    vec![
        (Contender::MontageQueue, Backend::Pmem),
        (Contender::MontageNbQueue, Backend::Pmem),
        (Contender::LoggedVecDeque, Backend::Pmem),
        (Contender::TransientQueue, Backend::None),
    ]
}

impl Plan {
    fn from_args(args: &Args) -> Result<Plan> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let default_threads: Vec<usize> = std::iter::successors(Some(1), |t| Some(t * 2))
            .take_while(|&t| t <= cores.max(2))
            .collect();
        let quick = args.quick;
        let wanted = |name: &str, list: &Option<Vec<String>>| {
            list.as_ref().is_none_or(|l| l.iter().any(|n| n == name))
        };
        // The logged structures and their DRAM baselines run when named (`--contenders`):
        // the default run keeps the length its docs give.
        let contender_wanted = |c: Contender| match &args.contenders {
            Some(list) => list.iter().any(|n| n == c.name()),
            None => !c.on_request(),
        };
        if let Some(names) = &args.contenders {
            let known: Vec<_> = map_contenders()
                .into_iter()
                .chain(queue_contenders())
                .map(|(c, _)| c.name())
                .collect();
            if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
                return Err(format!(
                    "unknown contender `{bad}` (this build has: {})",
                    known.join(", ")
                )
                .into());
            }
        }
        if let Some(bad) = args.backends.iter().flatten().find(|n| {
            ![Backend::Volatile, Backend::Pmem, Backend::Journal]
                .iter()
                .any(|b| b.name() == n.as_str())
        }) {
            return Err(format!("unknown backend `{bad}` (volatile, pmem, journal)").into());
        }
        let on_backend = |backend: Backend| {
            backend == Backend::None
                || args
                    .backends
                    .as_ref()
                    .is_none_or(|l| l.iter().any(|n| n == backend.name()))
        };
        if let Some(names) = &args.workloads
            && let Some(bad) = names
                .iter()
                .find(|n| !Workload::ALL.iter().any(|w| w.name() == n.as_str()))
        {
            return Err(format!("unknown workload `{bad}`").into());
        }
        let disk = args
            .disk_dir
            .clone()
            .unwrap_or_else(|| args.out.join("data"));
        Ok(Plan {
            key_range: args
                .key_range
                .unwrap_or(if quick { 100_000 } else { 1_000_000 }),
            value_sizes: args
                .value_sizes
                .clone()
                .unwrap_or_else(|| if quick { vec![256] } else { vec![8, 256, 1024] }),
            threads: args.threads.clone().unwrap_or(default_threads),
            timing: Timing {
                duration: Duration::from_millis(args.duration_ms.unwrap_or(if quick {
                    200
                } else {
                    1000
                })),
                repeats: args.repeats.unwrap_or(if quick { 1 } else { 3 }).max(1),
            },
            maps: map_contenders()
                .into_iter()
                .filter(|(c, b)| contender_wanted(*c) && on_backend(*b))
                .collect(),
            queues: queue_contenders()
                .into_iter()
                .filter(|(c, b)| contender_wanted(*c) && on_backend(*b))
                .collect(),
            workloads: Workload::ALL
                .into_iter()
                .filter(|w| wanted(w.name(), &args.workloads))
                .collect(),
            dirs: Dirs {
                pmem: args.pmem_dir.clone(),
                disk,
                keep_failed: args.keep_failed,
            },
            interleave: args.interleave,
        })
    }
}

/// Prints `record`, puts it in `records` in place of an earlier record of the same point,
/// and saves them all to `json`.
fn save_record(json: &std::path::Path, records: &mut Vec<Record>, record: Record) -> Result {
    eprintln!(
        "  {:<36} {:<10} {:<8} {:>5} B {} thr: {:>12.0} ops/s",
        record.series(),
        record.workload,
        record.key_dist,
        record.value_size,
        record.threads,
        record.ops_per_sec
    );
    records.retain(|r| !r.same_point(&record));
    records.push(record);
    report::write_json(json, records)
}

/// Runs the plan, adding a record per point to `records` (replacing an earlier record of the
/// same point) and saving them after each. A contender that fails is reported and skipped;
/// the failures are returned.
fn run_plan(plan: &Plan, json: &std::path::Path, records: &mut Vec<Record>) -> Result<Vec<String>> {
    std::fs::create_dir_all(&plan.dirs.disk)?;
    stores::remove_stale(&plan.dirs.pmem);
    stores::remove_stale(&plan.dirs.disk);
    let mut failures = Vec::new();
    let mut failed = |what: String| {
        eprintln!("FAILED: {what}");
        failures.push(what);
    };
    let save = |record: Record, records: &mut Vec<Record>| save_record(json, records, record);
    let map_workloads: Vec<Workload> = Workload::MAP
        .into_iter()
        .filter(|w| plan.workloads.contains(w))
        .collect();
    let sync_workloads: Vec<Workload> = Workload::SYNC
        .into_iter()
        .filter(|w| plan.workloads.contains(w))
        .collect();
    for &value_size in &plan.value_sizes {
        let sizing = Sizing {
            key_range: plan.key_range,
            value_size,
        };
        if plan.interleave {
            let started = Instant::now();
            if let Err(e) = run_interleaved(plan, sizing, &map_workloads, &mut |r| save(r, records))
            {
                failed(format!("{value_size}-byte values, interleaved: {e}"));
            }
            eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
        }
        for &(contender, backend) in &plan.maps {
            if plan.interleave && contender.sync_only() {
                continue;
            }
            let durable = contender.is_durable(backend);
            let map_workloads: &[Workload] = if contender.sync_only() || plan.interleave {
                &[]
            } else {
                &map_workloads
            };
            if map_workloads.is_empty() && (sync_workloads.is_empty() || !durable) {
                continue;
            }
            let started = Instant::now();
            let result = stores::with_map(contender, backend, &plan.dirs, sizing, &mut |store| {
                let filled = Instant::now();
                run::prefill(store, plan.key_range, value_size, 2)?;
                eprintln!(
                    "{}, {value_size}-byte values: prefilled {} keys in {:.1} s",
                    stores::label(contender, backend),
                    plan.key_range / 2,
                    filled.elapsed().as_secs_f64()
                );
                let mut points: Vec<(Workload, KeyDist)> = Vec::new();
                for &w in map_workloads {
                    points.push((w, KeyDist::Uniform));
                    points.push((w, KeyDist::Zipf));
                }
                if durable {
                    // Bound by write-back latency, not by key choice: uniform keys only.
                    points.extend(sync_workloads.iter().map(|&w| (w, KeyDist::Uniform)));
                }
                for (workload, dist) in points {
                    for &threads in &plan.threads {
                        let repeats = run::map_workload(
                            store,
                            workload,
                            dist,
                            threads,
                            plan.key_range,
                            value_size,
                            plan.timing,
                        )?;
                        save(
                            record(contender, backend, workload, dist, threads, sizing, repeats),
                            records,
                        )?;
                    }
                }
                Ok(())
            });
            if let Err(e) = result {
                failed(format!(
                    "{}, {value_size}-byte values: {e}",
                    stores::label(contender, backend)
                ));
            }
            eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
        }
        if plan.workloads.contains(&Workload::QueuePairs) {
            run_queues(plan, value_size, &mut |r| save(r, records), &mut failed);
        }
    }
    Ok(failures)
}

/// A map contender opened by [`with_maps`].
type Opened<'a> = (Contender, Backend, &'a dyn MapStore);

/// Opens every contender of `contenders` at once (in nested scopes, so each store is closed
/// and its files removed when the scope ends) and runs `f` on all of them.
fn with_maps(
    contenders: &[(Contender, Backend)],
    opened: &[Opened<'_>],
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&[Opened<'_>]) -> Result,
) -> Result {
    let Some((&(contender, backend), rest)) = contenders.split_first() else {
        return f(opened);
    };
    stores::with_map(contender, backend, dirs, sizing, &mut |store| {
        let mut all = opened.to_vec();
        all.push((contender, backend, store));
        with_maps(rest, &all, dirs, sizing, f)
    })
}

/// A queue contender opened by [`with_queues`].
type OpenedQueue<'a> = (Contender, Backend, &'a dyn QueueStore);

/// [`with_maps`] for queues. (The two differ only in their store types, which the stores'
/// openers bind to the scope of each call; a generic version cannot name that bound.)
fn with_queues(
    contenders: &[(Contender, Backend)],
    opened: &[OpenedQueue<'_>],
    dirs: &Dirs,
    sizing: Sizing,
    f: &mut dyn FnMut(&[OpenedQueue<'_>]) -> Result,
) -> Result {
    let Some((&(contender, backend), rest)) = contenders.split_first() else {
        return f(opened);
    };
    stores::with_queue(contender, backend, dirs, sizing, &mut |store| {
        let mut all = opened.to_vec();
        all.push((contender, backend, store));
        with_queues(rest, &all, dirs, sizing, f)
    })
}

/// The map workloads at one value size with every map contender open at once: each point's
/// repeats run round-robin over the contenders (`--interleave`).
fn run_interleaved(
    plan: &Plan,
    sizing: Sizing,
    workloads: &[Workload],
    save: &mut dyn FnMut(Record) -> Result,
) -> Result {
    let contenders: Vec<(Contender, Backend)> = plan
        .maps
        .iter()
        .copied()
        .filter(|(c, _)| !c.sync_only())
        .collect();
    if contenders.is_empty() || workloads.is_empty() {
        return Ok(());
    }
    with_maps(&contenders, &[], &plan.dirs, sizing, &mut |stores| {
        for &(contender, backend, store) in stores {
            let filled = Instant::now();
            run::prefill(store, plan.key_range, sizing.value_size, 2)?;
            eprintln!(
                "{}, {}-byte values: prefilled {} keys in {:.1} s",
                stores::label(contender, backend),
                sizing.value_size,
                plan.key_range / 2,
                filled.elapsed().as_secs_f64()
            );
        }
        let once = Timing {
            repeats: 1,
            ..plan.timing
        };
        for &workload in workloads {
            for dist in [KeyDist::Uniform, KeyDist::Zipf] {
                for &threads in &plan.threads {
                    let mut repeats = vec![Vec::new(); stores.len()];
                    for _ in 0..plan.timing.repeats {
                        for (i, &(contender, backend, store)) in stores.iter().enumerate() {
                            let measured = run::map_workload(
                                store,
                                workload,
                                dist,
                                threads,
                                plan.key_range,
                                sizing.value_size,
                                once,
                            )
                            .map_err(|e| {
                                format!(
                                    "{}, {} {}: {e}",
                                    stores::label(contender, backend),
                                    workload.name(),
                                    dist.name()
                                )
                            })?;
                            repeats[i].extend(measured);
                        }
                    }
                    for (&(contender, backend, _), repeats) in stores.iter().zip(repeats) {
                        save(record(
                            contender, backend, workload, dist, threads, sizing, repeats,
                        ))?;
                    }
                }
            }
        }
        Ok(())
    })
}

/// The queue workload at one value size, on every queue contender. The heap is sized for a
/// map of the plan's key range: enough for the garbage a fast queue makes in the epochs
/// before it is reclaimed. With `--interleave`, every queue is open at once and each
/// point's repeats run round-robin over them, as the maps' do.
fn run_queues(
    plan: &Plan,
    value_size: usize,
    save: &mut dyn FnMut(Record) -> Result,
    failed: &mut dyn FnMut(String),
) {
    let heap = Sizing {
        key_range: plan.key_range.max(run::QUEUE_PREFILL as u64),
        value_size,
    };
    let point = Sizing {
        key_range: 0,
        value_size,
    };
    let record_of = |contender, backend, threads, repeats| {
        record(
            contender,
            backend,
            Workload::QueuePairs,
            KeyDist::Uniform,
            threads,
            point,
            repeats,
        )
    };
    if plan.interleave {
        let once = Timing {
            repeats: 1,
            ..plan.timing
        };
        let result = with_queues(&plan.queues, &[], &plan.dirs, heap, &mut |queues| {
            for &(_, _, store) in queues {
                run::prefill_queue(store, value_size)?;
            }
            for &threads in &plan.threads {
                let mut repeats = vec![Vec::new(); queues.len()];
                for _ in 0..plan.timing.repeats {
                    for (i, &(_, _, store)) in queues.iter().enumerate() {
                        repeats[i].extend(run::queue_pairs(store, threads, value_size, once)?);
                    }
                }
                for (&(contender, backend, _), repeats) in queues.iter().zip(repeats) {
                    save(record_of(contender, backend, threads, repeats))?;
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            failed(format!(
                "queues, {value_size}-byte values, interleaved: {e}"
            ));
        }
        return;
    }
    for &(contender, backend) in &plan.queues {
        for &threads in &plan.threads {
            let result = stores::with_queue(contender, backend, &plan.dirs, heap, &mut |store| {
                run::prefill_queue(store, value_size)?;
                let repeats = run::queue_pairs(store, threads, value_size, plan.timing)?;
                save(record_of(contender, backend, threads, repeats))
            });
            if let Err(e) = result {
                failed(format!(
                    "{}, {value_size}-byte values, {threads} threads: {e}",
                    stores::label(contender, backend)
                ));
            }
        }
    }
}

fn record(
    contender: Contender,
    backend: Backend,
    workload: Workload,
    dist: KeyDist,
    threads: usize,
    sizing: Sizing,
    repeats: Vec<f64>,
) -> Record {
    Record {
        contender: contender.name().to_owned(),
        backend: backend.name().to_owned(),
        workload: workload.name().to_owned(),
        key_dist: dist.name().to_owned(),
        threads,
        key_range: sizing.key_range,
        value_size: sizing.value_size,
        ops_per_sec: run::median(&repeats),
        repeats,
    }
}

/// Writes the tables, the targets, the failures and the plots for `records`, and prints the
/// tables.
fn write_reports(out: &std::path::Path, records: &[Record], failures: &[String]) -> Result {
    let tables = report::markdown(records);
    let mut targets = report::targets(records);
    if !failures.is_empty() {
        targets.push_str("\n## Failures\n\n");
        for failure in failures {
            targets.push_str("* ");
            targets.push_str(failure);
            targets.push('\n');
        }
    }
    let text = format!(
        "Machine: {}\n\n## Throughput\n{tables}\n## Targets\n\n{targets}",
        report::machine()
    );
    std::fs::write(out.join("results.md"), &text)?;
    report::plots(&out.join("plots"), records)?;
    println!("{text}");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = (|| -> Result {
        std::fs::create_dir_all(&args.out)?;
        let json = args.out.join("results.json");
        if args.report_only {
            return write_reports(&args.out, &report::read_json(&json)?, &[]);
        }
        let plan = Plan::from_args(&args)?;
        if !cfg!(feature = "peers") {
            eprintln!(
                "note: built without the `peers` feature: the embedded stores are not measured"
            );
        }
        let started = Instant::now();
        let mut records = if args.append && json.exists() {
            report::read_json(&json)?
        } else {
            Vec::new()
        };
        let failures = run_plan(&plan, &json, &mut records)?;
        eprintln!(
            "{} points in {:.0} s; results in {}",
            records.len(),
            started.elapsed().as_secs_f64(),
            json.display()
        );
        write_reports(&args.out, &records, &failures)?;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!("{} contender(s) failed (listed above)", failures.len()).into())
        }
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("montage-bench: {err}");
            ExitCode::FAILURE
        }
    }
}
