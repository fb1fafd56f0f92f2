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
        (
            b"set k 0 0\r\n",
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
    // A data block longer than announced cannot be resynchronised: error, then close.
    let reply = exchange(&mut bad, b"set k 0 0 2\r\nabcd\r\n", b"\r\n");
    assert_eq!(reply, b"CLIENT_ERROR bad data chunk\r\n");
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
