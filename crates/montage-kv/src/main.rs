//! `montage-kv`: a memcached-compatible cache server whose items survive crashes.
//!
//! ```text
//! cargo run --release -p montage-kv -- --heap cache.heap
//! ```
//!
//! See the crate's `server` module for how it serves and what it promises.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::{Parser, ValueEnum};

use montage_core::{BackendKind, HeapConfig};
use montage_kv::cache::Cache;
use montage_kv::protocol::Limits;
use montage_kv::server::{self, Options};

/// A memcached-compatible cache server on montage's persistent hash map: items survive
/// crashes, and a write's reply is sent only once the write is durable.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:11211")]
    listen: String,
    /// The heap file: opened and recovered if it exists, created otherwise.
    #[arg(long, default_value = "montage-kv.heap")]
    heap: PathBuf,
    /// The most the heap may grow to, in bytes (suffixes K, M, G, KiB, MiB, GiB allowed). A
    /// new heap starts at 64 MiB (or this, if smaller) and grows as items need room; at this
    /// size, writes evict the least recently used items (see `--disable-evictions`).
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    size: u64,
    /// How writes reach the medium.
    #[arg(long, value_enum, default_value_t = Backend::Journal)]
    backend: Backend,
    /// Reply to writes before they are durable: faster, but a crash can lose writes the
    /// clients were told were stored (they still become durable within a few epochs).
    #[arg(long)]
    ack_before_durable: bool,
    /// Worker threads serving connections, each with an event loop of its own that keeps the
    /// connections handed to it, as memcached's `-t` (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// The most connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Refuse writes when the heap is full (`SERVER_ERROR out of memory storing object`)
    /// instead of evicting the least recently used items, as memcached's `-M`.
    #[arg(short = 'M', long, visible_alias = "no-evict")]
    disable_evictions: bool,
    /// The largest value a client may store, in bytes (suffixes allowed, as for `--size`).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    max_value: u64,
}

/// Recovery of a heap with at least this many block headers to read logs its progress.
const LOG_RECOVERY_FROM: u64 = 1 << 22;

/// A recovery progress callback that logs a line at every tenth of a large heap's recovery.
fn log_recovery() -> impl Fn(montage_core::RecoveryProgress) + Send + Sync + 'static {
    let logged = AtomicU64::new(0);
    move |progress| {
        if let Some(line) = recovery_line(&logged, progress) {
            eprintln!("{line}");
        }
    }
}

/// The line to log for `progress`, if it is a large heap's recovery and reached a tenth not
/// logged yet (`logged` holds the last tenth logged).
fn recovery_line(logged: &AtomicU64, progress: montage_core::RecoveryProgress) -> Option<String> {
    if progress.total < LOG_RECOVERY_FROM {
        return None;
    }
    let tenths = progress.read.saturating_mul(10) / progress.total;
    // ORDERING: only which line is printed; the workers report in any order.
    let before = logged.fetch_max(tenths, Ordering::Relaxed);
    (tenths > before).then(|| {
        format!(
            "montage-kv: recovering: {}% of {} block headers read",
            tenths * 10,
            progress.total
        )
    })
}

/// The size a new heap starts at (it grows up to `--size`).
const INITIAL_SIZE: u64 = 64 << 20;

/// The heap's write-back backend.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    /// Persistent memory: a DAX file, or a file on tmpfs (cache-line write-back and fences).
    Pmem,
    /// An ordinary file on any file system, with a redo journal beside it: one sequential
    /// write and one device flush per group commit.
    Journal,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("montage-kv: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let backend = match cli.backend {
        Backend::Pmem => BackendKind::Pmem,
        Backend::Journal => BackendKind::Journal,
    };
    let config = HeapConfig::new(&cli.heap)
        .size(cli.size.min(INITIAL_SIZE))
        .max_size(cli.size)
        .backend(backend)
        .on_recovery_progress(log_recovery());
    let heap_name = cli.heap.display();
    let opened = Cache::open(&config).map_err(|e| format!("cannot open heap {heap_name}: {e}"))?;
    let cache = if cli.disable_evictions {
        opened.cache.without_evictions()
    } else {
        opened.cache
    };
    let cache = Arc::new(cache);
    let store = cache.store();
    if opened.created {
        eprintln!(
            "montage-kv: created heap {heap_name} ({} bytes, growing to at most {})",
            cache.heap().size(),
            cli.size
        );
    } else {
        let how = if opened.report.clean_shutdown {
            "after a clean shutdown"
        } else {
            "after a crash"
        };
        eprintln!(
            "montage-kv: recovered {} items ({} bytes) from {heap_name} {how} in {:.1} ms",
            store.len(),
            store.bytes(),
            opened.recovery.as_secs_f64() * 1e3
        );
    }
    if matches!(cli.backend, Backend::Pmem) && !cache.heap().is_dax() {
        eprintln!(
            "montage-kv: warning: {heap_name} is not on a DAX file system; with --backend pmem \
             writes survive a crash of this process but not a power failure unless the file \
             is on tmpfs, which survives neither a reboot"
        );
    }
    let threads = cli
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let options = Options {
        limits: Limits {
            max_value: usize::try_from(cli.max_value)
                .map_err(|_| "--max-value does not fit this machine".to_owned())?,
            ..Limits::default()
        },
        ack_before_durable: cli.ack_before_durable,
        max_connections: cli.max_connections.max(1),
        threads,
        recovery: opened.recovery,
    };
    // The listener's runtime; the connections run on the server's own worker threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&cli.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let shutdown = shutdown_signal().map_err(|e| format!("cannot handle signals: {e}"))?;
        eprintln!(
            "montage-kv: listening on {address} ({threads} threads, replies {})",
            if cli.ack_before_durable {
                "before writes are durable"
            } else {
                "after writes are durable"
            }
        );
        server::serve(listener, Arc::clone(&cache), options, shutdown)
            .await
            .map_err(|e| format!("cannot serve: {e}"))
    });
    drop(runtime);
    served?;
    let cache = Arc::try_unwrap(cache)
        .map_err(|_| "the cache is still in use after the server stopped".to_owned())?;
    cache
        .close()
        .map_err(|e| format!("closing the heap failed (it will recover as after a crash): {e}"))?;
    eprintln!("montage-kv: heap closed cleanly");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => eprintln!("montage-kv: SIGTERM, shutting down"),
            _ = int.recv() => eprintln!("montage-kv: SIGINT, shutting down"),
        }
    })
}

/// A byte count: digits, then optionally K/M/G (powers of 1000) or KiB/MiB/GiB (of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use K, M, G, KiB, MiB or GiB)"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_heaps_recovery_is_logged_at_each_tenth_once() {
        let logged = AtomicU64::new(0);
        let total = LOG_RECOVERY_FROM * 3;
        let lines: Vec<String> = [
            0,
            total / 20,
            total / 10,
            total / 10 + 5,
            total / 2,
            total / 3,
            total,
        ]
        .into_iter()
        .filter_map(|read| {
            let progress = montage_core::RecoveryProgress::new(read, total);
            recovery_line(&logged, progress)
        })
        .collect();
        let percents: Vec<&str> = lines
            .iter()
            .map(|line| line.split(' ').nth(2).unwrap())
            .collect();
        assert_eq!(percents, ["10%", "50%", "100%"]);
        assert!(lines[0].ends_with(&format!("of {total} block headers read")));
        // A small heap's recovery says nothing.
        let small = montage_core::RecoveryProgress::new(5, LOG_RECOVERY_FROM - 1);
        assert_eq!(recovery_line(&AtomicU64::new(0), small), None);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert!(parse_size("1 parsec").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }
}
