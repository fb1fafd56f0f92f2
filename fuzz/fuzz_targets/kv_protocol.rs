//! The memcached protocol parser on arbitrary input, as a connection feeds it: parse, take
//! what a request used or skip what an error says, and go on. It must never panic, never
//! take more than it was given, and always make progress.

#![no_main]

use libfuzzer_sys::fuzz_target;
use montage_kv::protocol::{Limits, Parsed, Skip, parse};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_value: 1024,
        max_line: 512,
    };
    let mut buf = data;
    loop {
        match parse(buf, &limits) {
            Parsed::Request(_, used) => {
                assert!(
                    used > 0 && used <= buf.len(),
                    "took {used} of {}",
                    buf.len()
                );
                buf = &buf[used..];
            }
            Parsed::Incomplete => break,
            Parsed::Invalid {
                error,
                skip,
                unlink,
                ..
            } => {
                // Every error has a reply, but the one that closes an HTTP request's
                // connection silently.
                assert!(!error.reply().is_empty() || skip == Skip::Close);
                assert!(unlink.is_none_or(|key| !key.is_empty()));
                match skip {
                    Skip::Bytes(n) => {
                        assert!(n > 0, "an error that skips nothing would loop");
                        buf = &buf[n.min(buf.len())..];
                    }
                    Skip::Close => break,
                }
            }
        }
    }
});
