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
//! What is accepted, and what each malformed request gets, follow memcached 1.6's own
//! parser, reply for reply (the differential tests send the same scripts to memcached and
//! compare): tokens separated by spaces, lines ended by `\r\n` (or a bare `\n`) and read up
//! to a NUL, keys of 1 to 250 bytes (any bytes but the space: the protocol asks clients not
//! to send control characters, but memcached accepts them and load generators such as
//! memcaslap send them), numbers as the C library reads them (32-bit flags and expiry times
//! keep the low bits of a larger number, as memcached's casts do), and a data block of
//! exactly the announced length followed by `\r\n`. A known command with the wrong number
//! of arguments is `ERROR`; a malformed argument is a `CLIENT_ERROR` that a final `noreply`
//! silences; a data block of the wrong length is `CLIENT_ERROR bad data chunk`, and parsing
//! goes on after the announced length.

use std::borrow::Cow;

use thiserror::Error;

use crate::meta::Meta;

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
        /// `gets` or `gats`: report each item's cas unique.
        with_cas: bool,
        /// `gat` or `gats`: the new expiry of each item found (as in [`Request::Store`]).
        touch: Option<i64>,
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
    /// A meta command (`mg`, `ms`, `md`, `ma`, `mn`, `me`; see [`crate::meta`]).
    Meta(Meta<'a>),
}

/// What a malformed request is, and the reply the protocol gives for it: memcached's own
/// strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// Not a command this server knows, or a known one with too few or too many arguments
    /// (`ERROR`).
    #[error("unknown command")]
    UnknownCommand,
    /// A known command with malformed arguments, or a key longer than [`MAX_KEY_LEN`].
    #[error("bad command line format")]
    BadFormat,
    /// `delete` with arguments other than a key, `0` and `noreply`.
    #[error("bad command line format.  Usage: delete <key> [noreply]")]
    BadDeleteFormat,
    /// A data block not followed by `\r\n`.
    #[error("bad data chunk")]
    BadDataChunk,
    /// `incr`/`decr` with a delta that is not a 64-bit unsigned integer.
    #[error("invalid numeric delta argument")]
    BadDelta,
    /// `touch`, `gat`, `gats` or `flush_all` with an expiry that is not a number.
    #[error("invalid exptime argument")]
    BadExptime,
    /// A value larger than [`Limits::max_value`].
    #[error("object too large for cache")]
    TooLarge,
    /// A command line longer than [`Limits::max_line`] with no end in sight.
    #[error("line too long")]
    LineTooLong,
    /// `shutdown`, which this server does not take from clients (as memcached without
    /// `-A`).
    #[error("shutdown not enabled")]
    ShutdownDisabled,
    /// An unknown command whose line ends like an HTTP request: memcached closes such a
    /// connection without a reply, and so does this server.
    #[error("an HTTP request")]
    Http,
    /// A meta command with a flag given twice (or a byte past ASCII as a flag).
    #[error("duplicate flag")]
    MetaDuplicateFlag,
    /// A meta command with a flag it does not know.
    #[error("invalid flag")]
    MetaInvalidFlag,
    /// `md` or `ma` with any flag error.
    #[error("invalid or duplicate flag")]
    MetaInvalidOrDuplicateFlag,
    /// A meta flag's number (`N`, `T`, `R`, `C`) that does not parse.
    #[error("bad token in command line format")]
    MetaBadToken,
    /// A key that `b` says is base64 and is not.
    #[error("error decoding key")]
    MetaKeyDecode,
    /// An `M` flag whose mode is not one character.
    #[error("incorrect length for M token")]
    MetaModeLength,
    /// `ma`'s `J` that is not a 64-bit unsigned number.
    #[error("invalid numeric initial value")]
    MetaInitial,
    /// `ma`'s `D` that is not a 64-bit unsigned number.
    #[error("invalid numeric delta value")]
    MetaDelta,
    /// An opaque token (`O`) longer than 32 bytes.
    #[error("opaque token too long")]
    MetaOpaqueTooLong,
    /// `mg` with too many flags.
    #[error("options flags are too long")]
    MetaGetFlagsTooLong,
    /// `ms`, `md` or `ma` with too many flags.
    #[error("options flags too long")]
    MetaFlagsTooLong,
    /// `ms` with a mode other than `E`, `A`, `P`, `R` or `S`.
    #[error("invalid mode for ms M token")]
    MetaSetMode,
    /// `ma` with a mode other than `I`, `+`, `D` or `-`.
    #[error("invalid mode for ma M token")]
    MetaArithMode,
}

impl ProtocolError {
    /// The reply line for this error, `\r\n` included (empty for [`ProtocolError::Http`]).
    pub fn reply(self) -> String {
        match self {
            ProtocolError::UnknownCommand => "ERROR\r\n".to_owned(),
            ProtocolError::ShutdownDisabled => format!("ERROR: {self}\r\n"),
            ProtocolError::Http => String::new(),
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
    /// A malformed request: send `error.reply()` (unless `noreply`) and then apply `skip`.
    Invalid {
        /// What was wrong.
        error: ProtocolError,
        /// What to discard.
        skip: Skip,
        /// The request asked for no reply, and memcached sends none, even for this error.
        noreply: bool,
        /// A key whose item goes: that of a `set` too large to store (memcached removes
        /// the older value rather than leave it stale).
        unlink: Option<Cow<'a, [u8]>>,
    },
}

/// Parses the first request in `buf` (see the module docs), as memcached 1.6 does: the
/// command line's tokens are checked against each command's forms (a wrong number of them is
/// `ERROR`), then its arguments, whose errors a `noreply` at the end of the line silences.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let Some(newline) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > limits.max_line {
            invalid(ProtocolError::LineTooLong, Skip::Close, false)
        } else {
            Parsed::Incomplete
        };
    };
    if newline > limits.max_line {
        return invalid(ProtocolError::LineTooLong, Skip::Close, false);
    }
    let line_len = newline + 1;
    let mut line = &buf[..newline];
    // One carriage return before the line feed ends the line with it (not a line that is
    // nothing else); memcached then reads the line as a C string, up to a NUL.
    if line.len() > 1 {
        line = line.strip_suffix(b"\r").unwrap_or(line);
    }
    if let Some(nul) = line.iter().position(|&b| b == 0) {
        line = &line[..nul];
    }
    let tokens: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect();
    let skip_line = Skip::Bytes(line_len);
    let Some((&name, args)) = tokens.split_first() else {
        return invalid(ProtocolError::UnknownCommand, skip_line, false);
    };
    if name.len() < 2 {
        return invalid(ProtocolError::UnknownCommand, skip_line, false);
    }
    // The forms each command has, by memcached's count of tokens: the command's, its
    // arguments' and a terminator's (`args.len() + 2`). Another count is an unknown form.
    let forms: &[usize] = match name {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" => &[6, 7],
        b"cas" => &[7, 8],
        b"incr" | b"decr" | b"touch" => &[4, 5],
        b"delete" => &[3, 4, 5],
        b"flush_all" => &[2, 3, 4],
        b"verbosity" => &[3, 4],
        _ => &[],
    };
    let retrieval = matches!(name, b"get" | b"gets" | b"gat" | b"gats" | b"bget");
    if (!forms.is_empty() && !forms.contains(&(args.len() + 2))) || (retrieval && args.is_empty()) {
        return invalid(ProtocolError::UnknownCommand, skip_line, false);
    }
    let noreply = args.last() == Some(&&b"noreply"[..]);
    let mode = match name {
        b"set" => Some(StoreMode::Set),
        b"add" => Some(StoreMode::Add),
        b"replace" => Some(StoreMode::Replace),
        b"append" => Some(StoreMode::Append),
        b"prepend" => Some(StoreMode::Prepend),
        b"cas" => Some(StoreMode::Cas),
        _ => None,
    };
    if let Some(mode) = mode {
        return store(buf, line_len, mode, args, noreply, limits);
    }
    let request = match name {
        b"get" | b"bget" => get(args, false, None),
        b"gets" => get(args, true, None),
        b"gat" | b"gats" => match number::c_long(args[0]) {
            Some(exptime) => get(&args[1..], name == b"gats", Some(exptime)),
            None => Err(ProtocolError::BadExptime),
        },
        // `noreply` counts only after the key (memcached looks for it only then).
        b"delete" => delete(args, noreply && args.len() > 1),
        b"incr" | b"decr" => arith(args, name == b"incr", noreply),
        b"touch" => touch(args, noreply),
        b"flush_all" => flush_all(args, noreply),
        // Arguments are refused, as memcached did before 1.6 (clients such as memccapable
        // expect this of a server whose version is below 1.6).
        b"version" | b"quit" if !args.is_empty() => Err(ProtocolError::BadFormat),
        b"version" => Ok(Request::Version),
        b"quit" => Ok(Request::Quit),
        b"stats" => Ok(Request::Stats {
            group: args.first().copied(),
        }),
        b"verbosity" => match number::c_ulong(args[0]) {
            Some(_) => Ok(Request::Verbosity { noreply }),
            None => Err(ProtocolError::BadFormat),
        },
        b"shutdown" => Err(ProtocolError::ShutdownDisabled),
        [b'm', _] => return crate::meta::parse(buf, line_len, name, args, limits),
        // A command memcached answers by its first letter alone.
        [b'g' | b's' | b'a' | b'c' | b'i' | b'd' | b't', ..] => Err(ProtocolError::UnknownCommand),
        _ if tokens.last().is_some_and(|t| t.starts_with(b"HTTP/")) => {
            return invalid(ProtocolError::Http, Skip::Close, false);
        }
        _ => Err(ProtocolError::UnknownCommand),
    };
    match request {
        Ok(request) => Parsed::Request(request, line_len),
        // Only the argument errors of a command that takes `noreply` are silenced by it.
        Err(error @ (ProtocolError::UnknownCommand | ProtocolError::ShutdownDisabled)) => {
            invalid(error, skip_line, false)
        }
        Err(error) => {
            let takes_noreply = match name {
                b"incr" | b"decr" | b"touch" | b"flush_all" | b"verbosity" => true,
                b"delete" => args.len() > 1,
                _ => false,
            };
            invalid(error, skip_line, noreply && takes_noreply)
        }
    }
}

/// An invalid request's outcome: `error`, replied unless `noreply`, then `skip`.
pub(crate) fn invalid<'a>(error: ProtocolError, skip: Skip, noreply: bool) -> Parsed<'a> {
    Parsed::Invalid {
        error,
        skip,
        noreply,
        unlink: None,
    }
}

/// Appends `prefix`, then `number` in decimal, to the reply `out`: the numbers of the hot
/// replies (a hit's length, flags and cas), without `core::fmt` (about 280 instructions a
/// number through `write!`).
pub(crate) fn push_number(out: &mut Vec<u8>, prefix: &[u8], number: impl itoa::Integer) {
    out.extend_from_slice(prefix);
    out.extend_from_slice(itoa::Buffer::new().format(number).as_bytes());
}

/// Whether `key` is a key this server accepts (module docs): 1 to [`MAX_KEY_LEN`] bytes,
/// none of them a space, a line feed or a NUL (which end memcached's tokens and lines).
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.iter().any(|&b| matches!(b, b' ' | b'\n' | 0))
}

fn key(token: &[u8]) -> Result<&[u8], ProtocolError> {
    if token.len() <= MAX_KEY_LEN {
        Ok(token)
    } else {
        Err(ProtocolError::BadFormat)
    }
}

/// Numbers read as memcached reads them: with the C library's `strtoull` and `strtol`
/// (leading white space and a sign allowed, the number ending at white space or the end of
/// the token), then cast to the field's C type, which for 32-bit fields keeps the low bits.
pub mod number {
    /// C's `isspace` in the C locale.
    fn space(b: u8) -> bool {
        matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
    }

    /// `token` as `strtoull`/`strtoll` read it: the sign, the magnitude (saturated past
    /// `u128`'s range), and whether what follows the digits ends the number; `None` when
    /// there are no digits.
    fn read(token: &[u8]) -> Option<(bool, u128)> {
        let mut rest = token;
        while let [b, tail @ ..] = rest
            && space(*b)
        {
            rest = tail;
        }
        let negative = rest.first() == Some(&b'-');
        if let [b'+' | b'-', tail @ ..] = rest {
            rest = tail;
        }
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let magnitude = rest[..digits].iter().fold(0u128, |n, &d| {
            n.saturating_mul(10).saturating_add(u128::from(d - b'0'))
        });
        // A NUL ends a C string: the number ends there too.
        let ends = rest.get(digits).is_none_or(|&b| space(b) || b == 0);
        ends.then_some((negative, magnitude))
    }

    /// memcached's `safe_strtoull`: an unsigned 64-bit number; a negative one only where
    /// its two's complement is still below 2^63 (`-0`, or as `strtoull` wraps it).
    pub fn c_ulonglong(token: &[u8]) -> Option<u64> {
        let (negative, magnitude) = read(token)?;
        let magnitude = u64::try_from(magnitude).ok()?;
        let value = if negative {
            magnitude.wrapping_neg()
        } else {
            magnitude
        };
        // A value that is negative as a signed number is refused if it was written with a
        // minus sign.
        if value.cast_signed() < 0 && token.contains(&b'-') {
            return None;
        }
        Some(value)
    }

    /// memcached's `safe_strtoul` into a 32-bit field: as [`c_ulonglong`], then the low 32
    /// bits.
    pub fn c_ulong(token: &[u8]) -> Option<u32> {
        #[allow(clippy::cast_possible_truncation)] // the C cast keeps the low bits
        c_ulonglong(token).map(|value| value as u32)
    }

    /// memcached's `safe_strtoll`: a signed 64-bit number.
    pub fn c_longlong(token: &[u8]) -> Option<i64> {
        let (negative, magnitude) = read(token)?;
        if negative {
            let magnitude = u64::try_from(magnitude).ok()?;
            0i64.checked_sub_unsigned(magnitude)
        } else {
            i64::try_from(magnitude).ok()
        }
    }

    /// memcached's `safe_strtol` into a 32-bit field: as [`c_longlong`], then the low 32
    /// bits.
    pub fn c_long(token: &[u8]) -> Option<i64> {
        #[allow(clippy::cast_possible_truncation)] // the C cast keeps the low bits
        c_longlong(token).map(|value| i64::from(value as i32))
    }
}

fn get<'a>(
    args: &[&'a [u8]],
    with_cas: bool,
    touch: Option<i64>,
) -> Result<Request<'a>, ProtocolError> {
    let keys = args.iter().map(|t| key(t)).collect::<Result<_, _>>()?;
    Ok(Request::Get {
        keys,
        with_cas,
        touch,
    })
}

fn delete<'a>(args: &[&'a [u8]], noreply: bool) -> Result<Request<'a>, ProtocolError> {
    // memcached still accepts a legacy time argument of 0.
    let valid = match args {
        [_] => true,
        [_, hold] => *hold == b"0" || noreply,
        [_, hold, _] => *hold == b"0" && noreply,
        _ => false,
    };
    if !valid {
        return Err(ProtocolError::BadDeleteFormat);
    }
    Ok(Request::Delete {
        key: key(args[0])?,
        noreply,
    })
}

fn arith<'a>(args: &[&'a [u8]], incr: bool, noreply: bool) -> Result<Request<'a>, ProtocolError> {
    let key = key(args[0])?;
    Ok(Request::Arith {
        incr,
        key,
        delta: number::c_ulonglong(args[1]).ok_or(ProtocolError::BadDelta)?,
        noreply,
    })
}

fn touch<'a>(args: &[&'a [u8]], noreply: bool) -> Result<Request<'a>, ProtocolError> {
    let key = key(args[0])?;
    Ok(Request::Touch {
        key,
        exptime: number::c_long(args[1]).ok_or(ProtocolError::BadExptime)?,
        noreply,
    })
}

fn flush_all<'a>(args: &[&'a [u8]], noreply: bool) -> Result<Request<'a>, ProtocolError> {
    // The delay is the first argument, unless the only one is `noreply`; one of 0 or less
    // flushes now.
    let delay = if args.len() == usize::from(noreply) {
        None
    } else {
        Some(number::c_long(args[0]).ok_or(ProtocolError::BadExptime)?)
    };
    Ok(Request::FlushAll {
        delay: delay.filter(|&d| d > 0),
        noreply,
    })
}

/// A storage command (its number of tokens checked): the line's arguments, then the data
/// block after the line.
fn store<'a>(
    buf: &'a [u8],
    line_len: usize,
    mode: StoreMode,
    args: &[&'a [u8]],
    noreply: bool,
    limits: &Limits,
) -> Parsed<'a> {
    let bad = || invalid(ProtocolError::BadFormat, Skip::Bytes(line_len), noreply);
    let Ok(key) = key(args[0]) else {
        return bad();
    };
    let (Some(flags), Some(exptime), Some(bytes)) = (
        number::c_ulong(args[1]),
        number::c_long(args[2]),
        number::c_long(args[3]),
    ) else {
        return bad();
    };
    let cas_unique = if mode == StoreMode::Cas {
        match number::c_ulonglong(args[4]) {
            Some(unique) => Some(unique),
            None => return bad(),
        }
    } else {
        None
    };
    // Non-negative, and below `INT_MAX - 2` as the C cast left it.
    let Some(bytes) = usize::try_from(bytes)
        .ok()
        .filter(|&b| b <= i32::MAX as usize - 2)
    else {
        return bad();
    };
    let total = line_len + bytes + 2;
    if bytes > limits.max_value {
        // memcached swallows the data block it will not store.
        return Parsed::Invalid {
            error: ProtocolError::TooLarge,
            skip: Skip::Bytes(total),
            noreply,
            unlink: (mode == StoreMode::Set).then_some(Cow::Borrowed(key)),
        };
    }
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    let data = &buf[line_len..line_len + bytes];
    if &buf[line_len + bytes..total] != b"\r\n" {
        // As memcached: the announced length is taken as it is, and parsing goes on after
        // it.
        return invalid(ProtocolError::BadDataChunk, Skip::Bytes(total), noreply);
    }
    Parsed::Request(
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            cas_unique,
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
                    with_cas: true,
                    touch: None,
                },
                16
            )
        );
        assert_eq!(
            one(b"get x\n"),
            Parsed::Request(
                Request::Get {
                    keys: vec![b"x"],
                    with_cas: false,
                    touch: None,
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
            assert_eq!(
                one(input),
                Parsed::Invalid {
                    error,
                    skip,
                    noreply: false,
                    unlink: None
                },
                "{input:?}"
            );
        };
        let unknown = ProtocolError::UnknownCommand;
        bad(b"frobnicate\r\n", unknown, Skip::Bytes(12));
        bad(b"\r\n", unknown, Skip::Bytes(2));
        bad(b"x\r\n", unknown, Skip::Bytes(3));
        bad(b"get\r\n", unknown, Skip::Bytes(5));
        bad(b"verbosity\r\n", unknown, Skip::Bytes(11));
        // A wrong number of arguments is an unknown command form.
        bad(b"set k 0 0\r\n", unknown, Skip::Bytes(11));
        bad(b"cas k 0 0 1\r\n", unknown, Skip::Bytes(13));
        bad(b"incr n\r\n", unknown, Skip::Bytes(8));
        bad(b"delete k 0 0 0\r\n", unknown, Skip::Bytes(16));
        let long_key = [b'k'; MAX_KEY_LEN + 1];
        bad(
            &[b"get ", &long_key[..], b"\r\n"].concat(),
            ProtocolError::BadFormat,
            Skip::Bytes(257),
        );
        // Any byte but the space is a key byte, a carriage return inside the line too;
        // a NUL ends the line, as it ends memcached's C string.
        for (input, key) in [
            (&b"get a\rb\r\n"[..], &b"a\rb"[..]),
            (b"get \x10\x00a\r\n", b"\x10"),
        ] {
            assert_eq!(
                one(input),
                Parsed::Request(
                    Request::Get {
                        keys: vec![key],
                        with_cas: false,
                        touch: None,
                    },
                    input.len()
                )
            );
        }
        bad(
            b"set k x 0 1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(13),
        );
        bad(
            b"set k 0 0 -1\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(14),
        );
        // A wrong data length: the announced length is taken, and parsing goes on after it.
        bad(
            b"set k 0 0 2\r\nabc\r\n",
            ProtocolError::BadDataChunk,
            Skip::Bytes(17),
        );
        bad(b"incr n -1\r\n", ProtocolError::BadDelta, Skip::Bytes(11));
        bad(
            b"incr n 18446744073709551616\r\n",
            ProtocolError::BadDelta,
            Skip::Bytes(29),
        );
        bad(b"touch k x\r\n", ProtocolError::BadExptime, Skip::Bytes(11));
        bad(b"gat x k\r\n", ProtocolError::BadExptime, Skip::Bytes(9));
        bad(
            b"delete k 1\r\n",
            ProtocolError::BadDeleteFormat,
            Skip::Bytes(12),
        );
        bad(b"version 2\r\n", ProtocolError::BadFormat, Skip::Bytes(11));
        // `version` takes no `noreply`: its error is sent.
        bad(
            b"version noreply\r\n",
            ProtocolError::BadFormat,
            Skip::Bytes(17),
        );
        bad(
            b"shutdown\r\n",
            ProtocolError::ShutdownDisabled,
            Skip::Bytes(10),
        );
        bad(b"GET / HTTP/1.1\r\n", ProtocolError::Http, Skip::Close);
    }

    #[test]
    fn noreply_silences_argument_errors_and_limits_hold() {
        let unknown = ProtocolError::UnknownCommand;
        // `noreply` silences a command's argument errors, not an unknown form.
        assert_eq!(
            one(b"touch k x noreply\r\n"),
            Parsed::Invalid {
                error: ProtocolError::BadExptime,
                skip: Skip::Bytes(19),
                noreply: true,
                unlink: None,
            }
        );
        assert_eq!(
            one(b"touch k 1 2 noreply\r\n"),
            Parsed::Invalid {
                error: unknown,
                skip: Skip::Bytes(21),
                noreply: false,
                unlink: None,
            }
        );
        // Without a level, `noreply` alone is taken as a malformed level, whose error it
        // silences.
        assert_eq!(
            one(b"verbosity noreply\r\n"),
            Parsed::Invalid {
                error: ProtocolError::BadFormat,
                skip: Skip::Bytes(19),
                noreply: true,
                unlink: None,
            }
        );
        let limits = Limits {
            max_value: 4,
            max_line: 16,
        };
        // A `set` too large to store takes the key's older item with it.
        assert_eq!(
            parse(b"set k 0 0 5\r\nabc", &limits),
            Parsed::Invalid {
                error: ProtocolError::TooLarge,
                skip: Skip::Bytes(13 + 5 + 2),
                noreply: false,
                unlink: Some(Cow::Borrowed(&b"k"[..])),
            }
        );
        assert_eq!(
            parse(&[b'g'; 17], &limits),
            Parsed::Invalid {
                error: ProtocolError::LineTooLong,
                skip: Skip::Close,
                noreply: false,
                unlink: None,
            }
        );
    }

    #[test]
    fn numbers_are_read_as_memcached_reads_them() {
        use super::number::{c_long, c_ulong, c_ulonglong};
        assert_eq!(c_ulonglong(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(c_ulonglong(b"18446744073709551616"), None);
        assert_eq!(c_ulonglong(b"+5"), Some(5));
        assert_eq!(c_ulonglong(b"-0"), Some(0));
        assert_eq!(c_ulonglong(b"-5"), None);
        assert_eq!(c_ulonglong(b"\t7"), Some(7));
        assert_eq!(c_ulonglong(b"7\tx"), Some(7));
        assert_eq!(c_ulonglong(b"7x"), None);
        assert_eq!(c_ulonglong(b""), None);
        // 32-bit fields keep the low bits, as the C casts do.
        assert_eq!(c_ulong(b"4294967296"), Some(0));
        assert_eq!(c_long(b"4294967295"), Some(-1));
        assert_eq!(c_long(b"-2147483649"), Some(i64::from(i32::MAX)));
        assert_eq!(c_long(b"99999999999999999999"), None);
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
