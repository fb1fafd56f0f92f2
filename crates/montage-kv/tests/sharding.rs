//! Scaling out behind an existing proxy: three `montage-kv` servers behind twemproxy
//! (`nutcracker`, Debian's package, which `.ci/run` installs; where it is missing the test
//! says so and passes without running), ketama over `fnv1a_64`, as README's "Scaling out"
//! configures it. Writes go through the proxy while one server is killed with SIGKILL and
//! restarted on its heap; afterwards every write the proxy acknowledged reads back through it,
//! with a client library (the `memcache` crate), and each server holds its share of the keys.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

/// A running nutcracker.
struct Proxy {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The configuration README's "Scaling out" gives, for these servers and this listening
/// address.
fn configuration(listen: SocketAddr, servers: &[SocketAddr]) -> String {
    let mut conf = format!(
        "montage:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  \
         timeout: 2000\n  auto_eject_hosts: false\n  servers:\n"
    );
    for (i, server) in servers.iter().enumerate() {
        let _ = writeln!(conf, "   - {server}:1 kv{i}");
    }
    conf
}

/// Starts nutcracker on `conf` (written to `dir`) and waits until it accepts connections.
fn start_proxy(binary: &Path, dir: &Path, listen: SocketAddr, servers: &[SocketAddr]) -> Proxy {
    let conf = dir.join("nutcracker.yml");
    std::fs::write(&conf, configuration(listen, servers)).unwrap();
    let child = Command::new(binary)
        .arg("-c")
        .arg(&conf)
        .args(["-s", &common::free_port().to_string(), "-a", "127.0.0.1"])
        .arg("-o")
        .arg(dir.join("nutcracker.log"))
        .arg("-p")
        .arg(dir.join("nutcracker.pid"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(listen).is_err() {
        assert!(Instant::now() < deadline, "nutcracker did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Proxy {
        child,
        addr: listen,
    }
}

/// A `memcache` client library connection through the proxy.
fn client(proxy: &Proxy) -> memcache::Client {
    let client =
        memcache::Client::connect(format!("memcache://{}?protocol=ascii", proxy.addr)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    client
}

const KEYS: u64 = 3_000;

#[test]
fn acknowledged_writes_through_nutcracker_survive_a_sigkilled_shard() {
    let Some(binary) = common::installed("nutcracker") else {
        eprintln!(
            "skipped: nutcracker is not installed (apt-get install nutcracker); the sharding \
             test needs the real proxy"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let heaps: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("kv{i}.heap")))
        .collect();
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], common::free_port())))
        .collect();
    let start = |i: usize| {
        let listen = addrs[i].to_string();
        Server::start(&heaps[i], &["--listen", &listen])
    };
    let mut servers: Vec<Option<Server>> = (0..3).map(|i| Some(start(i))).collect();
    let listen = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let proxy = start_proxy(&binary, dir.path(), listen, &addrs);
    let value = |key: u64| format!("value of {key}");

    // Writes through the proxy, over one connection in the text protocol; the second server
    // dies with SIGKILL a third of the way through and comes back on its heap at two thirds.
    // A write counts as acknowledged only if the proxy answered STORED. (A pooling client
    // library would not do here: the `memcache` crate checks each pooled connection with
    // `version` before using it, and nutcracker sends `version` to one server, so every
    // request fails while that server is down; README's "Scaling out" says so.)
    let mut writer = TcpStream::connect(proxy.addr).unwrap();
    writer
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for key in 0..KEYS {
        if key == KEYS / 3 {
            servers[1].take().unwrap().kill();
        }
        if key == 2 * KEYS / 3 {
            servers[1] = Some(start(1));
        }
        let value = value(key);
        let request = format!("set k{key} 0 0 {}\r\n{value}\r\n", value.len());
        match &common::exchange(&mut writer, request.as_bytes(), b"\r\n")[..] {
            b"STORED\r\n" => acknowledged.push(key),
            reply => {
                assert!(reply.starts_with(b"SERVER_ERROR"), "{reply:?}");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "no write went to the killed server while it was down"
    );
    assert!(acknowledged.len() as u64 > KEYS / 2);

    // Every acknowledged write reads back through the proxy.
    let reader = client(&proxy);
    let lost: Vec<u64> = acknowledged
        .iter()
        .copied()
        .filter(|&key| {
            reader.get::<String>(&format!("k{key}")).unwrap().as_deref() != Some(&value(key))
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, the first {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );

    // Each server holds its share, and together the acknowledged keys and at most the one
    // write that was in flight when the server died (stored, but not answered).
    let shares: Vec<usize> = servers
        .iter()
        .map(|server| {
            server.as_ref().unwrap().stats()["curr_items"]
                .parse()
                .unwrap()
        })
        .collect();
    assert!(shares.iter().all(|&share| share > 0), "{shares:?}");
    let held = shares.iter().sum::<usize>();
    eprintln!(
        "{} writes acknowledged, {refused} refused while a server was down; items per server \
         {shares:?}",
        acknowledged.len()
    );
    assert!(
        (acknowledged.len()..=acknowledged.len() + 1).contains(&held),
        "{held} items for {} acknowledged writes ({shares:?})",
        acknowledged.len()
    );
}
