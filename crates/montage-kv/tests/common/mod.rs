//! Starting and stopping the real `montage-kv` binary for the integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How long a server may take to start (recovery included) or stop.
const PATIENCE: Duration = Duration::from_secs(60);

/// The server on `heap`, on a free port of the loopback interface unless `extra` names one.
fn command(heap: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_montage-kv"));
    command.arg("--heap").arg(heap);
    if !extra.contains(&"--listen") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    command
}

/// A running server process.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The server's standard error, line by line, read by a thread.
    log: Receiver<String>,
    /// Every line read from `log` so far.
    pub(crate) lines: Vec<String>,
}

impl Server {
    /// Starts the server on `heap` on a free port, with `extra` arguments, and waits until
    /// it listens.
    pub(crate) fn start(heap: &Path, extra: &[&str]) -> Server {
        let mut command = command(heap, extra);
        if !extra.contains(&"--size") {
            command.args(["--size", "64MiB"]);
        }
        let mut child = command
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the montage-kv binary starts");
        let stderr = child.stderr.take().unwrap();
        let (send, log) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            lines: Vec::new(),
        };
        let line = server.wait_for("listening on ");
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap();
        server.addr = addr.parse().unwrap();
        server
    }

    /// Runs the server on `heap` expecting it to refuse to start; returns what it said.
    pub(crate) fn refused(heap: &Path) -> String {
        let output = command(heap, &[]).output().unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Waits for a line of the server's log holding `needle`, and returns it.
    pub(crate) fn wait_for(&mut self, needle: &str) -> String {
        if let Some(line) = self.lines.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    self.lines.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {needle:?} from the server; it said {:?}", self.lines)
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "the server ended without {needle:?}; it said {:?}",
                    self.lines
                ),
            }
        }
    }

    /// A `memcache` client library connection, over the text protocol.
    pub(crate) fn client(&self) -> memcache::Client {
        let client =
            memcache::Client::connect(format!("memcache://{}?protocol=ascii", self.addr)).unwrap();
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client
    }

    /// A raw connection.
    pub(crate) fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream
    }

    /// The general `stats`, by name. (Read over a raw socket: the `memcache` crate's text
    /// protocol `stats` stops at the first line.)
    pub(crate) fn stats(&self) -> std::collections::HashMap<String, String> {
        let reply = exchange(&mut self.connect(), b"stats\r\n", b"END\r\n");
        String::from_utf8(reply)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("STAT ")?.splitn(2, ' ');
                Some((words.next()?.to_owned(), words.next()?.to_owned()))
            })
            .collect()
    }

    /// Kills the server with SIGKILL: a crash.
    pub(crate) fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Asks the server to stop with SIGTERM and waits for it to exit.
    pub(crate) fn terminate(mut self) -> (ExitStatus, Vec<String>) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the server ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        };
        self.lines.extend(self.log.try_iter());
        (status, std::mem::take(&mut self.lines))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test that failed part-way must not leave a server behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `request` and reads until the reply ends with `end` (a whole number of replies).
pub(crate) fn exchange(stream: &mut TcpStream, request: &[u8], end: &[u8]) -> Vec<u8> {
    stream.write_all(request).unwrap();
    read_until(stream, end)
}

/// Reads until what was read ends with `end`.
pub(crate) fn read_until(stream: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut buf = [0; 4096];
    while !reply.ends_with(end) {
        let n = stream.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "connection closed after {:?}",
            String::from_utf8_lossy(&reply)
        );
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}

/// A free port on the loopback interface (for a server that must be told its port).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The program `name`, if installed: on the `PATH`, or in `/usr/sbin` or `/usr/bin`.
pub(crate) fn installed(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
