//! The server: connections, replies, statistics and shutdown.
//!
//! # Concurrency
//!
//! As in memcached, each worker thread (`--threads` of them) runs an event loop of its own:
//! a single-threaded tokio runtime that owns the connections handed to it. The listener runs
//! on the caller's runtime and hands each new connection to the worker serving the fewest.
//! A connection is a task on its worker's runtime, and stays there: it reads what its client
//! sent, runs every complete request in it against the [`Store`](crate::store::Store) on the
//! worker (a map operation takes microseconds and never waits for I/O, so it need not leave
//! the worker), and writes the replies in one go. Many idle connections therefore cost a task
//! and two buffers each, not a thread.
//!
//! Why not one work-stealing runtime for all connections: on a machine whose cores the
//! clients share, the workers of such a runtime wake each other to share out every batch of
//! ready sockets, and connections move between cores. A worker per core that keeps its
//! connections costs less CPU per request: measured with `cargo xtask bench-kv --meta`, it
//! serves a fifth more requests read-heavy, the same write-heavy (docs/PERFORMANCE.md).
//!
//! The only blocking step, `sync`, runs on the group-commit thread ([`Committer`]): a
//! connection whose replies acknowledge writes awaits its round there, and the workers go on
//! serving other connections meanwhile. Concurrent connections share rounds, so the cost
//! of durability is paid once per round, not once per write.
//!
//! One write does wait on its worker, and so holds up the worker's other connections: one
//! that finds the heap full, whose eviction waits for the clock to give the freed blocks back
//! (a few epoch advances, each a write-back). Each eviction frees room for the next writes
//! too (1/256 of the heap's limit), so this happens once per a few hundred writes of a full
//! heap, not per write.
//!
//! # The durability rule
//!
//! A reply to a command that changes the cache (`set` and the other storage commands,
//! `delete`, `incr`/`decr`, `touch`, `flush_all`, and the meta commands `ms`, `md`, `ma`,
//! and `mg` when it sets an expiry, creates the item or marks a win) is sent only after a `sync` that began
//! after the command ran has returned: once the client has read `STORED`, a crash cannot lose
//! the write. This holds for every reply of such a command, `NOT_STORED` and `EXISTS`
//! included, since they too report a state the client may act on. Replies in a pipeline
//! stay in order, so the replies after such a command wait with it.
//!
//! Reads do not wait: a `get` may return a value whose writer has not yet heard back, and a
//! crash may lose that value (the writer was never told it was stored). With
//! [`Options::ack_before_durable`] no reply waits; writes still become durable within two
//! epochs of the background clock, but a crash can lose writes the client was told were
//! stored.
//!
//! # Bounded resources
//!
//! * At most [`Options::max_connections`] connections; a client beyond that is told
//!   `SERVER_ERROR too many open connections` and disconnected.
//! * A connection buffers at most one request's line and value beyond what it has read
//!   (the [`Limits`]); oversized values are refused and their bytes discarded unread. Buffers
//!   grown for a large value or reply shrink back once it is done.
//! * Replies are written once [`OUT_HIGH`] bytes have built up, even inside a multi-get, and
//!   a connection reads no more input until its replies are written: a client that does not
//!   read its replies stalls only itself.
//!
//! # Shutdown
//!
//! When the shutdown future resolves, the listener closes and every connection finishes the
//! requests it has read, sends their replies (after their sync) and closes. Connections
//! still busy after [`GRACE`] are dropped without replies. The caller then closes the heap,
//! which makes everything durable and marks the heap cleanly closed.

use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use montage_core::Error;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::task::JoinSet;

use crate::cache::Cache;
use crate::commit::{Committer, Finished, SyncFailed};
use crate::meta::{self, Tally};
use crate::protocol::{self, Limits, Parsed, ProtocolError, Request, Skip, StoreMode};
use crate::store::{Lookup, Outcome, SystemClock};

/// Replies are written once this many bytes have built up.
pub const OUT_HIGH: usize = 64 << 10;

/// How long connections get to finish after shutdown begins.
pub const GRACE: Duration = Duration::from_secs(5);

/// How much a connection asks the kernel for per read.
const READ_CHUNK: usize = 16 << 10;

/// How a server behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Request size limits.
    pub limits: Limits,
    /// Reply before writes are durable (see the module docs).
    pub ack_before_durable: bool,
    /// The most connections served at once.
    pub max_connections: usize,
    /// Worker threads, each with the connections it serves (at least one).
    pub threads: usize,
    /// The time recovery took (reported by `stats`).
    pub recovery: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            ack_before_durable: false,
            max_connections: 1024,
            threads: 1,
            recovery: Duration::ZERO,
        }
    }
}

/// Serves `cache` on `listener` until `shutdown` resolves, then lets connections finish
/// (module docs). The listener runs on the caller's runtime, the connections on
/// [`Options::threads`] worker threads of their own. Returns once every connection task has
/// ended and the worker and group-commit threads have stopped, so the caller then holds the
/// only reference to `cache` it handed out.
///
/// # Errors
///
/// The worker or group-commit threads could not be started.
pub async fn serve(
    listener: TcpListener,
    cache: Arc<Cache>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let syncing = Arc::clone(&cache);
    let committer = Committer::start(move || syncing.heap().sync())?;
    let workers = Workers::start(options.threads.max(1), &committer)?;
    let port = listener.local_addr().map_or(0, |a| a.port());
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let shared = Arc::new(Shared {
        cache,
        committer,
        stats: Stats::default(),
        options,
        started: Instant::now(),
        port,
    });
    let (stop, stopping) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    admit(stream, &shared, &workers, &permits, &stopping, &mut tasks);
                }
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    eprintln!("montage-kv: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    // A send fails only when no connection is listening, which needs no stop.
    let _ = stop.send(true);
    let finished =
        tokio::time::timeout(GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        eprintln!(
            "montage-kv: {} connections still busy after {GRACE:?}; dropping them",
            tasks.len()
        );
        tasks.shutdown().await;
    }
    // Every connection has ended: the workers have nothing left to run.
    drop(workers);
    // Every task has ended, so this is the last reference: dropping it stops the committer
    // (after any owed round) and releases its hold on the cache.
    drop(shared);
    Ok(())
}

/// The worker threads, each running a single-threaded runtime (module docs).
struct Workers {
    workers: Vec<Worker>,
    /// Where the search for the least busy worker starts, so that ties go round.
    next: AtomicUsize,
}

struct Worker {
    runtime: Handle,
    /// Finished commit rounds, relayed within the worker's event loop.
    finished: Finished,
    /// Connections the worker serves now.
    serving: Arc<AtomicUsize>,
    /// Ends the worker's runtime, with whatever tasks it still holds.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers, each with a relay of `committer`'s finished rounds.
    fn start(count: usize, committer: &Committer) -> std::io::Result<Workers> {
        let mut workers = Workers {
            workers: Vec::with_capacity(count),
            next: AtomicUsize::new(0),
        };
        for i in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            let handle = runtime.handle().clone();
            let (finished, relay) = committer.relay();
            handle.spawn(relay);
            let thread = std::thread::Builder::new()
                .name(format!("montage-kv-worker-{i}"))
                .spawn(move || {
                    // A receive error means the sender went away: stop all the same.
                    let _ = runtime.block_on(stopped);
                })?;
            workers.workers.push(Worker {
                runtime: handle,
                finished,
                serving: Arc::default(),
                stop: Some(stop),
                thread: Some(thread),
            });
        }
        Ok(workers)
    }

    /// The worker serving the fewest connections.
    fn least_busy(&self) -> &Worker {
        // ORDERING: a heuristic; a stale count only makes the choice less even.
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.workers.len();
        (0..count)
            .map(|i| &self.workers[(start + i) % count])
            .min_by_key(|worker| worker.serving.load(Ordering::Relaxed))
            .unwrap_or_else(|| unreachable!("there is at least one worker"))
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            if let Some(stop) = worker.stop.take() {
                // An error means the runtime already ended, which is what is asked.
                let _ = stop.send(());
            }
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                // A connection task's panic stays in its task; a join error would be a bug
                // of the runtime's own, with nothing left to clean up here.
                let _ = thread.join();
            }
        }
    }
}

/// Counts a connection on its worker while it lives.
struct Serving(Arc<AtomicUsize>);

impl Serving {
    fn new(count: &Arc<AtomicUsize>) -> Serving {
        // ORDERING: a heuristic's count (see `least_busy`).
        count.fetch_add(1, Ordering::Relaxed);
        Serving(Arc::clone(count))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // ORDERING: as in `new`.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn admit(
    stream: TcpStream,
    shared: &Arc<Shared>,
    workers: &Workers,
    permits: &Arc<Semaphore>,
    stopping: &watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) {
    let stats = &shared.stats;
    if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
        // The socket leaves this runtime's event loop for its worker's.
        let Ok(stream) = stream.into_std() else {
            bump(&stats.rejected_connections);
            return;
        };
        bump(&stats.total_connections);
        bump(&stats.curr_connections);
        let worker = workers.least_busy();
        let serving = Serving::new(&worker.serving);
        let shared = Arc::clone(shared);
        let stopping = stopping.clone();
        let finished = worker.finished.clone();
        tasks.spawn_on(
            async move {
                let _serving = serving;
                match TcpStream::from_std(stream) {
                    Ok(stream) => connection(stream, &shared, stopping, finished, permit).await,
                    Err(_) => gone(&shared),
                }
            },
            &worker.runtime,
        );
    } else {
        bump(&stats.rejected_connections);
        // Best effort and without waiting: the client is told why, if its socket has room.
        let _ = stream.try_write(b"SERVER_ERROR too many open connections\r\n");
    }
}

/// What every connection shares.
struct Shared {
    cache: Arc<Cache>,
    committer: Committer,
    stats: Stats,
    options: Options,
    started: Instant,
    port: u16,
}

async fn connection(
    stream: TcpStream,
    shared: &Shared,
    mut stopping: watch::Receiver<bool>,
    finished: Finished,
    _permit: OwnedSemaphorePermit,
) {
    // Replies are written whole; Nagle would only delay them.
    let _ = stream.set_nodelay(true);
    let mut conn = Connection {
        out: Output {
            stream,
            buf: Vec::new(),
            owed: false,
            finished,
        },
        input: Vec::with_capacity(READ_CHUNK),
        skip: 0,
    };
    if let Err(End::SyncFailed) = conn.run(shared, &mut stopping).await {
        // The replies held back are not sent: their writes may not be durable.
        let _ = conn
            .out
            .stream
            .write_all(b"SERVER_ERROR writes could not be made durable\r\n")
            .await;
    }
    gone(shared);
}

/// Counts a connection that ended.
fn gone(shared: &Shared) {
    // ORDERING: a statistic.
    shared
        .stats
        .curr_connections
        .fetch_sub(1, Ordering::Relaxed);
}

/// Why a connection ends early.
enum End {
    /// The socket failed or the client went away.
    Io,
    /// A sync failed: replies that acknowledge writes cannot be sent.
    SyncFailed,
}

impl From<std::io::Error> for End {
    fn from(_: std::io::Error) -> Self {
        End::Io
    }
}

impl From<SyncFailed> for End {
    fn from(_: SyncFailed) -> Self {
        End::SyncFailed
    }
}

/// Whether to go on after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

struct Connection {
    out: Output,
    /// Bytes read and not yet parsed.
    input: Vec<u8>,
    /// Bytes still to discard (the rest of a refused value).
    skip: usize,
}

/// Replies waiting to be written, and the socket.
struct Output {
    stream: TcpStream,
    buf: Vec<u8>,
    /// `buf` acknowledges writes: it waits for a sync round.
    owed: bool,
    /// Where the connection hears that sync rounds finished: its worker's relay.
    finished: Finished,
}

impl Output {
    /// Writes the pending replies, after their sync round if they acknowledge writes.
    async fn flush(&mut self, shared: &Shared) -> Result<(), End> {
        if self.owed && !shared.options.ack_before_durable {
            shared.committer.wait_with(&mut self.finished).await?;
        }
        self.owed = false;
        if !self.buf.is_empty() {
            self.stream.write_all(&self.buf).await?;
            add(&shared.stats.bytes_written, self.buf.len());
            self.buf.clear();
            // A large reply's buffer is not kept for the connection's lifetime.
            self.buf.shrink_to(OUT_HIGH);
        }
        Ok(())
    }

    fn line(&mut self, line: &[u8]) {
        self.buf.extend_from_slice(line);
        self.buf.extend_from_slice(b"\r\n");
    }
}

impl Connection {
    async fn run(
        &mut self,
        shared: &Shared,
        stopping: &mut watch::Receiver<bool>,
    ) -> Result<(), End> {
        loop {
            let flow = self.handle_buffered(shared).await?;
            self.out.flush(shared).await?;
            if flow == Flow::Close || *stopping.borrow() {
                return Ok(());
            }
            // After a large value, give its buffer back: an idle connection holds at most
            // a few read chunks.
            if self.input.capacity() > 4 * READ_CHUNK && self.input.len() < READ_CHUNK {
                self.input.shrink_to(READ_CHUNK);
            }
            self.input.reserve(READ_CHUNK);
            let read = tokio::select! {
                read = self.out.stream.read_buf(&mut self.input) => read?,
                // A request half read when the server stops was never answered: dropping it
                // loses nothing that was acknowledged.
                _ = stopping.changed() => return Ok(()),
            };
            if read == 0 {
                return Ok(());
            }
            add(&shared.stats.bytes_read, read);
        }
    }

    /// Runs every complete request in the input.
    async fn handle_buffered(&mut self, shared: &Shared) -> Result<Flow, End> {
        let mut at = 0;
        let mut flow = Flow::Continue;
        while flow == Flow::Continue {
            if self.skip > 0 {
                let n = self.skip.min(self.input.len() - at);
                at += n;
                self.skip -= n;
                if self.skip > 0 {
                    break;
                }
            }
            match protocol::parse(&self.input[at..], &shared.options.limits) {
                Parsed::Incomplete => break,
                Parsed::Request(request, used) => {
                    flow = execute(shared, &mut self.out, request).await?;
                    at += used;
                }
                Parsed::Invalid {
                    error,
                    skip,
                    noreply,
                    unlink,
                } => {
                    if error == ProtocolError::TooLarge {
                        bump(&shared.stats.store_too_large);
                    }
                    if let Some(key) = unlink {
                        // A write like any other: the reply waits for its sync round.
                        match shared.cache.store().delete(&key) {
                            Ok(_) => self.out.owed = true,
                            Err(e) => server_error(&mut self.out, &e),
                        }
                    }
                    if !noreply {
                        self.out.buf.extend_from_slice(error.reply().as_bytes());
                    }
                    match skip {
                        Skip::Bytes(n) => self.skip = n,
                        Skip::Close => flow = Flow::Close,
                    }
                }
            }
            if self.out.buf.len() >= OUT_HIGH {
                self.out.flush(shared).await?;
            }
        }
        self.input.drain(..at);
        Ok(flow)
    }
}

/// Runs one request, appending its reply to `out`.
async fn execute(shared: &Shared, out: &mut Output, request: Request<'_>) -> Result<Flow, End> {
    let store = shared.cache.store();
    let stats = &shared.stats;
    match request {
        Request::Get {
            keys,
            with_cas,
            touch,
        } => return get(shared, out, &keys, with_cas, touch).await,
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            cas_unique,
            noreply,
        } => {
            bump(&stats.cmd_set);
            let result = store.store(mode, key, flags, exptime, data, cas_unique);
            if matches!(result, Ok(Outcome::Stored)) {
                bump(&stats.total_items);
            }
            if mode == StoreMode::Cas {
                match result {
                    Ok(Outcome::Stored) => bump(&stats.cas_hits),
                    Ok(Outcome::Exists) => bump(&stats.cas_badval),
                    Ok(Outcome::NotFound) => bump(&stats.cas_misses),
                    _ => {}
                }
            }
            written(out, result, noreply, stats);
        }
        Request::Delete { key, noreply } => {
            let result = store.delete(key);
            count(result.as_ref(), &stats.delete_hits, &stats.delete_misses);
            written(out, result, noreply, stats);
        }
        Request::Arith {
            incr,
            key,
            delta,
            noreply,
        } => {
            let result = store.arith(key, incr, delta);
            let (hits, misses) = if incr {
                (&stats.incr_hits, &stats.incr_misses)
            } else {
                (&stats.decr_hits, &stats.decr_misses)
            };
            count(result.as_ref(), hits, misses);
            written(out, result, noreply, stats);
        }
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            bump(&stats.cmd_touch);
            let result = store.touch(key, exptime);
            count(result.as_ref(), &stats.touch_hits, &stats.touch_misses);
            written(out, result, noreply, stats);
        }
        Request::FlushAll { delay, noreply } => {
            bump(&stats.cmd_flush);
            match store.flush_all(delay) {
                Ok(()) if noreply => {}
                Ok(()) => {
                    out.line(b"OK");
                    out.owed = true;
                }
                Err(e) => server_error(out, &e),
            }
        }
        Request::Version => {
            out.line(format!("VERSION {}", env!("CARGO_PKG_VERSION")).as_bytes());
        }
        Request::Stats { group } => stats_reply(shared, out, group),
        Request::Verbosity { noreply } => {
            if !noreply {
                out.line(b"OK");
            }
        }
        Request::Quit => return Ok(Flow::Close),
        Request::Meta(meta) => {
            let mut tally = |t| tally_meta(stats, t);
            match meta::execute(store, &meta, &mut out.buf, &mut tally) {
                Ok(wrote) => out.owed |= wrote,
                Err(e) => {
                    if matches!(e, Error::OutOfSpace { .. }) {
                        bump(&stats.store_no_memory);
                    }
                    server_error(out, &e);
                }
            }
        }
    }
    Ok(Flow::Continue)
}

/// Counts what a meta command did, in memcached's counters.
fn tally_meta(stats: &Stats, tally: Tally) {
    match tally {
        Tally::GetHit => {
            bump(&stats.cmd_get);
            bump(&stats.get_hits);
        }
        Tally::GetMiss => {
            bump(&stats.cmd_get);
            bump(&stats.get_misses);
        }
        Tally::GetExpired => bump(&stats.get_expired),
        Tally::GetFlushed => bump(&stats.get_flushed),
        Tally::TouchHit => {
            bump(&stats.cmd_touch);
            bump(&stats.touch_hits);
        }
        Tally::Set => bump(&stats.cmd_set),
        Tally::Stored => bump(&stats.total_items),
        Tally::CasHit => bump(&stats.cas_hits),
        Tally::CasBadval => bump(&stats.cas_badval),
        Tally::CasMiss => bump(&stats.cas_misses),
        Tally::DeleteHit => bump(&stats.delete_hits),
        Tally::DeleteMiss => bump(&stats.delete_misses),
        Tally::ArithHit(true) => bump(&stats.incr_hits),
        Tally::ArithHit(false) => bump(&stats.decr_hits),
        Tally::ArithMiss(true) => bump(&stats.incr_misses),
        Tally::ArithMiss(false) => bump(&stats.decr_misses),
        Tally::Debug => bump(&stats.cmd_meta),
    }
}

/// `get`, `gets`, `gat` or `gats` (`touch`, the new expiry): a reply line and data block
/// per live item, then `END`.
async fn get(
    shared: &Shared,
    out: &mut Output,
    keys: &[&[u8]],
    with_cas: bool,
    touch: Option<i64>,
) -> Result<Flow, End> {
    let stats = &shared.stats;
    for &key in keys {
        let (found, hits, misses) = match touch {
            None => {
                bump(&stats.cmd_get);
                // Why a get missed, as memcached counts it.
                let found = shared.cache.store().lookup(key).map(|lookup| match lookup {
                    Lookup::Hit(item) => Some(item),
                    Lookup::Miss => None,
                    Lookup::Expired => {
                        bump(&stats.get_expired);
                        None
                    }
                    Lookup::Flushed => {
                        bump(&stats.get_flushed);
                        None
                    }
                });
                (found, &stats.get_hits, &stats.get_misses)
            }
            Some(exptime) => {
                bump(&stats.cmd_touch);
                let found = shared.cache.store().get_and_touch(key, exptime);
                (found, &stats.touch_hits, &stats.touch_misses)
            }
        };
        match found {
            Ok(Some(item)) => {
                bump(hits);
                out.buf.extend_from_slice(b"VALUE ");
                out.buf.extend_from_slice(key);
                protocol::push_number(&mut out.buf, b" ", item.flags);
                protocol::push_number(&mut out.buf, b" ", item.data.len());
                if with_cas {
                    protocol::push_number(&mut out.buf, b" ", item.cas);
                }
                out.buf.extend_from_slice(b"\r\n");
                out.line(&item.data);
            }
            Ok(None) => bump(misses),
            Err(e) => {
                server_error(out, &e);
                return Ok(Flow::Continue);
            }
        }
        if out.buf.len() >= OUT_HIGH {
            out.flush(shared).await?;
        }
    }
    out.line(b"END");
    Ok(Flow::Continue)
}

/// The reply to a command that changes the cache; it waits for a sync round.
fn written(out: &mut Output, result: montage_core::Result<Outcome>, noreply: bool, stats: &Stats) {
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(e) => {
            if matches!(e, Error::OutOfSpace { .. }) {
                bump(&stats.store_no_memory);
            }
            // Replied even with noreply, as memcached does for errors.
            server_error(out, &e);
            return;
        }
    };
    if noreply {
        return;
    }
    match outcome {
        Outcome::Stored => out.line(b"STORED"),
        Outcome::NotStored => out.line(b"NOT_STORED"),
        Outcome::Exists => out.line(b"EXISTS"),
        Outcome::NotFound => out.line(b"NOT_FOUND"),
        Outcome::Deleted => out.line(b"DELETED"),
        Outcome::Touched => out.line(b"TOUCHED"),
        Outcome::Value(n) => out.line(n.to_string().as_bytes()),
        Outcome::NonNumeric => {
            out.line(b"CLIENT_ERROR cannot increment or decrement non-numeric value");
        }
    }
    out.owed = true;
}

fn server_error(out: &mut Output, e: &Error) {
    if matches!(e, Error::OutOfSpace { .. }) {
        out.line(b"SERVER_ERROR out of memory storing object");
    } else {
        // One line: an error's text never holds a line break, but make sure.
        let text = e.to_string().replace(['\r', '\n'], " ");
        out.line(format!("SERVER_ERROR {text}").as_bytes());
    }
}

/// Counts a hit (the command found its item) or a miss.
fn count(result: Result<&Outcome, &Error>, hits: &AtomicU64, misses: &AtomicU64) {
    match result {
        Ok(Outcome::NotFound) => bump(misses),
        Ok(_) => bump(hits),
        Err(_) => {}
    }
}

/// Defines the server's counters, each reported by `stats` under its field's name.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// The counters `stats` reports, as memcached names them.
        #[derive(Debug, Default)]
        struct Stats {
            $($(#[$doc])* $name: AtomicU64,)*
        }

        impl Stats {
            /// Every counter, by name.
            fn counters(&self) -> Vec<(&'static str, u64)> {
                // ORDERING: statistics.
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            /// `stats reset`: every counter but the live connections to zero.
            fn reset(&self) {
                $(
                    if stringify!($name) != "curr_connections" {
                        self.$name.store(0, Ordering::Relaxed);
                    }
                )*
            }
        }
    };
}

counters! {
    curr_connections,
    total_connections,
    rejected_connections,
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    bytes_read,
    bytes_written,
    /// Items stored (by the storage commands) since the start.
    total_items,
}

fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

fn add(counter: &AtomicU64, n: usize) {
    // ORDERING: a statistic.
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// The process's user and system CPU time, as `stats` shows them (seconds, six decimals;
/// zero where `/proc` cannot tell). Linux counts them in `/proc/self/stat` in ticks of
/// `USER_HZ`, a hundredth of a second on every architecture this server builds for.
fn rusage() -> (String, String) {
    const TICKS_PER_SECOND: u64 = 100;
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // The fields after the command name (which may hold spaces, inside parentheses):
            // state is the first, utime the 12th, stime the 13th.
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
        })
        .unwrap_or((0u64, 0u64));
    let time = |t: u64| {
        let micros = t * (1_000_000 / TICKS_PER_SECOND);
        format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
    };
    (time(ticks.0), time(ticks.1))
}

fn stats_reply(shared: &Shared, out: &mut Output, group: Option<&[u8]>) {
    let mut stat = |name: &str, value: &dyn std::fmt::Display| {
        let _ = write!(out.buf, "STAT {name} {value}\r\n");
    };
    match group {
        None => {
            let cache = &shared.cache;
            let heap = cache.heap();
            let now = crate::store::Clock::now(&SystemClock);
            stat("pid", &std::process::id());
            stat("uptime", &shared.started.elapsed().as_secs());
            stat("time", &now);
            stat("version", &env!("CARGO_PKG_VERSION"));
            stat("pointer_size", &(usize::BITS));
            let (user, system) = rusage();
            stat("rusage_user", &user);
            stat("rusage_system", &system);
            stat("max_connections", &shared.options.max_connections);
            for (name, value) in shared.stats.counters() {
                stat(name, &value);
            }
            stat("accepting_conns", &1);
            // The most the heap may grow to, as memcached's `-m`.
            stat("limit_maxbytes", &heap.max_size());
            stat("threads", &shared.options.threads);
            stat("curr_items", &cache.store().len());
            stat("bytes", &cache.store().bytes());
            stat("evictions", &cache.store().evictions());
            // What is ours: the heap, its recovery and its clock.
            stat(
                "heap_backend",
                &format!("{:?}", heap.backend()).to_lowercase(),
            );
            stat("recovery_time_us", &shared.options.recovery.as_micros());
            stat("epoch", &heap.epoch());
            // Recovery after a crash keeps every epoch up to two before the stored one.
            stat("durable_epoch", &heap.epoch().durable_cut());
            stat("sync_rounds", &shared.committer.rounds());
            stat(
                "ack_before_durable",
                &u8::from(shared.options.ack_before_durable),
            );
        }
        Some(b"settings") => {
            stat("maxconns", &shared.options.max_connections);
            stat("tcpport", &shared.port);
            stat("item_size_max", &shared.options.limits.max_value);
            stat("num_threads", &shared.options.threads);
            stat("cas_enabled", &"yes");
            stat("flush_enabled", &"yes");
            let evictions = if shared.cache.store().evicts() {
                "on"
            } else {
                "off"
            };
            stat("evictions", &evictions);
        }
        // We keep no slabs or per-size statistics: these groups are empty.
        Some(b"items" | b"slabs" | b"sizes" | b"conns") => {}
        Some(b"reset") => {
            shared.stats.reset();
            // memcached's `stats reset` clears its item statistics, evictions among them.
            shared.cache.store().reset_evictions();
            out.line(b"RESET");
            return;
        }
        Some(_) => {
            out.line(b"ERROR");
            return;
        }
    }
    out.line(b"END");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(workers: &Workers) -> Vec<usize> {
        workers
            .workers
            .iter()
            .map(|worker| worker.serving.load(Ordering::Relaxed))
            .collect()
    }

    #[test]
    fn connections_go_to_the_least_busy_worker() {
        let committer = Committer::start(|| Ok(())).unwrap();
        let workers = Workers::start(3, &committer).unwrap();
        let mut held: Vec<Serving> = (0..6)
            .map(|_| Serving::new(&workers.least_busy().serving))
            .collect();
        assert_eq!(counts(&workers), [2, 2, 2]);
        // The first worker's connections end: the next two go there.
        let first = &workers.workers[0].serving;
        held.retain(|serving| !Arc::ptr_eq(&serving.0, first));
        assert_eq!(counts(&workers), [0, 2, 2]);
        for _ in 0..2 {
            let worker = workers.least_busy();
            assert!(Arc::ptr_eq(&worker.serving, first));
            held.push(Serving::new(&worker.serving));
        }
        assert_eq!(counts(&workers), [2, 2, 2]);
        drop(held);
        assert_eq!(counts(&workers), [0, 0, 0]);
    }

    #[test]
    fn a_task_runs_on_its_worker_and_the_workers_stop_when_dropped() {
        let committer = Committer::start(|| Ok(())).unwrap();
        let workers = Workers::start(2, &committer).unwrap();
        let worker = workers.least_busy();
        let name = worker
            .runtime
            .block_on(
                worker
                    .runtime
                    .spawn(async { std::thread::current().name().map(str::to_owned) }),
            )
            .unwrap();
        assert!(name.is_some_and(|name| name.starts_with("montage-kv-worker-")));
        let runtime = workers.workers[1].runtime.clone();
        // Returns once every worker thread has ended.
        drop(workers);
        // Its runtime is gone: a task handed to it is cancelled, not run.
        let probe = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let joined = probe.block_on(runtime.spawn(async { 1 }));
        assert!(joined.is_err_and(|e| e.is_cancelled()));
    }
}
