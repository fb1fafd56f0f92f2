//! Crash test: clients write and delete keys, half of the time with the classic commands
//! (`set`, `delete`) and half with the meta ones (`ms`, `md`), and record what the server
//! acknowledged; the server is killed with SIGKILL at a random moment, restarted on the
//! same heap, and every acknowledged write must be there with its last acknowledged value.
//!
//! A write that was sent but not answered when the server died may or may not have
//! survived, so each key may read as its last acknowledged state or as the one write in
//! flight on it. Rounds run on one heap, so each restart also re-checks everything the
//! earlier rounds left. Every backend runs: the journal on a file, `pmem` on tmpfs; and the journal on the `montage-powercut` FUSE file system, where each SIGKILL is
//! followed by a power cut that loses every write no `fsync` covered (without `/dev/fuse` or
//! the right to mount, that test says so and skips).
//! `MONTAGE_KV_CRASH_ROUNDS` sets the number of rounds (default 10 per backend) and
//! `MONTAGE_KV_CRASH_SEED` the seed.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use common::Server;
use montage_core::sim::SplitMix64;

const CLIENTS: u64 = 4;
/// Keys per client with small values; large ones take 16 times as many.
const KEYS_PER_CLIENT: u64 = 64;

/// A key's state as a client can observe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    Absent,
    /// The value written by a write numbered so.
    Written(u64),
}

/// What one client knows of its keys.
#[derive(Debug, Clone, Copy)]
struct KeyState {
    acked: Val,
    in_flight: Option<Val>,
}

type Model = HashMap<String, KeyState>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().unwrap())
}

#[test]
fn every_acknowledged_write_survives_sigkill_on_a_journaled_file() {
    let dir = tempfile::tempdir().unwrap();
    crash_rounds(
        &dir.path().join("kv.heap"),
        &["--backend", "journal"],
        |_| {},
    );
}

#[test]
fn every_acknowledged_write_survives_a_power_cut_on_a_journaled_file() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = match montage_powercut::Mounted::mount(dir.path()) {
        Ok(mounted) => mounted,
        Err(e) => {
            eprintln!("skipped: cannot mount the power-cut file system: {e}");
            return;
        }
    };
    let heap = mounted.dir().join("kv.heap");
    let mut mounted = Some(mounted);
    // A small heap: the file system keeps the files in memory, twice.
    let args = ["--backend", "journal", "--size", "64MiB"];
    crash_rounds(&heap, &args, |rng| {
        let cut = mounted.take().unwrap().power_cut(rng.next_u64()).unwrap();
        mounted = Some(cut.remount().unwrap());
    });
}

/// A heap too small for the keys' values (32 MB of them, in 20 block sizes): writes evict.
/// A key may then read as absent (evicted) after a crash, but never as an older value than
/// its last acknowledged one.
#[test]
fn no_acknowledged_write_is_lost_but_to_eviction_on_a_full_heap() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--backend", "journal", "--size", "16MiB"];
    let evicted = crash_rounds_with(&dir.path().join("kv.heap"), &args, Values::Large, |_| {});
    assert!(evicted > 0, "no key was evicted: the heap never filled");
}

#[test]
fn every_acknowledged_write_survives_sigkill_on_pmem() {
    // tmpfs, the pmem backend's medium when there is no DAX device.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    crash_rounds(&dir.path().join("kv.heap"), &["--backend", "pmem"], |_| {});
}

/// The values the clients write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    /// Up to 200 bytes: the keys fit in any heap.
    Small,
    /// Up to 16,000 bytes, on 16 times as many keys: 32 MB in all, so a small heap evicts.
    Large,
}

/// Runs the crash rounds (module docs) on `heap`, the server started with `args`; `after_kill`
/// runs after each SIGKILL (a power cut, say).
fn crash_rounds(heap: &std::path::Path, args: &[&str], after_kill: impl FnMut(&mut SplitMix64)) {
    let evicted = crash_rounds_with(heap, args, Values::Small, after_kill);
    assert_eq!(evicted, 0, "keys went missing");
}

/// [`crash_rounds`] with `values`; returns how many times a key whose last acknowledged
/// state was a value read as absent (evicted: allowed only with [`Values::Large`]).
fn crash_rounds_with(
    heap: &std::path::Path,
    args: &[&str],
    values: Values,
    mut after_kill: impl FnMut(&mut SplitMix64),
) -> u64 {
    let rounds = env_u64("MONTAGE_KV_CRASH_ROUNDS", 10);
    let seed = env_u64("MONTAGE_KV_CRASH_SEED", 0x6b76_6372_6173_6821);
    eprintln!("crash test {args:?}: {rounds} rounds, seed {seed:#x}");
    let mut rng = SplitMix64::new(seed);
    let mut models: Vec<Model> = (0..CLIENTS)
        .map(|c| {
            let keys = match values {
                Values::Small => KEYS_PER_CLIENT,
                Values::Large => 16 * KEYS_PER_CLIENT,
            };
            (0..keys)
                .map(|k| {
                    let state = KeyState {
                        acked: Val::Absent,
                        in_flight: None,
                    };
                    (format!("c{c}-k{k}"), state)
                })
                .collect()
        })
        .collect();
    let mut next_write = 1;
    let mut evicted = 0;
    for round in 0..rounds {
        let mut server = Server::start(heap, args);
        if round > 0 {
            server.wait_for("after a crash");
            evicted += check(&server, &mut models, round, values);
        }
        let clients: Vec<_> = models
            .drain(..)
            .enumerate()
            .map(|(c, model)| {
                let stream = server.connect();
                let first = next_write + c as u64 * 1_000_000;
                let seed = rng.next_u64();
                std::thread::spawn(move || write_until_killed(stream, model, first, seed, values))
            })
            .collect();
        next_write += CLIENTS * 1_000_000;
        std::thread::sleep(Duration::from_millis(50 + rng.below_or_equal(350)));
        server.kill();
        after_kill(&mut rng);
        let mut acked = 0;
        for client in clients {
            let (model, count) = client.join().unwrap();
            acked += count;
            models.push(model);
        }
        eprintln!("round {round}: {acked} writes acknowledged before SIGKILL");
        assert!(acked > 0, "round {round}: the clients got no write through");
    }
    let server = Server::start(heap, args);
    evicted + check(&server, &mut models, rounds, values)
}

/// Every key reads as its last acknowledged state or its write in flight (or, with
/// [`Values::Large`], as absent: evicted); the state read becomes the acknowledged one.
/// Returns how many keys read as evicted.
fn check(server: &Server, models: &mut [Model], round: u64, values: Values) -> u64 {
    let mut stream = server.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut survived_in_flight = 0;
    let mut evicted = 0;
    for model in models.iter_mut() {
        for (key, state) in model.iter_mut() {
            let found = get(&mut stream, &mut reader, key);
            let gone = values == Values::Large && found == Val::Absent;
            let allowed = found == state.acked || Some(found) == state.in_flight || gone;
            assert!(
                allowed,
                "after crash {round}: {key} reads {found:?}, but its last acknowledged state \
                 is {:?} and the write in flight was {:?}",
                state.acked, state.in_flight
            );
            if found == state.acked {
            } else if gone {
                evicted += 1;
            } else {
                survived_in_flight += 1;
            }
            state.acked = found;
            state.in_flight = None;
        }
    }
    eprintln!(
        "after crash {round}: all keys as acknowledged; {survived_in_flight} unanswered writes \
         survived, {evicted} keys evicted"
    );
    evicted
}

fn get(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, key: &str) -> Val {
    stream
        .write_all(format!("get {key}\r\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    if line == "END\r\n" {
        return Val::Absent;
    }
    assert!(line.starts_with(&format!("VALUE {key} ")), "{line:?}");
    let mut data = String::new();
    reader.read_line(&mut data).unwrap();
    let mut end = String::new();
    reader.read_line(&mut end).unwrap();
    assert_eq!(end, "END\r\n");
    let n = data.trim_end().rsplit('-').next().unwrap();
    Val::Written(n.parse().unwrap())
}

/// Sets and deletes this client's keys, one request at a time, until the server dies.
/// Returns the model and how many writes were acknowledged.
fn write_until_killed(
    stream: TcpStream,
    mut model: Model,
    first: u64,
    seed: u64,
    values: Values,
) -> (Model, u64) {
    let mut rng = SplitMix64::new(seed);
    let mut keys: Vec<String> = model.keys().cloned().collect();
    keys.sort();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut acked = 0;
    for n in first.. {
        let key = &keys[rng.below_or_equal(keys.len() as u64 - 1) as usize];
        let delete = rng.below_or_equal(4) == 0;
        let meta = rng.below_or_equal(1) == 0;
        let (request, new) = if delete {
            let request = if meta {
                format!("md {key}\r\n")
            } else {
                format!("delete {key}\r\n")
            };
            (request, Val::Absent)
        } else {
            // Values of varied sizes, ending in the write's number.
            let most = match values {
                Values::Small => 200,
                Values::Large => 16_000,
            };
            let pad = "x".repeat(rng.below_or_equal(most) as usize);
            let value = format!("{pad}-{n}");
            let request = if meta {
                format!("ms {key} {}\r\n{value}\r\n", value.len())
            } else {
                format!("set {key} 0 0 {}\r\n{value}\r\n", value.len())
            };
            (request, Val::Written(n))
        };
        let state = model.get_mut(key).unwrap();
        state.in_flight = Some(new);
        if writer.write_all(request.as_bytes()).is_err() {
            break;
        }
        let mut reply = String::new();
        match reader.read_line(&mut reply) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match reply.as_str() {
            "STORED\r\n" | "DELETED\r\n" | "NOT_FOUND\r\n" | "HD\r\n" | "NF\r\n" => {
                state.acked = new;
                state.in_flight = None;
                acked += 1;
            }
            // The server died mid-reply; the write is in flight.
            partial if !partial.ends_with("\r\n") => break,
            other => panic!("unexpected reply {other:?} to {request:?}"),
        }
    }
    (model, acked)
}
