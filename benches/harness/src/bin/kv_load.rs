//! A cache-aside load on a memcached-protocol server, for `cargo xtask bench-kv --evict` and
//! `--meta`: each client reads a key drawn from a scrambled Zipfian distribution (YCSB's,
//! constant 0.99) and, on a miss, stores it, as an application in front of a database does;
//! with `--set-ratio`, that share of the requests are stores instead. It speaks the text
//! protocol (`get`, `set`) or the meta protocol (`mg`, `ms`). After a warm-up, it counts
//! requests, gets and hits for a fixed time and prints one line:
//!
//! ```text
//! requests=... gets=... hits=... sets=... errors=... seconds=... requests_per_second=... hit_ratio=...
//! ```
//!
//! `cargo run --release -p montage-bench --bin montage-kv-load -- --server 127.0.0.1:11211`
//! (`--help` lists the settings).

#![allow(clippy::print_stdout, clippy::print_stderr)]
// Rates and ratios: counts become floating point, far inside f64's exact range.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use rand_distr::{Distribution as _, Zipf};

#[path = "../scramble.rs"]
mod scramble;
use scramble::scramble;

/// A cache-aside Zipfian load on a memcached-protocol server.
#[derive(Debug, Parser)]
struct Cli {
    /// The server's address.
    #[arg(long)]
    server: String,
    /// Distinct keys.
    #[arg(long, default_value_t = 262_144)]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1000)]
    value: usize,
    /// Client connections, one thread each (a set waits for its durable reply).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Seconds of warm-up (not counted): the cache fills.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Seconds measured.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The Zipfian constant.
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// The share of requests that are stores (besides those after a miss).
    #[arg(long, default_value_t = 0.0)]
    set_ratio: f64,
    /// Speak the meta protocol (`mg`, `ms`) instead of the text protocol's `get` and `set`.
    #[arg(long)]
    meta: bool,
}

/// What the clients counted while measuring.
#[derive(Default)]
struct Counts {
    gets: AtomicU64,
    hits: AtomicU64,
    sets: AtomicU64,
    errors: AtomicU64,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("montage-kv-load: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let zipf = Zipf::new(cli.keys as f64, cli.zipf).map_err(|e| format!("bad --zipf: {e}"))?;
    let counts = Counts::default();
    let measuring = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let value = vec![b'v'; cli.value];
    let seconds = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..cli.connections)
            .map(|id| {
                let (counts, measuring, stop, value) = (&counts, &measuring, &stop, &value);
                let zipf = &zipf;
                scope.spawn(move || {
                    let stream = TcpStream::connect(&cli.server)
                        .map_err(|e| format!("cannot connect to {}: {e}", cli.server))?;
                    stream.set_nodelay(true).map_err(|e| e.to_string())?;
                    let mut client = Client::new(stream, cli.meta)?;
                    let mut rng = SmallRng::seed_from_u64(0x6b76_6c6f ^ id as u64);
                    while !stop.load(Ordering::Relaxed) {
                        let rank = zipf.sample(&mut rng) as u64 - 1;
                        let key = format!("key:{:020}", scramble(rank, cli.keys));
                        let write = rng.random_bool(cli.set_ratio.clamp(0.0, 1.0));
                        let hit = !write && client.get(&key)?;
                        let stored = if hit {
                            None
                        } else {
                            Some(client.set(&key, value)?)
                        };
                        // ORDERING: counters read after the threads are joined.
                        if measuring.load(Ordering::Relaxed) {
                            if !write {
                                counts.gets.fetch_add(1, Ordering::Relaxed);
                                counts.hits.fetch_add(u64::from(hit), Ordering::Relaxed);
                            }
                            if let Some(stored) = stored {
                                counts.sets.fetch_add(1, Ordering::Relaxed);
                                counts
                                    .errors
                                    .fetch_add(u64::from(!stored), Ordering::Relaxed);
                            }
                        }
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(cli.warmup));
        measuring.store(true, Ordering::Relaxed);
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs(cli.seconds));
        measuring.store(false, Ordering::Relaxed);
        let seconds = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for client in clients {
            client
                .join()
                .map_err(|_| "a client panicked".to_owned())??;
        }
        Ok::<f64, String>(seconds)
    })?;
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (gets, hits, sets, errors) = (
        load(&counts.gets),
        load(&counts.hits),
        load(&counts.sets),
        load(&counts.errors),
    );
    let requests = gets + sets;
    println!(
        "requests={requests} gets={gets} hits={hits} sets={sets} errors={errors} \
         seconds={seconds:.3} requests_per_second={:.0} hit_ratio={:.4}",
        requests as f64 / seconds,
        hits as f64 / gets.max(1) as f64
    );
    Ok(())
}

/// One connection, speaking the text protocol or the meta protocol.
struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    line: String,
    data: Vec<u8>,
    meta: bool,
}

impl Client {
    fn new(stream: TcpStream, meta: bool) -> Result<Client, String> {
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Client {
            writer,
            reader: BufReader::new(stream),
            line: String::new(),
            data: Vec::new(),
            meta,
        })
    }

    fn read_line(&mut self) -> Result<&str, String> {
        self.line.clear();
        match self.reader.read_line(&mut self.line) {
            Ok(0) => Err("the server closed the connection".to_owned()),
            Ok(_) => Ok(&self.line),
            Err(e) => Err(format!("cannot read a reply: {e}")),
        }
    }

    /// Whether `key` was found.
    fn get(&mut self, key: &str) -> Result<bool, String> {
        let (request, miss, value) = if self.meta {
            (format!("mg {key} v\r\n"), "EN\r\n", "VA ")
        } else {
            (format!("get {key}\r\n"), "END\r\n", "VALUE ")
        };
        self.writer
            .write_all(request.as_bytes())
            .map_err(|e| format!("cannot send: {e}"))?;
        let meta = self.meta;
        let line = self.read_line()?;
        if line == miss {
            return Ok(false);
        }
        // `VA <len>` or `VALUE <key> <flags> <len>`.
        let len: usize = line
            .strip_prefix(value)
            .and_then(|rest| rest.split_whitespace().nth(if meta { 0 } else { 2 }))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("unexpected reply to get: {line:?}"))?;
        self.data.resize(len + 2, 0);
        self.reader
            .read_exact(&mut self.data)
            .map_err(|e| format!("cannot read a value: {e}"))?;
        if !meta {
            let end = self.read_line()?;
            if end != "END\r\n" {
                return Err(format!("unexpected end of a get reply: {end:?}"));
            }
        }
        Ok(true)
    }

    /// Stores `key`; whether the server stored it (`false`: it replied with a server
    /// error, such as out of memory).
    fn set(&mut self, key: &str, value: &[u8]) -> Result<bool, String> {
        let mut request = if self.meta {
            format!("ms {key} {}\r\n", value.len())
        } else {
            format!("set {key} 0 0 {}\r\n", value.len())
        }
        .into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        self.writer
            .write_all(&request)
            .map_err(|e| format!("cannot send: {e}"))?;
        let line = self.read_line()?;
        match line {
            "STORED\r\n" | "HD\r\n" => Ok(true),
            error if error.starts_with("SERVER_ERROR") => Ok(false),
            other => Err(format!("unexpected reply to set: {other:?}")),
        }
    }
}
