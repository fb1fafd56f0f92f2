//! The `montage-kv` binary driven by a real client library (the `memcache` crate) and by
//! raw sockets: every command, a clean restart, bad clients and the connection limit.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::Write as _;

use common::{Server, exchange, read_until};

#[test]
fn a_client_library_round_trips_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &[]);
    let client = server.client();

    let versions = client.version().unwrap();
    assert_eq!(versions[0].1, env!("CARGO_PKG_VERSION"));

    client.set("greeting", "hello", 0).unwrap();
    assert_eq!(
        client.get::<String>("greeting").unwrap().as_deref(),
        Some("hello")
    );
    // Flags travel with the value.
    let mut raw = server.connect();
    assert_eq!(
        exchange(&mut raw, b"set flagged 42 0 1\r\nx\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(
        client.get::<(Vec<u8>, u32)>("flagged").unwrap(),
        Some((b"x".to_vec(), 42))
    );

    // add only if absent, replace only if present.
    client.add("greeting", "ignored", 0).unwrap();
    client.add("fresh", "added", 0).unwrap();
    client.replace("missing", "ignored", 0).unwrap();
    client.replace("fresh", "replaced", 0).unwrap();
    assert_eq!(
        client.get::<String>("greeting").unwrap().as_deref(),
        Some("hello")
    );
    assert_eq!(
        client.get::<String>("fresh").unwrap().as_deref(),
        Some("replaced")
    );
    assert_eq!(client.get::<String>("missing").unwrap(), None);

    client.append("greeting", ", world").unwrap();
    client.prepend("greeting", "oh ").unwrap();
    assert_eq!(
        client.get::<String>("greeting").unwrap().as_deref(),
        Some("oh hello, world")
    );

    // Multi-get with cas uniques, then cas with a fresh and a stale unique.
    let got: HashMap<String, (Vec<u8>, u32, Option<u64>)> =
        client.gets(&["greeting", "fresh", "missing"]).unwrap();
    assert_eq!(got.len(), 2);
    let unique = got["fresh"].2.unwrap();
    assert!(client.cas("fresh", "swapped", 0, unique).unwrap());
    assert!(!client.cas("fresh", "stale", 0, unique).unwrap());
    assert_eq!(
        client.get::<String>("fresh").unwrap().as_deref(),
        Some("swapped")
    );

    client.set("counter", "41", 0).unwrap();
    assert_eq!(client.increment("counter", 1).unwrap(), 42);
    assert_eq!(client.decrement("counter", 50).unwrap(), 0);
    assert!(client.increment("nothing", 1).is_err());

    assert!(client.touch("counter", 1000).unwrap());
    assert!(!client.touch("nothing", 1000).unwrap());

    assert!(client.delete("counter").unwrap());
    assert!(!client.delete("counter").unwrap());
    assert_eq!(client.get::<String>("counter").unwrap(), None);

    let stats = server.stats();
    assert_eq!(stats["curr_items"], "3");
    assert_eq!(stats["cmd_set"], "11");
    assert!(stats["sync_rounds"].parse::<u64>().unwrap() >= 1);
    for name in [
        "bytes",
        "recovery_time_us",
        "durable_epoch",
        "epoch",
        "curr_connections",
    ] {
        assert!(stats.contains_key(name), "stats lack {name}");
    }

    client.flush().unwrap();
    assert_eq!(client.get::<String>("greeting").unwrap(), None);
    client.set("after", "flush", 0).unwrap();
    assert_eq!(
        client.get::<String>("after").unwrap().as_deref(),
        Some("flush")
    );
}

/// What meta commands acknowledge survives a crash: an item marked stale stays stale (and
/// the next get wins the right to recache it), a won right stays won, a vivified item and a
/// new expiry stay, and a counter keeps its value.
#[test]
fn meta_commands_survive_sigkill_with_their_marks() {
    let dir = tempfile::tempdir().unwrap();
    let heap = dir.path().join("kv.heap");
    let server = Server::start(&heap, &[]);
    let mut stream = server.connect();
    let script: &[(&[u8], &[u8])] = &[
        (b"ms stale 2 F7\r\nhi\r\n", b"HD\r\n"),
        (b"md stale I T500\r\n", b"HD\r\n"),
        (b"ms won 1 T5\r\nx\r\n", b"HD\r\n"),
        (b"mg won R60\r\n", b"HD W\r\n"),
        (b"mg viv N900 s\r\n", b"HD s0 W\r\n"),
        (b"ma n N0 J41\r\n", b"HD\r\n"),
        (b"ma n v\r\n", b"VA 2\r\n42\r\n"),
        (b"ms t 1\r\nx\r\n", b"HD\r\n"),
        (b"mg t T1000\r\n", b"HD\r\n"),
    ];
    // Each request gets its reply: its line, and the data block after a `VA`.
    let expect = |stream: &mut std::net::TcpStream, pairs: &[(&[u8], &[u8])]| {
        for &(request, reply) in pairs {
            let mut got = exchange(stream, request, b"\r\n");
            let lines = |reply: &[u8]| reply.windows(2).filter(|w| w == b"\r\n").count();
            if got.starts_with(b"VA") && lines(&got) < 2 {
                got.extend(read_until(stream, b"\r\n"));
            }
            assert_eq!(got, reply, "{}", String::from_utf8_lossy(request));
        }
    };
    expect(&mut stream, script);
    server.kill();
    let mut server = Server::start(&heap, &[]);
    server.wait_for("after a crash");
    let mut stream = server.connect();
    let after: &[(&[u8], &[u8])] = &[
        (b"mg stale v f\r\n", b"VA 2 f7 X W\r\nhi\r\n"),
        (b"mg stale\r\n", b"HD Z X\r\n"),
        (b"mg won\r\n", b"HD Z\r\n"),
        (b"mg viv s\r\n", b"HD s0 Z\r\n"),
        (b"ma n v\r\n", b"VA 2\r\n43\r\n"),
    ];
    expect(&mut stream, after);
    // Times left: about 500 s for the stale item, 1,000 s for the touched one, 900 s for the
    // vivified one.
    for (key, ttl) in [("stale", 500), ("t", 1000), ("viv", 900)] {
        let reply = exchange(&mut stream, format!("mg {key} t\r\n").as_bytes(), b"\r\n");
        let text = String::from_utf8(reply).unwrap();
        let left: i64 = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('t')?.parse().ok())
            .unwrap_or_else(|| panic!("{key}: {text:?}"));
        assert!((ttl - 60..=ttl).contains(&left), "{key}: {text:?}");
    }
}

#[test]
fn items_survive_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let heap = dir.path().join("kv.heap");
    let server = Server::start(&heap, &[]);
    let client = server.client();
    for i in 0..500 {
        client
            .set(&format!("key{i}"), format!("value{i}").as_str(), 0)
            .unwrap();
    }
    client.delete("key7").unwrap();
    client.set("expires", "soon", 1).unwrap();
    drop(client);
    // A client still connected, idle, does not hold the shutdown up.
    let mut idle = server.connect();
    assert_eq!(exchange(&mut idle, b"version\r\n", b"\r\n").len(), 15);
    let (status, log) = server.terminate();
    assert!(status.success(), "{status:?}: {log:?}");
    assert!(
        log.iter().any(|l| l.contains("heap closed cleanly")),
        "{log:?}"
    );

    let mut server = Server::start(&heap, &[]);
    server.wait_for("after a clean shutdown");
    let client = server.client();
    for i in 0..500 {
        let value = client.get::<String>(&format!("key{i}")).unwrap();
        if i == 7 {
            assert_eq!(value, None);
        } else {
            assert_eq!(value, Some(format!("value{i}")));
        }
    }
    let items: u64 = server.stats()["curr_items"].parse().unwrap();
    assert!(items == 499 || items == 500, "{items} items");
}

#[test]
fn bad_clients_get_errors_and_hurt_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &["--max-value", "1000"]);
    let mut good = server.connect();
    assert_eq!(
        exchange(&mut good, b"set kept 5 0 4\r\nsafe\r\n", b"\r\n"),
        b"STORED\r\n"
    );

    let mut bad = server.connect();
    let cases: &[(&[u8], &[u8])] = &[
        (b"bogus\r\n", b"ERROR\r\n"),
        // A known command with a wrong number of arguments is an unknown form.
        (b"set k 0 0\r\n", b"ERROR\r\n"),
        (
            b"set k x 0 1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"incr kept abc\r\n",
            b"CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        (
            b"incr kept 1\r\n",
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
    ];
    for (request, reply) in cases {
        assert_eq!(exchange(&mut bad, request, b"\r\n"), *reply);
    }
    // An oversized value is refused and its bytes are swallowed: the next request works.
    let mut big = b"set big 0 0 2000\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'x', 2000));
    big.extend_from_slice(b"\r\nget kept\r\n");
    let reply = exchange(&mut bad, &big, b"END\r\n");
    assert_eq!(
        reply,
        b"SERVER_ERROR object too large for cache\r\nVALUE kept 5 4\r\nsafe\r\nEND\r\n"
    );
    // A data block longer than announced: as memcached, the announced length is taken and
    // parsing goes on after it (here an empty line).
    let reply = exchange(&mut bad, b"set k 0 0 2\r\nabcd\r\n", b"ERROR\r\n");
    assert_eq!(reply, b"CLIENT_ERROR bad data chunk\r\nERROR\r\n");
    // Binary garbage without a line end, past the line limit: error and close.
    let mut noise = server.connect();
    noise.write_all(&vec![0xAB; 100 << 10]).unwrap();
    assert_eq!(
        read_until(&mut noise, b"\r\n"),
        b"CLIENT_ERROR line too long\r\n"
    );

    // The well-behaved connection and the stored item are untouched.
    assert_eq!(
        exchange(&mut good, b"get kept big k\r\n", b"END\r\n"),
        b"VALUE kept 5 4\r\nsafe\r\nEND\r\n"
    );
}

#[test]
fn connections_beyond_the_limit_are_told_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &["--max-connections", "2"]);
    let mut first = server.connect();
    let mut second = server.connect();
    // Both are being served before the third arrives.
    assert_eq!(exchange(&mut first, b"version\r\n", b"\r\n").len(), 15);
    assert_eq!(exchange(&mut second, b"version\r\n", b"\r\n").len(), 15);
    let mut third = server.connect();
    assert_eq!(
        read_until(&mut third, b"\r\n"),
        b"SERVER_ERROR too many open connections\r\n"
    );
    drop(first);
    // The freed place is taken by the next connection (the server notices the close
    // asynchronously, so try a few times).
    let admitted = (0..100).any(|_| {
        let mut next = server.connect();
        let reply = exchange(&mut next, b"version\r\n", b"\r\n");
        if reply.starts_with(b"VERSION") {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        false
    });
    assert!(admitted);
}

#[test]
fn large_multi_gets_and_long_pipelines_are_served_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &[]);
    let mut stream = server.connect();
    // Twelve values of 400 KB: one multi-get answers with 4.8 MB, written in pieces.
    let value = |i: u8| vec![b'a' + i; 400_000];
    for i in 0..12 {
        let mut request = format!("set big{i} {i} 0 400000\r\n").into_bytes();
        request.extend(value(i));
        request.extend_from_slice(b"\r\n");
        assert_eq!(exchange(&mut stream, &request, b"\r\n"), b"STORED\r\n");
    }
    let keys: Vec<String> = (0..12).map(|i| format!("big{i}")).collect();
    let request = format!("get {}\r\n", keys.join(" "));
    let reply = exchange(&mut stream, request.as_bytes(), b"END\r\n");
    let mut expected = Vec::new();
    for i in 0..12 {
        expected.extend(format!("VALUE big{i} {i} 400000\r\n").into_bytes());
        expected.extend(value(i));
        expected.extend_from_slice(b"\r\n");
    }
    expected.extend_from_slice(b"END\r\n");
    assert!(reply == expected, "the multi-get reply differs");

    // Five thousand sets in one write: five thousand replies, in order, then the values.
    let mut pipeline = Vec::new();
    for i in 0..5000 {
        pipeline.extend(format!("set p{i} 0 0 {}\r\n{i}\r\n", i.to_string().len()).into_bytes());
    }
    pipeline.extend_from_slice(b"get p0 p4999\r\n");
    let reply = exchange(&mut stream, &pipeline, b"END\r\n");
    let text = String::from_utf8(reply).unwrap();
    assert_eq!(text.matches("STORED\r\n").count(), 5000);
    assert!(text.ends_with("VALUE p0 0 1\r\n0\r\nVALUE p4999 0 4\r\n4999\r\nEND\r\n"));
}

/// Sets `key` to 100,000 bytes of `v`; returns the reply.
fn set_large(stream: &mut std::net::TcpStream, key: &str) -> Vec<u8> {
    let mut request = format!("set {key} 0 0 100000\r\n").into_bytes();
    request.extend(std::iter::repeat_n(b'v', 100_000));
    request.extend_from_slice(b"\r\n");
    exchange(stream, &request, b"\r\n")
}

#[test]
fn a_full_heap_evicts_the_least_recently_used_items() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &["--size", "2MiB"]);
    let mut stream = server.connect();
    for i in 0..100 {
        assert_eq!(
            set_large(&mut stream, &format!("k{i}")),
            b"STORED\r\n",
            "k{i}"
        );
        // k0 is read after every write: it stays the most recently used.
        let reply = exchange(&mut stream, b"get k0\r\n", b"END\r\n");
        assert!(
            reply.starts_with(b"VALUE k0 0 100000\r\n"),
            "k0 gone at {i}"
        );
    }
    let stats = server.stats();
    let evictions: u64 = stats["evictions"].parse().unwrap();
    let items: u64 = stats["curr_items"].parse().unwrap();
    assert_eq!(evictions + items, 100, "{stats:?}");
    assert!(evictions >= 80, "{stats:?}");
    assert_eq!(stats["limit_maxbytes"], (2 << 20).to_string());
    // The newest items are there, the oldest (but k0) gone.
    let reply = exchange(&mut stream, b"get k99 k1\r\n", b"END\r\n");
    assert!(reply.starts_with(b"VALUE k99 0 100000\r\n"));
    assert!(reply.ends_with(b"\r\nEND\r\n") && !reply.windows(9).any(|w| w == b"VALUE k1 "));
    let settings = exchange(&mut stream, b"stats settings\r\n", b"END\r\n");
    assert!(
        String::from_utf8(settings)
            .unwrap()
            .contains("STAT evictions on\r\n")
    );
    // `stats reset` clears the count, as memcached's does.
    assert_eq!(
        exchange(&mut stream, b"stats reset\r\n", b"\r\n"),
        b"RESET\r\n"
    );
    assert_eq!(server.stats()["evictions"], "0");
}

#[test]
fn without_evictions_a_full_heap_refuses_writes_and_keeps_its_items() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("kv.heap"), &["--size", "2MiB", "-M"]);
    let mut stream = server.connect();
    let set = set_large;
    let mut stored = 0;
    loop {
        let reply = set(&mut stream, &format!("k{stored}"));
        if reply == b"SERVER_ERROR out of memory storing object\r\n" {
            break;
        }
        assert_eq!(reply, b"STORED\r\n");
        stored += 1;
        assert!(stored < 100, "a 2 MiB heap took {stored} values of 100 KB");
    }
    assert!(stored >= 5, "only {stored} values fit");
    // Everything stored before the heap filled is still there, and the connection works.
    for i in 0..stored {
        let reply = exchange(&mut stream, format!("get k{i}\r\n").as_bytes(), b"END\r\n");
        assert_eq!(
            reply.len(),
            format!("VALUE k{i} 0 100000\r\n").len() + 100_002 + 5
        );
    }
    // Deleting makes room again once the clock has reclaimed the blocks.
    assert_eq!(
        exchange(&mut stream, b"delete k0\r\n", b"\r\n"),
        b"DELETED\r\n"
    );
    assert_eq!(
        exchange(&mut stream, b"delete k1\r\n", b"\r\n"),
        b"DELETED\r\n"
    );
    let room = (0..500).any(|_| {
        if set(&mut stream, "again") == b"STORED\r\n" {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        false
    });
    assert!(room, "no room after deletes");
    assert_eq!(server.stats()["evictions"], "0");
    let settings = exchange(&mut stream, b"stats settings\r\n", b"END\r\n");
    assert!(
        String::from_utf8(settings)
            .unwrap()
            .contains("STAT evictions off\r\n")
    );
}

#[test]
fn a_second_server_on_the_same_heap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let heap = dir.path().join("kv.heap");
    let server = Server::start(&heap, &[]);
    server.client().set("kept", "yes", 0).unwrap();
    let said = Server::refused(&heap);
    assert!(said.contains("locked"), "{said}");
    // The first server and its items are untouched.
    assert_eq!(
        server.client().get::<String>("kept").unwrap().as_deref(),
        Some("yes")
    );
}

#[test]
fn a_file_that_is_not_a_heap_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, b"not a heap, and it must stay as it is").unwrap();
    let said = Server::refused(&path);
    assert!(said.contains("cannot open heap"), "{said}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"not a heap, and it must stay as it is"
    );
}
