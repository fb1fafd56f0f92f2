//! Differential tests against memcached itself: the real server (Debian's `memcached`
//! package, which `.ci/run` installs; where it is missing the tests say so and pass without
//! running) and `montage-kv` are sent the same request scripts, hand-written edge cases and
//! generated ones (proptest), and their replies must be the same bytes, but for the
//! intended differences below.
//!
//! Each script goes over a connection of its own, written whole and then half-closed, and
//! the reply is everything read until the server closes: every reply to every request, in
//! order. Each script uses keys of its own (a prefix unique to it), so scripts do not see
//! each other's items.
//!
//! # Intended differences
//!
//! * `VERSION`: each server gives its own version (normalised to `VERSION #`).
//! * CAS uniques: each server numbers its items in its own way, so the unique in a `gets`
//!   or `gats` reply is normalised to `#` (that a unique changes when the item does is
//!   checked by the other tests).
//! * `version` and `quit` with arguments: memcached 1.6 ignores the arguments; `montage-kv`,
//!   whose version number is below 1.6, refuses them (`CLIENT_ERROR bad command line
//!   format`) as memcached before 1.6 did, which is what memcached's conformance tool
//!   (`memccapable`, run by CI) checks of such a server. The scripts leave them out.
//! * The largest value: `montage-kv` stores values of up to 1 MiB; memcached's 1 MiB limit
//!   is on the whole item (its header and key included), so it refuses values a few dozen
//!   bytes (plus the key's length) shorter. The scripts stay clear of the boundary.
//! * A `get` (`gets`, `gat`, `gats`) naming a key longer than 250 bytes: memcached drops the
//!   replies it has not sent yet to the connection's earlier requests, then sends the
//!   error; `montage-kv` sends those replies, then the error. A script has such a `get` only
//!   as its first request.
//! * A script whose last request is left incomplete: memcached drops the replies it has
//!   not sent yet when the client half-closes (it sends them only once it waits for a new
//!   request); `montage-kv` sends them. The generated scripts end whole.
//! * A reply to a value too large to store comes at once from `montage-kv`, and from
//!   memcached only once the value has arrived (it reads it first): the same bytes for a
//!   request that is sent whole.
//!
//! Known gaps, not differences we intend: the meta commands (`mg`, `ms`, `md`, `ma`, `mn`,
//! `me`), which `montage-kv` does not speak yet, and the administrative commands it does not
//! have (`slabs`, `lru`, `lru_crawler`, `watch`, `cache_memlimit`, `stats` groups other than
//! the general one and `settings`); the scripts leave them out.

#![allow(clippy::unwrap_used)] // a failed set-up step should stop the test loudly

mod common;

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Server;
use proptest::prelude::*;

/// A running memcached.
struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The two servers the tests compare, started once for all of them (`None` when memcached
/// is not installed).
struct Pair {
    memcached: Memcached,
    montage: Server,
    _heap: tempfile::TempDir,
}

/// Starts memcached with the limits `montage-kv` has (64 MiB, 1 MiB items, 1024
/// connections), on a free port, and waits until it accepts connections.
fn start_memcached(binary: &std::path::Path) -> Memcached {
    let port = common::free_port();
    let mut command = Command::new(binary);
    command.args([
        "-l",
        "127.0.0.1",
        "-U",
        "0",
        "-m",
        "64",
        "-c",
        "1024",
        "-t",
        "2",
    ]);
    command.args(["-p", &port.to_string()]);
    // memcached refuses to run as root unless told which user to be.
    if std::env::var("USER").as_deref() == Ok("root") || is_root() {
        command.args(["-u", "root"]);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Memcached { child, addr }
}

/// Whether this process runs as root (the owner of `/proc/self`).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The servers, or `None` (said so) when memcached is missing.
fn pair() -> Option<Pair> {
    let Some(binary) = common::installed("memcached") else {
        eprintln!(
            "skipped: memcached is not installed (apt-get install memcached); \
             the differential tests need the real server"
        );
        return None;
    };
    let heap = tempfile::tempdir().unwrap();
    let montage = Server::start(&heap.path().join("kv.heap"), &[]);
    Some(Pair {
        memcached: start_memcached(&binary),
        montage,
        _heap: heap,
    })
}

/// Sends `script` over a new connection to `addr`, half-closes it, and returns every byte
/// the server sent until it closed.
fn exchange(addr: SocketAddr, script: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(script).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    reply
}

/// `reply` with the intended differences (module docs) normalised away.
fn normalised(reply: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(reply.len());
    let mut rest = reply;
    while !rest.is_empty() {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(rest.len(), |at| at + 2);
        let (line, tail) = rest.split_at(end);
        rest = tail;
        if line.starts_with(b"VERSION ") {
            out.extend_from_slice(b"VERSION #\r\n");
            continue;
        }
        let words: Vec<&[u8]> = line.trim_ascii_end().split(|&b| b == b' ').collect();
        let (b"VALUE", [key, flags, bytes, cas @ ..]) = (words[0], &words[1..]) else {
            out.extend_from_slice(line);
            continue;
        };
        if cas.is_empty() {
            out.extend_from_slice(line);
        } else {
            for part in [&b"VALUE "[..], key, b" ", flags, b" ", bytes, b" #\r\n"] {
                out.extend_from_slice(part);
            }
        }
        // The data block goes through as it is (it may hold anything).
        let len: usize = std::str::from_utf8(bytes).unwrap().parse().unwrap();
        let data = rest.len().min(len + 2);
        out.extend_from_slice(&rest[..data]);
        rest = &rest[data..];
    }
    out
}

/// A prefix no other script uses, for a script's keys.
fn prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // ORDERING: a counter; nothing else is published through it.
    format!("d{}-", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs `script` (with `@` standing for the script's key prefix) on both servers and
/// compares the replies; returns an error naming the difference.
fn compare(pair: &Pair, script: &[u8]) -> Result<(), String> {
    let prefix = prefix();
    let mut bytes = Vec::with_capacity(script.len() + 16);
    for &b in script {
        if b == b'@' {
            bytes.extend_from_slice(prefix.as_bytes());
        } else {
            bytes.push(b);
        }
    }
    let theirs = normalised(&exchange(pair.memcached.addr, &bytes));
    let ours = normalised(&exchange(pair.montage.addr, &bytes));
    if theirs == ours {
        Ok(())
    } else {
        Err(format!(
            "script {:?}\n memcached: {:?}\n montage-kv: {:?}",
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&theirs),
            String::from_utf8_lossy(&ours),
        ))
    }
}

/// Hand-written edge cases: malformed lines and arguments of every command, data blocks of
/// the wrong length, `noreply` in and out of place, limits.
const CASES: &[&[u8]] = &[
    // Storage commands.
    b"set @a 0 0 1\r\nx\r\nget @a\r\n",
    b"set @a 5 0 3\r\nabc\r\nadd @a 0 0 1\r\nx\r\nreplace @b 0 0 1\r\nx\r\nget @a @b\r\n",
    b"add @a 0 0 1\r\nx\r\nreplace @a 7 0 2\r\nyz\r\ngets @a\r\n",
    b"append @a 0 0 1\r\nx\r\nprepend @a 0 0 1\r\nx\r\nset @a 3 0 1\r\nm\r\n\
      append @a 9 0 2\r\nzz\r\nprepend @a 9 0 2\r\naa\r\nget @a\r\n",
    b"set @a 0 0 0\r\n\r\nget @a\r\n",
    b"set @a 0 0 1 noreply\r\nx\r\nget @a\r\n",
    b"set @a 0 0 1 extra\r\nx\r\nget @a\r\n",
    b"set @a 0 0 1 noreply extra\r\nx\r\n",
    b"set @a 0 0 1\r\nxyz\r\nget @a\r\n",
    b"set @a 0 0 1\r\nxy\r\nget @a\r\n",
    b"set @a 0 0 3\nabc\nget @a\n",
    b"set @a 0 0 1\nx\nget @a\n",
    b"set @a 0 0 1 noreply\r\nxyz\r\nget @a\r\n",
    b"set @a 0 0\r\n",
    b"set @a 0 0 1 2 3\r\nx\r\n",
    b"set\r\n",
    b"set @a abc 0 1\r\nx\r\n",
    b"set @a 0 abc 1\r\nx\r\n",
    b"set @a 0 0 abc\r\nx\r\n",
    b"set @a 0 0 -1\r\n",
    b"set @a -1 0 1\r\nx\r\nget @a\r\n",
    b"set @a 4294967295 0 1\r\nx\r\nget @a\r\n",
    b"set @a 4294967296 0 1\r\nx\r\nget @a\r\n",
    b"set @a +5 0 1\r\nx\r\nget @a\r\n",
    b"set @a 0 -1 1\r\nx\r\nget @a\r\n",
    b"set @a 0 2592001 1\r\nx\r\nget @a\r\n",
    b"set @a 0 999999999999 1\r\nx\r\nget @a\r\n",
    b"set @aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
      aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
      aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 0 0 1\r\nx\r\n",
    b"SET @a 0 0 1\r\nx\r\n",
    // cas.
    b"cas @a 0 0 1 1\r\nx\r\nset @a 0 0 1\r\nx\r\ncas @a 0 0 1 999999\r\ny\r\nget @a\r\n",
    b"cas @a 0 0 1\r\nx\r\n",
    b"cas @a 0 0 1 abc\r\nx\r\n",
    b"cas @a 0 0 1 -1\r\nx\r\n",
    b"cas @a 0 0 1 1 noreply\r\nx\r\n",
    // Retrieval.
    b"get\r\n",
    b"gets\r\n",
    b"get @a @a @b\r\n",
    b"GET @a\r\n",
    b"set @a 0 0 1\r\nx\r\ngat 100 @a @b\r\ngats 0 @a\r\n",
    b"gat abc @a\r\n",
    b"gat 100\r\n",
    b"gat\r\n",
    b"get @a aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
      aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
      aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa @b\r\n",
    b"set @a 0 0 1\r\nx\r\nget @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a @a \
      @a @a @a @a @a @a\r\n",
    // delete.
    b"set @a 0 0 1\r\nx\r\ndelete @a\r\ndelete @a\r\n",
    b"delete @a 0\r\ndelete @a noreply\r\ndelete @a 0 noreply\r\ndelete @a 1\r\n",
    b"delete @a b c\r\n",
    b"delete\r\n",
    b"delete @a 0 0 0\r\n",
    // incr and decr.
    b"incr @a 1\r\nset @a 0 0 2\r\n10\r\nincr @a 5\r\ndecr @a 100\r\nincr @a abc\r\n",
    b"set @a 0 0 1\r\nx\r\nincr @a 1\r\ndecr @a 1\r\n",
    b"set @a 0 0 20\r\n18446744073709551615\r\nincr @a 1\r\nget @a\r\n",
    b"set @a 0 0 1\r\n5\r\nincr @a 18446744073709551616\r\nincr @a -1\r\nincr @a +1\r\n",
    b"set @a 0 0 2\r\n99\r\nincr @a 1\r\nget @a\r\ndecr @a 95\r\nget @a\r\n",
    b"set @a 0 0 3\r\n 12\r\nincr @a 1\r\n",
    b"set @a 0 0 3\r\n12a\r\nincr @a 1\r\n",
    b"incr @a\r\n",
    b"incr\r\n",
    b"incr @a 1 noreply\r\nget @a\r\n",
    b"incr @a 1 2 3\r\n",
    // touch.
    b"set @a 0 0 1\r\nx\r\ntouch @a 100\r\ntouch @b 100\r\ntouch @a -1\r\nget @a\r\n",
    b"touch @a\r\n",
    b"touch @a abc\r\n",
    b"touch @a 1 noreply\r\n",
    // flush_all (immediate only: a delay would reach other scripts).
    b"set @a 0 0 1\r\nx\r\nflush_all\r\nget @a\r\n",
    b"flush_all 0\r\nflush_all noreply\r\nflush_all -1\r\n",
    b"flush_all abc\r\n",
    b"flush_all 0 0\r\n",
    b"flush_all 0 noreply extra\r\n",
    // Other commands.
    b"version\r\n",
    b"verbosity 1\r\nverbosity\r\nverbosity noreply\r\nverbosity abc\r\nverbosity 1 2\r\n",
    b"verbosity 1 noreply\r\n",
    b"quit\r\nget @a\r\n",
    b"shutdown\r\n",
    b"bogus\r\n",
    b"\r\n",
    b"\n",
    b"x\r\n",
    b"g\r\n",
    b"gett @a\r\n",
    b"   get @a\r\n",
    b"get  @a   @b  \r\n",
    b"get @a\tb\r\n",
    b"set @a 0 0 1\r\nx\r\nget @a",
];

#[test]
fn hand_written_cases_get_memcached_s_replies() {
    let Some(pair) = pair() else { return };
    // Values too large to store, sent whole: refused (the value swallowed), and a `set`'s
    // older item goes too, as memcached has it.
    let large: Vec<Vec<u8>> = [b"set", &b"add"[..], b"append"]
        .iter()
        .map(|name| {
            let value = vec![b'x'; 1 << 21];
            let line = format!(
                "{} @a 0 0 {}\r\n",
                String::from_utf8_lossy(name),
                value.len()
            );
            [
                &b"set @a 0 0 1\r\nx\r\n"[..],
                line.as_bytes(),
                &value,
                b"\r\nget @a\r\n",
            ]
            .concat()
        })
        .collect();
    let failures: Vec<String> = CASES
        .iter()
        .copied()
        .chain(large.iter().map(Vec::as_slice))
        .filter_map(|script| compare(&pair, script).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        CASES.len() + large.len(),
        failures.join("\n")
    );
}

/// A token a generated command may carry: the usual and the malformed.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u32..20).prop_map(|n| n.to_string()),
        1 => Just("-1".to_owned()),
        1 => Just("abc".to_owned()),
        1 => Just("4294967296".to_owned()),
        1 => Just("18446744073709551615".to_owned()),
        1 => Just("99999999999999999999".to_owned()),
        1 => Just("+3".to_owned()),
        1 => Just("2592001".to_owned()),
        1 => Just("noreply".to_owned()),
    ]
}

/// A key: one of a few (so commands meet).
fn short_key() -> impl Strategy<Value = String> {
    (0u8..3).prop_map(|k| format!("@{k}"))
}

/// A key: one of a few, sometimes one too long.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => short_key(),
        1 => Just("@".to_owned() + &"k".repeat(250)),
    ]
}

/// Data for a storage command: digits (for incr) or letters.
fn data() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0u64..1000).prop_map(|n| n.to_string().into_bytes()),
        proptest::collection::vec(prop::sample::select(b"abc \r\n".to_vec()), 0..6),
    ]
}

/// One command line (with its data block), well formed or not.
fn command() -> impl Strategy<Value = Vec<u8>> {
    let store = (
        prop::sample::select(vec!["set", "add", "replace", "append", "prepend", "cas"]),
        key(),
        number(),
        prop_oneof![3 => Just("0".to_owned()), 1 => number()],
        data(),
        -1isize..=1,
        number(),
        prop::option::of(Just("noreply")),
    )
        .prop_map(|(name, key, flags, exptime, data, skew, unique, noreply)| {
            let announced = data.len().saturating_add_signed(skew);
            let mut line = format!("{name} {key} {flags} {exptime} {announced}");
            if name == "cas" {
                line = format!("{line} {unique}");
            }
            if let Some(noreply) = noreply {
                line = format!("{line} {noreply}");
            }
            let mut bytes = line.into_bytes();
            bytes.extend_from_slice(b"\r\n");
            bytes.extend_from_slice(&data);
            bytes.extend_from_slice(b"\r\n");
            bytes
        });
    // Retrievals never name a key that is too long (intended differences, module docs).
    let retrieval = (
        prop::sample::select(vec!["get", "gets", "gat", "gats"]),
        prop::collection::vec(prop_oneof![short_key(), number()], 0..4),
    );
    let change = (
        prop::sample::select(vec!["delete", "incr", "decr", "touch", "verbosity"]),
        prop::collection::vec(prop_oneof![key(), number()], 0..4),
    );
    let other = prop_oneof![retrieval, change].prop_map(|(name, args)| {
        let mut line = name.to_owned();
        for arg in args {
            line.push(' ');
            line.push_str(&arg);
        }
        line.push_str("\r\n");
        line.into_bytes()
    });
    // Flushes that take effect now (a delay would reach the scripts after this one).
    let flush = prop::sample::select(vec![
        "flush_all",
        "flush_all 0",
        "flush_all -1",
        "flush_all noreply",
        "flush_all 0 noreply",
        "flush_all abc",
        "flush_all 0 0",
        "flush_all -5 noreply",
    ])
    .prop_map(|line| format!("{line}\r\n").into_bytes());
    prop_oneof![6 => store, 9 => other, 1 => flush]
}

#[test]
fn generated_scripts_get_memcached_s_replies() {
    let Some(pair) = pair() else { return };
    let cases = std::env::var("MONTAGE_DIFF_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    let scripts = prop::collection::vec(command(), 1..12);
    if let Err(err) = runner.run(&scripts, |commands| {
        // Empty lines at the end complete any data block a wrong length left open (they
        // are more bytes than any generated block), so the script ends whole.
        let script = [commands.concat(), b"\r\n".repeat(8)].concat();
        compare(&pair, &script).map_err(TestCaseError::fail)
    }) {
        panic!("{err}");
    }
}

/// The `stats` counters that monitoring reads, after the same requests: hits, misses (and
/// why: expired, flushed), each command's counts, items. (`bytes` is left out: each server
/// counts an item's overhead in its own way; so is `curr_connections`, which depends on when
/// each server notices that the script's connection closed. The script reads every item it
/// leaves flushed, so that `curr_items` does not depend on when memcached's background
/// crawler reclaims them.)
#[test]
fn stats_counters_match_memcached_s() {
    let Some(pair) = pair() else { return };
    let script = b"set @a 0 0 1\r\nx\r\nset @b 0 -1 1\r\ny\r\nget @a @b @c\r\ngets @a\r\n\
        add @a 0 0 1\r\nz\r\nreplace @c 0 0 1\r\nz\r\nappend @a 0 0 1\r\nz\r\n\
        cas @a 0 0 1 1\r\nq\r\ncas @c 0 0 1 1\r\nq\r\ntouch @a 100\r\ntouch @c 100\r\n\
        gat 100 @a @c\r\nset @n 0 0 1\r\n5\r\nincr @n 2\r\ndecr @n 1\r\nincr @c 1\r\n\
        decr @c 1\r\ndelete @n\r\ndelete @n\r\nset @f 0 0 1\r\nf\r\nflush_all\r\nget @f @a\r\n\
        set @g 0 0 1\r\ng\r\nget @g\r\n";
    let prefix = prefix();
    let script: Vec<u8> = script
        .iter()
        .flat_map(|&b| {
            if b == b'@' {
                prefix.as_bytes().to_vec()
            } else {
                vec![b]
            }
        })
        .collect();
    let counters = |addr: SocketAddr| {
        exchange(addr, &script);
        let reply = exchange(addr, b"stats\r\n");
        let wanted = [
            "cmd_get",
            "cmd_set",
            "cmd_flush",
            "cmd_touch",
            "get_hits",
            "get_misses",
            "get_expired",
            "get_flushed",
            "delete_misses",
            "delete_hits",
            "incr_misses",
            "incr_hits",
            "decr_misses",
            "decr_hits",
            "cas_misses",
            "cas_hits",
            "cas_badval",
            "touch_hits",
            "touch_misses",
            "curr_items",
            "total_items",
            "evictions",
        ];
        let values: std::collections::BTreeMap<String, String> = String::from_utf8(reply)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("STAT ")?.splitn(2, ' ');
                let (name, value) = (words.next()?, words.next()?);
                wanted
                    .contains(&name)
                    .then(|| (name.to_owned(), value.to_owned()))
            })
            .collect();
        assert_eq!(values.len(), wanted.len(), "{values:?}");
        values
    };
    assert_eq!(counters(pair.memcached.addr), counters(pair.montage.addr));
}
