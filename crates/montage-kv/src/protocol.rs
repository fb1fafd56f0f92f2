//! The memcached text protocol: requests parsed from a connection's input buffer, and the
//! error replies the protocol defines for bad input.
//!
//! [`parse`] looks at the bytes a connection has buffered and returns one of three things:
//! a complete [`Request`] and how many bytes it took; [`Parsed::Incomplete`] when the
//! request has not fully arrived (read more and call again); or [`Parsed::Invalid`], the
//! reply to send and how much input to discard (or that the connection must close). It never
//! panics and never consumes more than it was given, whatever the bytes (a property test
//! checks both), so a bad client can cost only its own connection.
//!
//! What is accepted follows memcached's own parser: tokens separated by spaces, lines ended
//! by `\r\n` (or a bare `\n`), keys of 1 to 250 bytes (any bytes but the space and line
//! end that delimit them: the protocol asks clients not to send control characters, but
//! memcached accepts them and load generators such as memcaslap send them),
//! 32-bit flags, signed expiry times, and a data block of exactly the announced length
//! followed by `\r\n`.

use thiserror::Error;

/// The longest key the protocol allows.
pub const MAX_KEY_LEN: usize = 250;

/// Size limits a server enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest value a storage command may carry, in bytes.
    pub max_value: usize,
    /// The longest command line (without its data block), in bytes.
    pub max_line: usize,
}

impl Default for Limits {
    /// memcached's defaults: 1 MiB values; lines long enough for a multi-get of a few
    /// hundred maximal keys.
    fn default() -> Self {
        Limits {
            max_value: 1 << 20,
            max_line: 64 << 10,
        }
    }
}

/// Which storage command a [`Request::Store`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if the key is absent.
    Add,
    /// `replace`: store only if the key is present.
    Replace,
    /// `append`: add the data after the present value.
    Append,
    /// `prepend`: add the data before the present value.
    Prepend,
    /// `cas`: store only if the item's cas unique is unchanged.
    Cas,
}

/// One parsed request. Keys and data borrow from the input buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get` / `gets` (with cas uniques) of one or more keys.
    Get {
        /// The keys, in request order.
        keys: Vec<&'a [u8]>,
        /// `gets`: report each item's cas unique.
        with_cas: bool,
    },
    /// `set`, `add`, `replace`, `append`, `prepend` or `cas`.
    Store {
        /// Which command.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// Opaque flags stored with the item.
        flags: u32,
        /// Expiry: 0 never; up to 30 days, seconds from now; more, a Unix time; negative,
        /// already expired.
        exptime: i64,
        /// The value.
        data: &'a [u8],
        /// For `cas`: the unique the item must still have.
        cas_unique: Option<u64>,
        /// Send no reply.
        noreply: bool,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// Send no reply.
        noreply: bool,
    },
    /// `incr` / `decr`.
    Arith {
        /// `incr` (else `decr`).
        incr: bool,
        /// The key.
        key: &'a [u8],
        /// The amount.
        delta: u64,
        /// Send no reply.
        noreply: bool,
    },
    /// `touch`: set a new expiry.
    Touch {
        /// The key.
        key: &'a [u8],
        /// The new expiry (as in [`Request::Store`]).
        exptime: i64,
        /// Send no reply.
        noreply: bool,
    },
    /// `flush_all`: invalidate every item, now or after `delay` seconds.
    FlushAll {
        /// Seconds from now (or a Unix time), if given.
        delay: Option<i64>,
        /// Send no reply.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `stats`, with an optional group name.
    Stats {
        /// The group (`items`, `slabs`, ...), if given.
        group: Option<&'a [u8]>,
    },
    /// `verbosity`: accepted and ignored, as a cache of ours logs through its own means.
    Verbosity {
        /// Send no reply.
        noreply: bool,
    },
    /// `quit`: close the connection.
    Quit,
}

/// What a malformed request is, and the reply the protocol gives for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// Not a command this server knows (`ERROR`).
    #[error("unknown command")]
    UnknownCommand,
    /// A known command with missing, extra or malformed arguments, or a bad key.
    #[error("bad command line format")]
    BadFormat,
    /// A data block not followed by `\r\n`.
    #[error("bad data chunk")]
    BadDataChunk,
    /// `incr`/`decr` with a delta that is not a 64-bit unsigned integer.
    #[error("invalid numeric delta argument")]
    BadDelta,
    /// A value larger than [`Limits::max_value`].
    #[error("object too large for cache")]
    TooLarge,
    /// A command line longer than [`Limits::max_line`] with no end in sight.
    #[error("line too long")]
    LineTooLong,
}

impl ProtocolError {
    /// The reply line for this error, `\r\n` included.
    pub fn reply(self) -> String {
        match self {
            ProtocolError::UnknownCommand => "ERROR\r\n".to_owned(),
            ProtocolError::TooLarge => format!("SERVER_ERROR {self}\r\n"),
            _ => format!("CLIENT_ERROR {self}\r\n"),
        }
    }
}

/// What to do with the input after an invalid request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Discard this many bytes (possibly more than are buffered yet: discard the rest as it
    /// arrives), then go on parsing.
    Bytes(usize),
    /// The input cannot be resynchronised: reply, then close the connection.
    Close,
}

/// The outcome of [`parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A request, and how many bytes of the buffer it took.
    Request(Request<'a>, usize),
    /// The buffer holds only the start of a request.
    Incomplete,
    /// A malformed request: send `error.reply()` and then apply `skip`.
    Invalid {
        /// What was wrong.
        error: ProtocolError,
        /// What to discard.
        skip: Skip,
    },
}

/// Parses the first request in `buf` (see the module docs).
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > limits.max_line {
            invalid(ProtocolError::LineTooLong, Skip::Close)
        } else {
            Parsed::Incomplete
        };
    };
    if newline > limits.max_line {
        return invalid(ProtocolError::LineTooLong, Skip::Close);
    }
    let line_len = newline + 1;
    let line = buf[..newline]
        .strip_suffix(b"\r")
        .unwrap_or(&buf[..newline]);
    let tokens: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let skip_line = Skip::Bytes(line_len);
    let Some((&name, args)) = tokens.split_first() else {
        return invalid(ProtocolError::UnknownCommand, skip_line);
    };
    let request = match name {
        b"get" | b"gets" => get(args, name == b"gets"),
        b"set" => return store(buf, line_len, StoreMode::Set, args, limits),
        b"add" => return store(buf, line_len, StoreMode::Add, args, limits),
        b"replace" => return store(buf, line_len, StoreMode::Replace, args, limits),
        b"append" => return store(buf, line_len, StoreMode::Append, args, limits),
        b"prepend" => return store(buf, line_len, StoreMode::Prepend, args, limits),
        b"cas" => return store(buf, line_len, StoreMode::Cas, args, limits),
        b"delete" => delete(args),
        b"incr" | b"decr" => arith(args, name == b"incr"),
        b"touch" => touch(args),
        b"flush_all" => flush_all(args),
        // Arguments are refused, as memcached did before 1.6 (clients such as memccapable
        // expect this of a server whose version is below 1.6).
        b"version" if args.is_empty() => Ok(Request::Version),
        b"quit" if args.is_empty() => Ok(Request::Quit),
        b"stats" => match args {
            [] => Ok(Request::Stats { group: None }),
            [group] => Ok(Request::Stats { group: Some(group) }),
            _ => Err(ProtocolError::BadFormat),
        },
        b"verbosity" => match split_noreply(args) {
            ([level], noreply) if number::<u32>(level).is_some() => {
                Ok(Request::Verbosity { noreply })
            }
            // As memcached: without a level, `noreply` alone is accepted and a bare
            // `verbosity` is not a known command form.
            ([], true) => Ok(Request::Verbosity { noreply: true }),
            ([], false) => Err(ProtocolError::UnknownCommand),
            _ => Err(ProtocolError::BadFormat),
        },
        b"version" | b"quit" => Err(ProtocolError::BadFormat),
        _ => Err(ProtocolError::UnknownCommand),
    };
    match request {
        Ok(request) => Parsed::Request(request, line_len),
        Err(error) => invalid(error, skip_line),
    }
}

fn invalid<'a>(error: ProtocolError, skip: Skip) -> Parsed<'a> {
    Parsed::Invalid { error, skip }
}

/// Whether `key` is a key this server accepts (module docs): a token of 1 to
/// [`MAX_KEY_LEN`] bytes, none of them a space or a line end.
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n'))
}

fn key(token: &[u8]) -> Result<&[u8], ProtocolError> {
    if valid_key(token) {
        Ok(token)
    } else {
        Err(ProtocolError::BadFormat)
    }
}

/// A decimal number of type `T` (with a sign only where `T` has one).
fn number<T: std::str::FromStr>(token: &[u8]) -> Option<T> {
    if token.first() == Some(&b'+') {
        return None;
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// `args` without a trailing `noreply`, and whether it was there.
fn split_noreply<'t, 'a>(args: &'t [&'a [u8]]) -> (&'t [&'a [u8]], bool) {
    match args.split_last() {
        Some((&b"noreply", rest)) => (rest, true),
        _ => (args, false),
    }
}

fn get<'a>(args: &[&'a [u8]], with_cas: bool) -> Result<Request<'a>, ProtocolError> {
    if args.is_empty() {
        // memcached answers a keyless get as an unknown command.
        return Err(ProtocolError::UnknownCommand);
    }
    let keys = args.iter().map(|t| key(t)).collect::<Result<_, _>>()?;
    Ok(Request::Get { keys, with_cas })
}

fn delete<'a>(args: &[&'a [u8]]) -> Result<Request<'a>, ProtocolError> {
    match split_noreply(args) {
        // memcached still accepts a legacy time argument of 0.
        ([k] | [k, b"0"], noreply) => Ok(Request::Delete {
            key: key(k)?,
            noreply,
        }),
        _ => Err(ProtocolError::BadFormat),
    }
}

fn arith<'a>(args: &[&'a [u8]], incr: bool) -> Result<Request<'a>, ProtocolError> {
    match split_noreply(args) {
        ([k, delta], noreply) => Ok(Request::Arith {
            incr,
            key: key(k)?,
            delta: number(delta).ok_or(ProtocolError::BadDelta)?,
            noreply,
        }),
        _ => Err(ProtocolError::BadFormat),
    }
}

fn touch<'a>(args: &[&'a [u8]]) -> Result<Request<'a>, ProtocolError> {
    match split_noreply(args) {
        ([k, exptime], noreply) => Ok(Request::Touch {
            key: key(k)?,
            exptime: number(exptime).ok_or(ProtocolError::BadFormat)?,
            noreply,
        }),
        _ => Err(ProtocolError::BadFormat),
    }
}

fn flush_all<'a>(args: &[&'a [u8]]) -> Result<Request<'a>, ProtocolError> {
    match split_noreply(args) {
        ([], noreply) => Ok(Request::FlushAll {
            delay: None,
            noreply,
        }),
        ([delay], noreply) => Ok(Request::FlushAll {
            delay: Some(number(delay).ok_or(ProtocolError::BadFormat)?),
            noreply,
        }),
        _ => Err(ProtocolError::BadFormat),
    }
}

/// A storage command: the line's arguments, then the data block after the line.
fn store<'a>(
    buf: &'a [u8],
    line_len: usize,
    mode: StoreMode,
    args: &[&'a [u8]],
    limits: &Limits,
) -> Parsed<'a> {
    let skip_line = Skip::Bytes(line_len);
    let (args, noreply) = split_noreply(args);
    let (fixed, cas_unique) = match (mode, args) {
        (StoreMode::Cas, [k, f, e, n, unique]) => ([*k, *f, *e, *n], number::<u64>(unique)),
        (StoreMode::Cas, _) => return invalid(ProtocolError::BadFormat, skip_line),
        (_, [k, f, e, n]) => ([*k, *f, *e, *n], Some(0)),
        _ => return invalid(ProtocolError::BadFormat, skip_line),
    };
    let [k, flags, exptime, bytes] = fixed;
    let (Ok(key), Some(flags), Some(exptime), Some(bytes), Some(unique)) = (
        key(k),
        number::<u32>(flags),
        number::<i64>(exptime),
        number::<usize>(bytes),
        cas_unique,
    ) else {
        return invalid(ProtocolError::BadFormat, skip_line);
    };
    let Some(total) = line_len.checked_add(bytes).and_then(|n| n.checked_add(2)) else {
        return invalid(ProtocolError::BadFormat, skip_line);
    };
    if bytes > limits.max_value {
        // memcached swallows the data block it will not store.
        return invalid(ProtocolError::TooLarge, Skip::Bytes(total));
    }
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    let data = &buf[line_len..line_len + bytes];
    if &buf[line_len + bytes..total] != b"\r\n" {
        // Where the next request starts is unknown: the announced length was wrong.
        return invalid(ProtocolError::BadDataChunk, Skip::Close);
    }
    Parsed::Request(
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            cas_unique: (mode == StoreMode::Cas).then_some(unique),
            noreply,
        },
        total,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(input: &[u8]) -> Parsed<'_> {
        parse(input, &Limits::default())
    }

    #[test]
    fn retrieval_takes_many_keys() {
        assert_eq!(
            one(b"gets a bb  ccc\r\nget x\r\n"),
            Parsed::Request(
                Request::Get {
                    keys: vec![b"a", b"bb", b"ccc"],
                    with_cas: true
                },
                16
            )
        );
        assert_eq!(
            one(b"get x\n"),
            Parsed::Request(
                Request::Get {
                    keys: vec![b"x"],
                    with_cas: false
                },
                6
            )
        );
    }

    #[test]
    fn storage_commands_carry_their_data_block() {
        let input = b"set k 5 -1 3 noreply\r\nabc\r\nrest";
        assert_eq!(
            one(input),
            Parsed::Request(
                Request::Store {
                    mode: StoreMode::Set,
                    key: b"k",
                    flags: 5,
                    exptime: -1,
                    data: b"abc",
                    cas_unique: None,
                    noreply: true,
                },
                input.len() - 4
            )
        );
        match one(b"cas k 0 0 2 99\r\nhi\r\n") {
            Parsed::Request(
                Request::Store {
                    mode: StoreMode::Cas,
                    cas_unique: Some(99),
                    data,
                    ..
                },
                20,
            ) => assert_eq!(data, b"hi"),
            other => panic!("{other:?}"),
        }
        // Data may hold anything, line endings included.
        match one(b"append k 0 0 4\r\n\r\n\r\n\r\n") {
            Parsed::Request(Request::Store { data, .. }, 22) => assert_eq!(data, b"\r\n\r\n"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn partial_input_asks_for_more() {
        for input in [
            &b"get k"[..],
            b"set k 0 0 5\r\nab",
            b"set k 0 0 5\r\nabcde\r",
        ] {
            assert_eq!(one(input), Parsed::Incomplete, "{input:?}");
        }
    }

    #[test]
    fn the_other_commands() {
        let cases: [(&[u8], Request<'_>); 9] = [
            (
                b"delete k\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: false,
                },
            ),
            (
                b"delete k 0 noreply\r\n",
                Request::Delete {
                    key: b"k",
                    noreply: true,
                },
            ),
            (
                b"incr n 18446744073709551615\r\n",
                Request::Arith {
                    incr: true,
                    key: b"n",
                    delta: u64::MAX,
                    noreply: false,
                },
            ),
            (
                b"touch k 100 noreply\r\n",
                Request::Touch {
                    key: b"k",
                    exptime: 100,
                    noreply: true,
                },
            ),
            (
                b"flush_all\r\n",
                Request::FlushAll {
                    delay: None,
                    noreply: false,
                },
            ),
            (
                b"flush_all 10 noreply\r\n",
                Request::FlushAll {
                    delay: Some(10),
                    noreply: true,
                },
            ),
            (b"version\r\n", Request::Version),
            (
                b"stats items\r\n",
                Request::Stats {
                    group: Some(b"items"),
                },
            ),
            (
                b"verbosity 1 noreply\r\n",
                Request::Verbosity { noreply: true },
            ),
        ];
        for (input, request) in cases {
            assert_eq!(
                one(input),
                Parsed::Request(request, input.len()),
                "{input:?}"
            );
        }
        assert_eq!(one(b"quit\r\n"), Parsed::Request(Request::Quit, 6));
    }

    #[test]
    fn bad_input_gets_the_protocols_error_and_a_way_to_resynchronise() {
        let bad = |input: &[u8], error, skip| {
            assert_eq!(one(input), Parsed::Invalid { error, skip }, "{input:?}");
        };
        bad(
            b"frobnicate\r\n",
            ProtocolError::UnknownCommand,
            Skip::Bytes(12),
        );
        bad(b"\r\n", ProtocolError::UnknownCommand, Skip::Bytes(2));
        bad(b"get\r\n", ProtocolError::UnknownCommand, Skip::Bytes(5));
        bad(
            b"verbosity\r\n",
            ProtocolError::UnknownCommand,
            Skip::Bytes(11),
        );
        let long_key = [b'k'; MAX_KEY_LEN + 1];
        bad(
            &[b"get ", &long_key[..], b"\r\n"].concat(),
            ProtocolError::BadFormat,
            Skip::Bytes(257),
        );
        // A carriage return inside the line is not a key byte.
        bad(b"get a\rb\r\n", ProtocolError::BadFormat, Skip::Bytes(9));
        // Control characters are, as memcached has it.
        assert_eq!(
            one(b"get \x10\x00a\r\n"),
            Parsed::Request(
                Request::Get {
                    keys: vec![b"\x10\x00a"],
                    with_cas: false
                },
                9
            )
        );
        bad(b"set k 0 0\r\n", ProtocolError::BadFormat, Skip::Bytes(11));
        bad(
            b"set k x 0 1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(13),
        );
        bad(
            b"set k 4294967296 0 1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(22),
        );
        bad(
            b"set k 0 0 -1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(14),
        );
        bad(
            b"cas k 0 0 1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(13),
        );
        bad(
            b"set k 0 0 2\r\nabc\r\n",
            ProtocolError::BadDataChunk,
            Skip::Close,
        );
        bad(b"incr n -1\r\n", ProtocolError::BadDelta, Skip::Bytes(11));
        bad(
            b"incr n 18446744073709551616\r\n",
            ProtocolError::BadDelta,
            Skip::Bytes(29),
        );
        bad(b"version 2\r\n", ProtocolError::BadFormat, Skip::Bytes(11));
        assert_eq!(
            one(b"verbosity noreply\r\n"),
            Parsed::Request(Request::Verbosity { noreply: true }, 19)
        );
        let limits = Limits {
            max_value: 4,
            max_line: 16,
        };
        assert_eq!(
            parse(b"set k 0 0 5\r\nabc", &limits),
            Parsed::Invalid {
                error: ProtocolError::TooLarge,
                skip: Skip::Bytes(13 + 5 + 2)
            }
        );
        assert_eq!(
            parse(&[b'g'; 17], &limits),
            Parsed::Invalid {
                error: ProtocolError::LineTooLong,
                skip: Skip::Close
            }
        );
    }

    #[test]
    fn error_replies_are_the_protocols() {
        assert_eq!(ProtocolError::UnknownCommand.reply(), "ERROR\r\n");
        assert_eq!(
            ProtocolError::BadFormat.reply(),
            "CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            ProtocolError::BadDataChunk.reply(),
            "CLIENT_ERROR bad data chunk\r\n"
        );
        assert_eq!(
            ProtocolError::TooLarge.reply(),
            "SERVER_ERROR object too large for cache\r\n"
        );
    }

    proptest! {
        /// Whatever the bytes: no panic, and a request never claims more than it was given.
        #[test]
        fn any_input_parses_or_is_rejected_within_bounds(
            input in proptest::collection::vec(any::<u8>(), 0..300)
        ) {
            let limits = Limits { max_value: 64, max_line: 128 };
            if let Parsed::Request(_, used) = parse(&input, &limits) {
                prop_assert!(used > 0 && used <= input.len());
            }
        }

        /// Input built from the protocol's own words, to reach the deeper paths.
        #[test]
        fn protocol_shaped_input_parses_or_is_rejected_within_bounds(
            words in proptest::collection::vec(
                prop_oneof![
                    Just("set"), Just("cas"), Just("get"), Just("incr"), Just("noreply"),
                    Just("k"), Just("0"), Just("3"), Just("-1"), Just("abc"), Just(" "),
                    Just("\r\n"), Just("\n"),
                ],
                0..20,
            )
        ) {
            let input = words.concat();
            if let Parsed::Request(_, used) = parse(input.as_bytes(), &Limits::default()) {
                prop_assert!(used > 0 && used <= input.len());
            }
        }
    }
}
