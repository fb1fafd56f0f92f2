//! The memcached-compatible server against real memcached tools:
//!
//! * [`conformance()`]: Debian's `memccapable` (libmemcached-tools), text protocol, against a
//!   `montage-kv` on a fresh heap; part of CI.
//! * [`bench()`]: `memcaslap` against `montage-kv` (durable and not, on both backends) and
//!   against a real `memcached`, on loopback with the same settings, interleaved and
//!   repeated; prints each throughput and its ratio to memcached's. With `--evict`, the
//!   eviction benchmark instead (see [`evict_bench()`]).

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, build_test_profile, built, cargo, project_root};

/// A server process that is killed if it is still running when dropped.
struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Sends SIGTERM and waits (up to a minute) for a successful exit.
    fn terminate(mut self) -> Result {
        signal_term(self.child.id())?;
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("montage-kv exited with {status}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => return Err("montage-kv ignored SIGTERM".to_owned()),
                Err(e) => return Err(format!("cannot wait for montage-kv: {e}")),
            }
        }
    }
}

fn signal_term(pid: u32) -> Result {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -TERM {pid} failed"))
    }
}

/// Fails with an install hint unless `tool` is on the PATH.
fn require(tool: &str, package: &str) -> Result {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        Ok(())
    } else {
        Err(format!(
            "{tool} is not installed: `apt-get install {package}` (.ci/run does this)"
        ))
    }
}

/// Starts `binary` on `heap` with `extra` arguments on a free port; returns once it listens.
fn start_montage_kv(binary: &Path, heap: &Path, extra: &[&str]) -> Result<Running> {
    let mut child = Command::new(binary)
        .arg("--heap")
        .arg(heap)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut said = Vec::new();
    let port = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            return Err(format!("montage-kv stopped before listening: {said:?}"));
        };
        if let Some(port) = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|port| port.parse().ok())
        {
            break port;
        }
        said.push(line);
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ok(Running { child, port })
}

/// Runs `memccapable -a` (its text-protocol tests) against a fresh `montage-kv`, then stops
/// the server with SIGTERM, which must close the heap cleanly.
pub(crate) fn conformance() -> Result {
    require("memccapable", "libmemcached-tools")?;
    build_test_profile()?;
    let binary = built("montage-kv");
    let dir = scratch("kv-conformance")?;
    let server = start_montage_kv(&binary, &dir.join("kv.heap"), &["--size", "64MiB"])?;
    println!("$ memccapable -h 127.0.0.1 -p {} -a", server.port);
    let output = Command::new("memccapable")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string(), "-a"])
        .output()
        .map_err(|e| format!("cannot run memccapable: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() || !text.contains("All tests passed") {
        return Err("memccapable failed against montage-kv".to_owned());
    }
    server.terminate()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh directory under `target/`.
fn scratch(name: &str) -> Result<PathBuf> {
    let dir = project_root().join("target").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Settings of a `bench-kv` run.
struct BenchArgs {
    seconds: u64,
    repeats: usize,
    concurrency: u32,
    client_threads: u32,
    server_threads: u32,
    value: u32,
    /// Proportions of sets to run (memcaslap's default mix is 0.1).
    set_ratios: Vec<f64>,
}

impl BenchArgs {
    fn parse(args: &[String]) -> Result<BenchArgs> {
        let usage = || {
            "usage: cargo xtask bench-kv [--seconds S] [--repeats R] [--concurrency C] \
             [--client-threads T] [--server-threads T] [--value BYTES] [--set-ratios 0.1,0.5]"
                .to_owned()
        };
        let mut parsed = BenchArgs {
            seconds: 10,
            repeats: 3,
            concurrency: 64,
            client_threads: 2,
            server_threads: 2,
            value: 256,
            set_ratios: vec![0.1, 0.5],
        };
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            let value = rest.next().ok_or_else(usage)?;
            let bad = |_| usage();
            match flag.as_str() {
                "--seconds" => parsed.seconds = value.parse().map_err(bad)?,
                "--repeats" => parsed.repeats = value.parse().map_err(bad)?,
                "--concurrency" => parsed.concurrency = value.parse().map_err(bad)?,
                "--client-threads" => parsed.client_threads = value.parse().map_err(bad)?,
                "--server-threads" => parsed.server_threads = value.parse().map_err(bad)?,
                "--value" => parsed.value = value.parse().map_err(bad)?,
                "--set-ratios" => parsed.set_ratios = ratios(value).ok_or_else(usage)?,
                _ => return Err(usage()),
            }
        }
        if parsed.repeats == 0 || parsed.seconds == 0 || parsed.set_ratios.is_empty() {
            return Err(usage());
        }
        Ok(parsed)
    }
}

/// One server configuration measured.
struct Contender {
    name: &'static str,
    /// `None`: memcached; else montage-kv's backend, heap directory and whether it
    /// acknowledges before durability.
    montage: Option<(&'static str, PathBuf, bool)>,
}

/// `cargo xtask bench-kv`: memcaslap against memcached and montage-kv (module docs).
pub(crate) fn bench(args: &[String]) -> Result {
    if args.first().is_some_and(|a| a == "--evict") {
        return evict_bench(&args[1..]);
    }
    if args.first().is_some_and(|a| a == "--meta") {
        return meta_bench(&args[1..]);
    }
    let args = BenchArgs::parse(args)?;
    require("memcaslap", "libmemcached-tools")?;
    require("memcached", "memcached")?;
    cargo(&["build", "--release", "--package", "montage-kv"], &[])?;
    let binary = project_root().join("target/release/montage-kv");
    let disk = scratch("bench-kv")?;
    // tmpfs: the pmem backend's intended medium when there is no DAX device.
    let shm = Path::new("/dev/shm").join(format!("montage-bench-kv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shm);
    std::fs::create_dir_all(&shm).map_err(|e| format!("cannot create {}: {e}", shm.display()))?;
    let contenders = [
        Contender {
            name: "memcached",
            montage: None,
        },
        Contender {
            name: "montage-kv journal (default), durable replies",
            montage: Some(("journal", disk.clone(), false)),
        },
        Contender {
            name: "montage-kv pmem (tmpfs), durable replies",
            montage: Some(("pmem", shm.clone(), false)),
        },
        Contender {
            name: "montage-kv pmem (tmpfs), --ack-before-durable",
            montage: Some(("pmem", shm.clone(), true)),
        },
    ];
    let mut table = Vec::new();
    for &ratio in &args.set_ratios {
        let config = disk.join(format!("memcaslap-{ratio}.cfg"));
        write_memcaslap_config(&config, args.value, ratio)?;
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        // Interleaved: each repeat measures every contender once, so drift on this shared
        // machine spreads over all of them.
        for repeat in 0..args.repeats {
            for (contender, runs) in contenders.iter().zip(&mut runs) {
                let tps = measure(&binary, contender, &args, &config)?;
                println!(
                    "sets {ratio:.2}, repeat {}: {:<48} {tps:>10.0} ops/s",
                    repeat + 1,
                    contender.name
                );
                runs.push(tps);
            }
        }
        table.push((ratio, runs));
    }
    let _ = std::fs::remove_dir_all(&shm);
    let report = report(&args, &contenders, &mut table);
    println!("\n{report}");
    let out = project_root().join("target/bench-kv/results.md");
    std::fs::write(&out, &report).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("written to {}", out.display());
    Ok(())
}

fn median(runs: &mut [f64]) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// A memcaslap configuration: 64-byte keys, `value`-byte values, `sets` of the requests
/// sets and the rest gets.
fn write_memcaslap_config(path: &Path, value: u32, sets: f64) -> Result {
    let text = format!(
        "key\n64 64 1\nvalue\n{value} {value} 1\ncmd\n0 {sets}\n1 {}\n",
        1.0 - sets
    );
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// One memcaslap run against a freshly started server; returns its TPS.
fn measure(binary: &Path, contender: &Contender, args: &BenchArgs, config: &Path) -> Result<f64> {
    let threads = args.server_threads.to_string();
    let server = match &contender.montage {
        None => start_memcached(&threads, "2048")?,
        Some((backend, dir, ack_early)) => {
            let heap = dir.join("bench.heap");
            let _ = std::fs::remove_file(&heap);
            // The journal backend keeps one beside the heap file.
            let _ = std::fs::remove_file(dir.join("bench.heap.journal"));
            let mut extra = vec![
                "--backend",
                backend,
                "--threads",
                &threads,
                "--size",
                "2GiB",
            ];
            if *ack_early {
                extra.push("--ack-before-durable");
            }
            start_montage_kv(binary, &heap, &extra)?
        }
    };
    let output = Command::new("memcaslap")
        .arg(format!("--servers=127.0.0.1:{}", server.port))
        .arg(format!("--time={}s", args.seconds))
        .arg(format!("--threads={}", args.client_threads))
        .arg(format!("--concurrency={}", args.concurrency))
        .arg(format!("--cfg_cmd={}", config.display()))
        .output()
        .map_err(|e| format!("cannot run memcaslap: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let tps = text
        .lines()
        .rev()
        .find_map(|line| {
            let after = line.split("TPS: ").nth(1)?;
            after.split_whitespace().next()?.parse::<f64>().ok()
        })
        .ok_or_else(|| format!("no TPS in memcaslap's output:\n{text}"))?;
    // Error replies would make the throughput meaningless.
    if text.contains("SERVER_ERROR") || text.contains("CLIENT_ERROR") {
        return Err(format!("{} replied with errors:\n{text}", contender.name));
    }
    match contender.montage {
        None => drop(server),
        Some(_) => server.terminate()?,
    }
    Ok(tps)
}

/// Starts memcached with `threads` threads and a memory limit of `megabytes` MiB.
fn start_memcached(threads: &str, megabytes: &str) -> Result<Running> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let mut command = Command::new("memcached");
    command.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]);
    command.args(["-t", threads, "-m", megabytes, "-c", "4096"]);
    // memcached refuses to run as root unless told which user to be.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if root {
        command.args(["-u", "root"]);
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start memcached: {e}"))?;
    let running = Running { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("memcached did not start listening".to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(running)
}

/// The report: medians and ratios, then every run. `table` holds, per set ratio, each
/// contender's runs.
fn report(
    args: &BenchArgs,
    contenders: &[Contender],
    table: &mut [(f64, Vec<Vec<f64>>)],
) -> String {
    let machine = machine();
    let mut out = format!(
        "# montage-kv against memcached (memcaslap)\n\nMachine: {machine}.\n\
         memcaslap: {} s per run, {} client threads, concurrency {}, 64-byte keys, {}-byte \
         values; servers with {} threads; median of {} interleaved runs, each on a fresh \
         server (montage-kv on a new heap).\n\n",
        args.seconds,
        args.client_threads,
        args.concurrency,
        args.value,
        args.server_threads,
        args.repeats
    );
    let names: Vec<&str> = contenders.iter().map(|c| c.name).collect();
    out.push_str(&ratio_table(&names, "ops/s", table));
    out
}

/// A table of each contender's median (and its ratio to the first contender's) per set
/// ratio, then every run: `table` holds, per set ratio, each contender's runs (sorted here).
fn ratio_table(names: &[&str], unit: &str, table: &mut [(f64, Vec<Vec<f64>>)]) -> String {
    let mut out = String::from("| server | ");
    for (ratio, _) in table.iter() {
        let _ = write!(out, "{:.0}% sets: {unit} | vs memcached | ", ratio * 100.0);
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|---:|".repeat(table.len()));
    out.push('\n');
    let medians: Vec<Vec<f64>> = table
        .iter_mut()
        .map(|(_, runs)| runs.iter_mut().map(|r| median(r)).collect())
        .collect();
    for (i, name) in names.iter().enumerate() {
        let _ = write!(out, "| {name} | ");
        for medians in &medians {
            let _ = write!(
                out,
                "{:.0} | {:.2}x | ",
                medians[i],
                medians[i] / medians[0]
            );
        }
        out.push('\n');
    }
    let _ = write!(out, "\nEvery run ({unit}, sorted):\n\n");
    for (ratio, runs) in table.iter() {
        for (name, runs) in names.iter().zip(runs) {
            let runs: Vec<String> = runs.iter().map(|r| format!("{r:.0}")).collect();
            let _ = writeln!(
                out,
                "* {:.0}% sets, {name}: {}",
                ratio * 100.0,
                runs.join(", ")
            );
        }
    }
    out
}

/// Settings of a `bench-kv --evict` or `--meta` run.
struct LoadArgs {
    /// The memory limit (`--evict`), in MiB.
    memory_mib: u64,
    /// Distinct keys (`--evict` derives them from the limit unless given).
    keys: Option<u64>,
    value: u64,
    seconds: u64,
    warmup: u64,
    repeats: usize,
    connections: u32,
    server_threads: u32,
    set_ratios: Vec<f64>,
}

impl LoadArgs {
    /// `args` over `defaults`; `usage` names the command for the error.
    fn parse(args: &[String], defaults: LoadArgs, usage: &str) -> Result<LoadArgs> {
        let usage = || {
            format!(
                "usage: cargo xtask bench-kv {usage} [--memory MIB] [--keys N] [--value BYTES] \
                 [--seconds S] [--warmup S] [--repeats R] [--connections C] \
                 [--server-threads T] [--set-ratios 0.1,0.5]"
            )
        };
        let mut parsed = defaults;
        let mut rest = args.iter();
        while let Some(flag) = rest.next() {
            let value = rest.next().ok_or_else(usage)?;
            let number = || value.parse::<u64>().map_err(|_| usage());
            match flag.as_str() {
                "--memory" => parsed.memory_mib = number()?,
                "--keys" => parsed.keys = Some(number()?),
                "--value" => parsed.value = number()?,
                "--seconds" => parsed.seconds = number()?,
                "--warmup" => parsed.warmup = number()?,
                "--repeats" => parsed.repeats = usize::try_from(number()?).map_err(|_| usage())?,
                "--connections" => {
                    parsed.connections = u32::try_from(number()?).map_err(|_| usage())?;
                }
                "--server-threads" => {
                    parsed.server_threads = u32::try_from(number()?).map_err(|_| usage())?;
                }
                "--set-ratios" => parsed.set_ratios = ratios(value).ok_or_else(usage)?,
                _ => return Err(usage()),
            }
        }
        if parsed.repeats == 0
            || parsed.seconds == 0
            || parsed.memory_mib == 0
            || parsed.set_ratios.is_empty()
        {
            return Err(usage());
        }
        Ok(parsed)
    }

    /// The keys: as given, or enough that their items (a 24-byte key and the value) take
    /// four times the memory limit.
    fn keys(&self) -> u64 {
        self.keys
            .unwrap_or(4 * (self.memory_mib << 20) / (24 + self.value))
    }

    /// What each run does, at set ratio `set_ratio`.
    fn load(&self, set_ratio: f64, meta: bool) -> Load {
        Load {
            keys: self.keys(),
            value: self.value,
            connections: self.connections,
            warmup: self.warmup,
            seconds: self.seconds,
            set_ratio,
            meta,
        }
    }
}

/// One run of the cache-aside load: requests per second and hit ratio.
#[derive(Debug, Clone, Copy)]
struct LoadRun {
    requests_per_second: f64,
    hit_ratio: f64,
}

/// `cargo xtask bench-kv --evict`: `montage-kv-load` (a cache-aside client over a scrambled
/// Zipfian key distribution, whose items take four times the memory limit) against memcached
/// with `-m` the limit, montage-kv with `--size` the limit (so it evicts), and montage-kv with
/// room for every item (no eviction); interleaved, repeated, medians reported with the hit
/// ratio against memcached's and the throughput against montage-kv's own without eviction.
fn evict_bench(args: &[String]) -> Result {
    let defaults = LoadArgs {
        memory_mib: 64,
        keys: None,
        value: 1000,
        seconds: 10,
        warmup: 10,
        repeats: 3,
        connections: 32,
        server_threads: 2,
        set_ratios: vec![0.0],
    };
    let args = LoadArgs::parse(args, defaults, "--evict")?;
    let (server, load) = build_for_load()?;
    let disk = scratch("bench-kv")?;
    let memory = args.memory_mib.to_string();
    let limit = format!("{}MiB", args.memory_mib);
    // Room for every item, block and span overhead included.
    let roomy = format!("{}MiB", 8 * args.memory_mib);
    let contenders: [(&str, Option<&str>); 3] = [
        ("memcached", None),
        (
            "montage-kv, evicting (journal, durable replies)",
            Some(&limit),
        ),
        ("montage-kv, room for every item", Some(&roomy)),
    ];
    let threads = args.server_threads.to_string();
    let mut runs: Vec<Vec<LoadRun>> = vec![Vec::new(); contenders.len()];
    for repeat in 0..args.repeats {
        for ((name, size), runs) in contenders.iter().zip(&mut runs) {
            let running = match size {
                None => start_memcached(&threads, &memory)?,
                Some(size) => {
                    let heap = disk.join("evict.heap");
                    let _ = std::fs::remove_file(&heap);
                    let _ = std::fs::remove_file(disk.join("evict.heap.journal"));
                    let extra = ["--threads", &threads, "--size", size];
                    start_montage_kv(&server, &heap, &extra)?
                }
            };
            let run = run_load(&load, running.port, &args.load(0.0, false))?;
            println!(
                "repeat {}: {name:<48} {:>8.0} requests/s, hit ratio {:.4}",
                repeat + 1,
                run.requests_per_second,
                run.hit_ratio
            );
            runs.push(run);
            match size {
                None => drop(running),
                Some(_) => running.terminate()?,
            }
        }
    }
    let report = evict_report(&args, &contenders, &mut runs);
    println!("\n{report}");
    let out = project_root().join("target/bench-kv/evict.md");
    std::fs::write(&out, &report).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("written to {}", out.display());
    Ok(())
}

/// What one `montage-kv-load` run does.
struct Load {
    keys: u64,
    value: u64,
    connections: u32,
    warmup: u64,
    seconds: u64,
    set_ratio: f64,
    meta: bool,
}

/// One `montage-kv-load` run against the server on `port`.
fn run_load(load: &Path, port: u16, args: &Load) -> Result<LoadRun> {
    let mut command = Command::new(load);
    command
        .args(["--server", &format!("127.0.0.1:{port}")])
        .args(["--keys", &args.keys.to_string()])
        .args(["--value", &args.value.to_string()])
        .args(["--connections", &args.connections.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--seconds", &args.seconds.to_string()])
        .args(["--set-ratio", &args.set_ratio.to_string()]);
    if args.meta {
        command.arg("--meta");
    }
    let output = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", load.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "montage-kv-load failed: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let field = |name: &str| -> Result<f64> {
        text.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .ok_or_else(|| format!("no {name} in montage-kv-load's output: {text}"))
    };
    // A store refused for want of memory would make the hit ratio meaningless.
    if field("errors")? != 0.0 {
        return Err(format!("the server refused stores: {text}"));
    }
    Ok(LoadRun {
        requests_per_second: field("requests_per_second")?,
        hit_ratio: field("hit_ratio")?,
    })
}

/// The eviction benchmark's report: medians, ratios, then every run.
fn evict_report(
    args: &LoadArgs,
    contenders: &[(&str, Option<&str>)],
    runs: &mut [Vec<LoadRun>],
) -> String {
    let mut out = format!(
        "# montage-kv's eviction against memcached's (montage-kv-load)\n\nMachine: {}.\n\
         A cache-aside load (get; on a miss, set) over {} keys drawn from a scrambled Zipfian \
         distribution (0.99), {}-byte values: items of four times the {} MiB limit; {} \
         connections, {} s of warm-up, then {} s measured; servers with {} threads; median \
         of {} interleaved runs, each on a fresh server.\n\n\
         | server | requests/s | hit ratio | hit ratio vs memcached | requests/s vs no eviction |\n\
         |---|---:|---:|---:|---:|\n",
        machine(),
        args.keys(),
        args.value,
        args.memory_mib,
        args.connections,
        args.warmup,
        args.seconds,
        args.server_threads,
        args.repeats
    );
    let medians: Vec<(f64, f64)> = runs
        .iter()
        .map(|runs| {
            let mut rates: Vec<f64> = runs.iter().map(|r| r.requests_per_second).collect();
            let mut ratios: Vec<f64> = runs.iter().map(|r| r.hit_ratio).collect();
            (median(&mut rates), median(&mut ratios))
        })
        .collect();
    for (i, (name, _)) in contenders.iter().enumerate() {
        let (rate, hits) = medians[i];
        let _ = writeln!(
            out,
            "| {name} | {rate:.0} | {hits:.4} | {:.3}x | {:.2}x |",
            hits / medians[0].1,
            rate / medians[2].0
        );
    }
    out.push_str("\nEvery run (requests/s, hit ratio):\n\n");
    for ((name, _), runs) in contenders.iter().zip(runs.iter()) {
        let runs: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.0} ({:.4})", r.requests_per_second, r.hit_ratio))
            .collect();
        let _ = writeln!(out, "* {name}: {}", runs.join(", "));
    }
    out
}

/// The CPU model, its count and the kernel, for a report.
fn machine() -> String {
    Command::new("sh")
        .args([
            "-c",
            "echo \"$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, \
             Linux $(uname -r)\"",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Builds the server and the load generator, optimised; returns their paths. Needs
/// memcached, which the load benchmarks compare with.
fn build_for_load() -> Result<(PathBuf, PathBuf)> {
    require("memcached", "memcached")?;
    cargo(&["build", "--release", "--package", "montage-kv"], &[])?;
    cargo(
        &[
            "build",
            "--release",
            "--package",
            "montage-bench",
            "--bin",
            "montage-kv-load",
        ],
        &[],
    )?;
    let release = project_root().join("target/release");
    Ok((release.join("montage-kv"), release.join("montage-kv-load")))
}

/// `cargo xtask bench-kv --meta`: `montage-kv-load --meta` (`mg` and `ms`; a miss is stored
/// after it; `--set-ratios` of the requests are stores) against memcached and montage-kv
/// (durable replies, the default, and `--ack-before-durable`), every key fitting in memory;
/// interleaved, repeated, medians and ratios to memcached's.
fn meta_bench(args: &[String]) -> Result {
    let defaults = LoadArgs {
        memory_mib: 2048,
        keys: Some(100_000),
        value: 256,
        seconds: 5,
        warmup: 3,
        repeats: 3,
        connections: 32,
        server_threads: 2,
        set_ratios: vec![0.1, 0.5],
    };
    let args = LoadArgs::parse(args, defaults, "--meta")?;
    let (server, load) = build_for_load()?;
    let disk = scratch("bench-kv")?;
    let threads = args.server_threads.to_string();
    let contenders: [(&str, Option<bool>); 3] = [
        ("memcached", None),
        ("montage-kv (journal), durable replies", Some(false)),
        ("montage-kv (journal), --ack-before-durable", Some(true)),
    ];
    let mut table = Vec::new();
    for &ratio in &args.set_ratios {
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        for repeat in 0..args.repeats {
            for ((name, ack_early), runs) in contenders.iter().zip(&mut runs) {
                let running = match ack_early {
                    None => start_memcached(&threads, "2048")?,
                    Some(ack_early) => {
                        let heap = disk.join("meta.heap");
                        let _ = std::fs::remove_file(&heap);
                        let _ = std::fs::remove_file(disk.join("meta.heap.journal"));
                        let mut extra = vec!["--threads", &threads, "--size", "2GiB"];
                        if *ack_early {
                            extra.push("--ack-before-durable");
                        }
                        start_montage_kv(&server, &heap, &extra)?
                    }
                };
                let run = run_load(&load, running.port, &args.load(ratio, true))?;
                println!(
                    "sets {ratio:.2}, repeat {}: {name:<44} {:>8.0} requests/s",
                    repeat + 1,
                    run.requests_per_second
                );
                runs.push(run.requests_per_second);
                match ack_early {
                    None => drop(running),
                    Some(_) => running.terminate()?,
                }
            }
        }
        table.push((ratio, runs));
    }
    let mut out = format!(
        "# montage-kv's meta protocol against memcached's (montage-kv-load --meta)\n\n\
         Machine: {}.\n`mg <key> v` over {} keys from a scrambled Zipfian distribution (0.99), \
         `ms` of {}-byte values after a miss and for the set ratio's share of requests; {} \
         connections, {} s of warm-up, then {} s measured; servers with {} threads; median of \
         {} interleaved runs, each on a fresh server.\n\n",
        machine(),
        args.keys(),
        args.value,
        args.connections,
        args.warmup,
        args.seconds,
        args.server_threads,
        args.repeats
    );
    let names: Vec<&str> = contenders.iter().map(|(name, _)| *name).collect();
    out.push_str(&ratio_table(&names, "requests/s", &mut table));
    println!("\n{out}");
    let path = project_root().join("target/bench-kv/meta.md");
    std::fs::write(&path, &out).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

/// A comma-separated list of ratios between 0 and 1.
fn ratios(list: &str) -> Option<Vec<f64>> {
    list.split(',')
        .map(|r| r.parse::<f64>().ok().filter(|r| (0.0..=1.0).contains(r)))
        .collect()
}
