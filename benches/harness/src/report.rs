//! What a run produces: `results.json` (one record per measured point), markdown tables, the
//! targets of the performance issue read off the records, and one SVG plot per workload.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::stores::Result;

/// One measured point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) contender: String,
    pub(crate) backend: String,
    pub(crate) workload: String,
    /// `uniform` or `zipf` (`uniform` for the queue, which has no keys).
    pub(crate) key_dist: String,
    pub(crate) threads: usize,
    pub(crate) key_range: u64,
    pub(crate) value_size: usize,
    /// The median of `repeats`.
    pub(crate) ops_per_sec: f64,
    /// Every repeat's throughput, in the order measured.
    pub(crate) repeats: Vec<f64>,
}

impl Record {
    /// Whether `other` measured the same point (contender, backend, workload, keys, threads,
    /// sizes).
    pub(crate) fn same_point(&self, other: &Record) -> bool {
        self.contender == other.contender
            && self.backend == other.backend
            && self.workload == other.workload
            && self.key_dist == other.key_dist
            && self.threads == other.threads
            && self.key_range == other.key_range
            && self.value_size == other.value_size
    }

    /// `contender` with its backend when it has one: how tables and plots name a line.
    pub(crate) fn series(&self) -> String {
        if self.contender == "sled" {
            // sled's flush ends in sync_file_range, which does not flush the device's
            // cache: its "durable" figures are not durable writes.
            "sled (flush not durable)".to_owned()
        } else if self.backend == "none" {
            self.contender.clone()
        } else {
            format!("{} ({})", self.contender, self.backend)
        }
    }
}

/// Writes `records` as a JSON array.
pub(crate) fn write_json(path: &Path, records: &[Record]) -> Result {
    std::fs::write(path, serde_json::to_string_pretty(records)? + "\n")?;
    Ok(())
}

/// Reads a JSON array of records.
pub(crate) fn read_json(path: &Path) -> Result<Vec<Record>> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// `ops` as a short human figure: `12.3M`, `456k`, `789`.
fn short(ops: f64) -> String {
    if ops >= 1e6 {
        format!("{:.2}M", ops / 1e6)
    } else if ops >= 1e3 {
        format!("{:.1}k", ops / 1e3)
    } else {
        format!("{ops:.0}")
    }
}

fn distinct<T: Ord>(records: &[&Record], f: impl Fn(&Record) -> T) -> Vec<T> {
    records
        .iter()
        .map(|r| f(r))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Markdown tables: per workload and key distribution, a row per contender and a column per
/// (value size, threads), in operations per second.
pub(crate) fn markdown(records: &[Record]) -> String {
    let mut out = String::new();
    for workload in crate::workload::Workload::ALL.map(crate::workload::Workload::name) {
        let of_workload: Vec<&Record> = records.iter().filter(|r| r.workload == workload).collect();
        if of_workload.is_empty() {
            continue;
        }
        for dist in distinct(&of_workload, |r| r.key_dist.clone()) {
            let rows: Vec<&Record> = of_workload
                .iter()
                .copied()
                .filter(|r| r.key_dist == dist)
                .collect();
            let columns = distinct(&rows, |r| (r.value_size, r.threads));
            let _ = writeln!(
                out,
                "\n#### `{workload}`, {dist} keys, key range {} (operations per second)\n",
                rows[0].key_range
            );
            out.push_str("| contender |");
            for (size, threads) in &columns {
                let _ = write!(out, " {size} B, {threads} thr |");
            }
            out.push_str("\n|---|");
            out.push_str(&"---:|".repeat(columns.len()));
            out.push('\n');
            for series in series_in_order(&rows) {
                let _ = write!(out, "| {series} |");
                for (size, threads) in &columns {
                    let cell = rows
                        .iter()
                        .find(|r| {
                            r.series() == series && r.value_size == *size && r.threads == *threads
                        })
                        .map_or_else(|| "-".to_owned(), |r| short(r.ops_per_sec));
                    let _ = write!(out, " {cell} |");
                }
                out.push('\n');
            }
        }
    }
    out
}

/// The series of `records` in the order the run measured them.
fn series_in_order(records: &[&Record]) -> Vec<String> {
    let mut seen = Vec::new();
    for record in records {
        let series = record.series();
        if !seen.contains(&series) {
            seen.push(series);
        }
    }
    seen
}

/// The median throughput of the point that matches, if measured.
fn find(
    records: &[Record],
    contender: &str,
    backend: &str,
    workload: &str,
    dist: &str,
    value_size: usize,
    threads: usize,
) -> Option<f64> {
    records
        .iter()
        .find(|r| {
            r.contender == contender
                && r.backend == backend
                && r.workload == workload
                && r.key_dist == dist
                && r.value_size == value_size
                && r.threads == threads
        })
        .map(|r| r.ops_per_sec)
}

/// One comparison of the targets: `ours / theirs` against `goal`.
struct Ratio {
    what: String,
    value: f64,
    goal: f64,
}

/// Every point where montage-hashmap (pmem) and `(contender, backend)` were both measured in
/// `workloads`, as ratios ours/theirs.
fn ratios_against(
    records: &[Record],
    workloads: &[&str],
    contender: &str,
    backend: &str,
    goal: f64,
    filter: impl Fn(&Record) -> bool,
) -> Vec<Ratio> {
    ratios_of(
        records,
        ("montage-hashmap", "pmem"),
        workloads,
        (contender, backend),
        goal,
        filter,
    )
}

/// Every point where `ours` and `theirs` (contender, backend) were both measured in
/// `workloads`, as ratios ours/theirs.
fn ratios_of(
    records: &[Record],
    ours: (&str, &str),
    workloads: &[&str],
    theirs: (&str, &str),
    goal: f64,
    filter: impl Fn(&Record) -> bool,
) -> Vec<Ratio> {
    records
        .iter()
        .filter(|r| {
            r.contender == ours.0
                && r.backend == ours.1
                && workloads.contains(&r.workload.as_str())
                && filter(r)
        })
        .filter_map(|r| same_point_ratio(records, r, theirs.0, theirs.1, goal))
        .collect()
}

/// One line of the targets summary: how many points met the goal, and the worst and best.
fn summarize(out: &mut String, title: &str, ratios: &[Ratio]) {
    if ratios.is_empty() {
        let _ = writeln!(out, "| {title} | not measured in this run | | |");
        return;
    }
    let goal = ratios[0].goal;
    let met = ratios.iter().filter(|r| r.value >= r.goal).count();
    let worst = ratios
        .iter()
        .min_by(|a, b| a.value.total_cmp(&b.value))
        .map_or(String::new(), |r| format!("{:.2}x ({})", r.value, r.what));
    let best = ratios
        .iter()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .map_or(String::new(), |r| format!("{:.2}x ({})", r.value, r.what));
    let verdict = if met == ratios.len() { "met" } else { "missed" };
    let _ = writeln!(
        out,
        "| {title} (goal {goal}x) | {verdict} (reached at {met} of {} points) | {worst} | {best} |",
        ratios.len()
    );
}

/// What the run ran on: CPU, cores, memory, kernel, and the commit measured.
pub(crate) fn machine() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let memory = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|m| m.trim().to_owned()))
        .unwrap_or_else(|| "unknown".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        );
    format!("{cpu}, {cores} cores, {memory} memory, Linux {kernel}; commit {commit}")
}

/// The targets, each read off `records`.
pub(crate) fn targets(records: &[Record]) -> String {
    let mut out =
        String::from("| target | result | worst point | best point |\n|---|---|---|---|\n");
    let small = |r: &Record| r.threads == 2 && (r.value_size == 8 || r.value_size == 256);
    summarize(
        &mut out,
        "`90-5-5` vs transient-hashmap, 8/256 B, 2 threads",
        &ratios_against(
            records,
            &["90-5-5"],
            "transient-hashmap",
            "none",
            0.8,
            small,
        ),
    );
    summarize(
        &mut out,
        "`50-25-25` vs strict-durable-hashmap (pmem)",
        &ratios_against(
            records,
            &["50-25-25"],
            "strict-durable-hashmap",
            "pmem",
            5.0,
            |_| true,
        ),
    );
    let maps = crate::workload::Workload::MAP.map(crate::workload::Workload::name);
    for (peer, goal) in [
        ("redb", 10.0),
        ("sled", 10.0),
        ("fjall", 10.0),
        ("rocksdb", 10.0),
        ("heed", 3.0),
    ] {
        summarize(
            &mut out,
            &format!("every map workload vs {peer}"),
            &ratios_against(records, &maps, peer, "none", goal, |_| true),
        );
    }
    // Durable writes on a disk file: ours on the journal against the embedded stores whose
    // durable commit flushes the device (not sled: its flush is sync_file_range), and
    // against the device's own write-and-flush.
    let flushing = ["redb", "fjall", "heed", "rocksdb"];
    for (workload, threads, goal) in [("sync-each", 2, 1.0), ("sync-100", 2, 5.0)] {
        summarize(
            &mut out,
            &format!("`{workload}` on the journal, {threads} threads, vs the best flushing store"),
            &durable_ratios(records, "journal", workload, threads, goal, &flushing),
        );
    }
    for threads in [1, 2, 8] {
        summarize(
            &mut out,
            &format!("`sync-each` on the journal, {threads} threads, vs the device"),
            &durable_ratios(
                records,
                "journal",
                "sync-each",
                threads,
                1.0 / 1.5,
                &["device"],
            ),
        );
    }
    // Buffered writes: every map point of the journal against the same point on pmem.
    let buffered: Vec<Ratio> = records
        .iter()
        .filter(|r| {
            r.contender == "montage-hashmap"
                && r.backend == "journal"
                && maps.contains(&r.workload.as_str())
        })
        .filter_map(|ours| same_point_ratio(records, ours, "montage-hashmap", "pmem", 0.7))
        .collect();
    summarize(&mut out, "every map point, journal vs pmem", &buffered);
    logged_targets(&mut out, records);
    out
}

/// The logged structures' targets: a `BTreeMap` made persistent by `Logged` against the
/// same map under a lock in DRAM (one, and sharded against as many locked maps), against
/// itself taking no snapshots while it runs (the default policy's cost), and a logged
/// `VecDeque` against a locked one.
fn logged_targets(out: &mut String, records: &[Record]) {
    for (ours, theirs, threads) in [
        ("logged-btreemap", "locked-btreemap", 1),
        ("logged-btreemap-sharded", "locked-btreemap-sharded", 2),
    ] {
        for (workload, goal) in [("90-5-5", 0.9), ("50-25-25", 0.5)] {
            summarize(
                out,
                &format!("`{workload}` {ours} vs {theirs}, 256 B, {threads} thread(s)"),
                &ratios_of(
                    records,
                    (ours, "pmem"),
                    &[workload],
                    (theirs, "none"),
                    goal,
                    |r| r.threads == threads && r.value_size == 256,
                ),
            );
        }
    }
    // What the default snapshot policy costs: at most a tenth.
    for workload in ["90-5-5", "50-25-25"] {
        summarize(
            out,
            &format!(
                "`{workload}` logged-btreemap vs logged-btreemap-unsnapped (the snapshot policy's cost), 256 B, 1 thread(s)"
            ),
            &ratios_of(
                records,
                ("logged-btreemap", "pmem"),
                &[workload],
                ("logged-btreemap-unsnapped", "pmem"),
                0.9,
                |r| r.threads == 1 && r.value_size == 256,
            ),
        );
    }
    summarize(
        out,
        "`queue-pairs` logged-vecdeque vs transient-queue (a locked `VecDeque`)",
        &ratios_of(
            records,
            ("logged-vecdeque", "pmem"),
            &["queue-pairs"],
            ("transient-queue", "none"),
            0.1,
            |_| true,
        ),
    );
}

/// `ours` against `(contender, backend)` at the same point, if that was measured.
fn same_point_ratio(
    records: &[Record],
    ours: &Record,
    contender: &str,
    backend: &str,
    goal: f64,
) -> Option<Ratio> {
    let theirs = find(
        records,
        contender,
        backend,
        &ours.workload,
        &ours.key_dist,
        ours.value_size,
        ours.threads,
    )?;
    Some(Ratio {
        what: format!(
            "{} {} {} B {} thr",
            ours.workload, ours.key_dist, ours.value_size, ours.threads
        ),
        value: ours.ops_per_sec / theirs,
        goal,
    })
}

/// montage-hashmap on `backend` in `workload` with `threads` threads, against the best of
/// `theirs` at the same point (value size, keys).
fn durable_ratios(
    records: &[Record],
    backend: &str,
    workload: &str,
    threads: usize,
    goal: f64,
    theirs: &[&str],
) -> Vec<Ratio> {
    records
        .iter()
        .filter(|r| {
            r.contender == "montage-hashmap"
                && r.backend == backend
                && r.workload == workload
                && r.threads == threads
        })
        .filter_map(|ours| {
            let (best, name) = theirs
                .iter()
                .filter_map(|p| {
                    find(
                        records,
                        p,
                        "none",
                        workload,
                        &ours.key_dist,
                        ours.value_size,
                        threads,
                    )
                    .map(|v| (v, *p))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0))?;
            Some(Ratio {
                what: format!("{} B vs {name}", ours.value_size),
                value: ours.ops_per_sec / best,
                goal,
            })
        })
        .collect()
}

/// One SVG per workload under `dir`: throughput (log scale) against threads, a panel per
/// (value size, key distribution), a line per contender.
pub(crate) fn plots(dir: &Path, records: &[Record]) -> Result {
    std::fs::create_dir_all(dir)?;
    for workload in crate::workload::Workload::ALL.map(crate::workload::Workload::name) {
        let ours: Vec<&Record> = records.iter().filter(|r| r.workload == workload).collect();
        if ours.is_empty() {
            continue;
        }
        let path = dir.join(format!("{workload}.svg"));
        plot_workload(&path, workload, &ours)?;
    }
    Ok(())
}

fn plot_workload(path: &Path, workload: &str, records: &[&Record]) -> Result {
    let sizes = distinct(records, |r| r.value_size);
    let dists = distinct(records, |r| r.key_dist.clone());
    let threads = distinct(records, |r| r.threads);
    let series = series_in_order(records);
    let (width, height) = (520 * dists.len() as u32, 380 * sizes.len() as u32 + 40);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(
        &format!("{workload}: operations per second against threads"),
        ("sans-serif", 22),
    )?;
    let panels = body.split_evenly((sizes.len(), dists.len()));
    let max_threads = threads.iter().copied().max().unwrap_or(1) as f64;
    let ymax = records.iter().map(|r| r.ops_per_sec).fold(1.0, f64::max) * 2.0;
    let ymin = records
        .iter()
        .map(|r| r.ops_per_sec)
        .filter(|v| *v > 0.0)
        .fold(ymax, f64::min)
        / 2.0;
    for (i, panel) in panels.iter().enumerate() {
        let (size, dist) = (sizes[i / dists.len()], &dists[i % dists.len()]);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{size}-byte values, {dist} keys"),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            // Room on the right, past the last thread count, for the legend.
            .build_cartesian_2d(0.8..max_threads * 1.8, (ymin..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("threads")
            .y_desc("ops/s")
            .light_line_style(TRANSPARENT)
            .x_labels(20)
            .x_label_formatter(&|x| {
                let t = x.round();
                let measured = (x - t).abs() < 1e-6 && threads.contains(&(t as usize));
                if measured {
                    format!("{t:.0}")
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| short(*y))
            .draw()?;
        for (n, name) in series.iter().enumerate() {
            let color = Palette99::pick(n).to_rgba();
            let mut points: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| &r.series() == name && r.value_size == size && &r.key_dist == dist)
                .map(|r| (r.threads as f64, r.ops_per_sec))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
