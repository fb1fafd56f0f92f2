//! memcached's meta protocol: `mg`, `ms`, `md`, `ma`, `mn` and `me`, request for request and
//! reply for reply as memcached 1.6 speaks it (the differential tests compare).
//!
//! A meta command is a two-letter name, a key, and flags: single characters, some with a
//! token after them (`T30`, `Oopaque`). The parser checks them as memcached does, with its
//! error strings; [`execute`] runs the command on the [`Store`] and writes the reply: a
//! two-letter code (`HD`, `VA`, `EN`, `NF`, `NS`, `EX`, `MN`, `ME`) and the flags asked
//! for, in the order asked. Every change a meta command makes is one store update, as durable
//! as the classic commands' (and its reply waits for durability as theirs do).
//!
//! Besides the classic commands' state, meta commands use two marks stored with each item
//! (stale, and that a client was told it won the right to recache it: `X`, `W` and `Z`) and
//! two things kept in DRAM only, as memcached keeps them (whether the item was read since it
//! was stored and when it was last used: `h` and `l`; after a restart, not read and last
//! used when stored).

use std::borrow::Cow;
use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use montage_collections::Change;

use crate::protocol::{
    Limits, MAX_KEY_LEN, Parsed, ProtocolError, Request, Skip, StoreMode, invalid, number,
    push_number,
};
use crate::store::{Clock, Item, Lookup, Store, absolute};

/// Which meta command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `mg`: get, touch, vivify.
    Get,
    /// `ms`: set (or add, replace, append, prepend, compare-and-set).
    Set,
    /// `md`: delete, or mark stale.
    Delete,
    /// `ma`: increment or decrement.
    Arith,
    /// `me`: an item's metadata, readable.
    Debug,
    /// `mn`: nothing; its reply marks the end of a pipeline.
    Noop,
}

/// What a meta command's flags ask for, parsed (memcached's "preparse").
// One field per flag of the protocol's: the bools are independent switches, not a state.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// `q`: no reply for the nominal outcome (a miss for `mg`, `HD` for the others).
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `u`: do not bump the item in the recency order.
    pub no_bump: bool,
    /// `I`: invalidate (mark stale) rather than delete; with `ms`, store an older cas as
    /// stale.
    pub invalidate: bool,
    /// `N`: create the item on a miss, with this expiry.
    pub vivify: Option<i64>,
    /// `T`: the new expiry.
    pub ttl: Option<i64>,
    /// `R`: win the right to recache if the item expires sooner than this.
    pub recache: Option<i64>,
    /// `F`: the client flags to store.
    pub client_flags: u32,
    /// `C`: the cas unique to compare.
    pub cas: Option<u64>,
    /// `M`: the mode character.
    pub mode: Option<u8>,
    /// `J`: the initial value of an `ma` that creates its item.
    pub initial: u64,
    /// `D`: the delta of an `ma` (1 unless given).
    pub delta: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quiet: false,
            value: false,
            no_bump: false,
            invalidate: false,
            vivify: None,
            ttl: None,
            recache: None,
            client_flags: 0,
            cas: None,
            mode: None,
            initial: 0,
            delta: 1,
        }
    }
}

/// One meta request. The key is decoded if it came base64-encoded (`b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta<'a> {
    /// Which command.
    pub command: Command,
    /// The key (empty for `mn`).
    pub key: Cow<'a, [u8]>,
    /// The key came base64-encoded, and goes back so.
    pub base64: bool,
    /// The flag tokens, in request order (replies follow it).
    pub flags: Vec<&'a [u8]>,
    /// The flags, parsed.
    pub options: Options,
    /// `ms`'s data block.
    pub data: &'a [u8],
}

/// memcached's limit on a meta command's tokens (its `MFLAG_MAX_OPT_LENGTH`), counted as it
/// counts them: the command's, the key's, the flags' and a terminator.
const MAX_TOKENS: usize = 20;

/// The longest opaque token (`O`), its flag character included.
const MAX_OPAQUE: usize = 32;

/// Parses a meta command whose line (`line_len` bytes with its end) holds `name` and `args`;
/// `ms`'s data block follows the line in `buf`.
pub(crate) fn parse<'a>(
    buf: &'a [u8],
    line_len: usize,
    name: &[u8],
    args: &[&'a [u8]],
    limits: &Limits,
) -> Parsed<'a> {
    let line = Skip::Bytes(line_len);
    let command = match name.get(1) {
        Some(b'g') => Command::Get,
        Some(b's') => Command::Set,
        Some(b'd') => Command::Delete,
        Some(b'a') => Command::Arith,
        Some(b'e') => Command::Debug,
        Some(b'n') => Command::Noop,
        _ => return invalid(ProtocolError::UnknownCommand, line, false),
    };
    let request = |key, base64, flags, options, data| {
        Request::Meta(Meta {
            command,
            key,
            base64,
            flags,
            options,
            data,
        })
    };
    // memcached's count of tokens: the command's, the arguments' and a terminator.
    let tokens = args.len() + 2;
    match command {
        Command::Noop => {
            let noop = request(
                Cow::Borrowed(&[][..]),
                false,
                Vec::new(),
                Options::default(),
                &[],
            );
            return Parsed::Request(noop, line_len);
        }
        Command::Debug => {
            let Some(&key) = args.first().filter(|key| key.len() <= MAX_KEY_LEN) else {
                return invalid(ProtocolError::BadFormat, line, false);
            };
            let (key, base64) = if args.get(1) == Some(&&b"b"[..]) {
                match decode(key) {
                    Some(key) => (Cow::Owned(key), true),
                    None => return invalid(ProtocolError::BadFormat, line, false),
                }
            } else {
                (Cow::Borrowed(key), false)
            };
            let debug = request(key, base64, Vec::new(), Options::default(), &[]);
            return Parsed::Request(debug, line_len);
        }
        _ => {}
    }
    let Some(&key) = args.first() else {
        return invalid(ProtocolError::UnknownCommand, line, false);
    };
    if key.len() > MAX_KEY_LEN {
        return invalid(ProtocolError::BadFormat, line, false);
    }
    if command == Command::Set {
        return set(buf, line_len, key, &args[1..], limits);
    }
    if tokens > MAX_TOKENS {
        let error = if command == Command::Get {
            ProtocolError::MetaGetFlagsTooLong
        } else {
            ProtocolError::MetaFlagsTooLong
        };
        return invalid(error, line, false);
    }
    let flags = &args[1..];
    let (key, base64, options) = match preparse(key, flags) {
        Ok(parsed) => parsed,
        // memcached reports any flag error of these two the same way.
        Err(_) if command != Command::Get => {
            return invalid(ProtocolError::MetaInvalidOrDuplicateFlag, line, false);
        }
        Err(error) => return invalid(error, line, false),
    };
    if command == Command::Arith && !matches!(options.mode, None | Some(b'I' | b'+' | b'D' | b'-'))
    {
        return invalid(ProtocolError::MetaArithMode, line, false);
    }
    if opaque_too_long(flags) {
        return invalid(ProtocolError::MetaOpaqueTooLong, line, false);
    }
    Parsed::Request(request(key, base64, flags.to_vec(), options, &[]), line_len)
}

/// `ms` (its key checked): the length and flags on the line, then the data block. Errors
/// after the length is known swallow the data block, as memcached does.
fn set<'a>(
    buf: &'a [u8],
    line_len: usize,
    key: &'a [u8],
    args: &[&'a [u8]],
    limits: &Limits,
) -> Parsed<'a> {
    let line = Skip::Bytes(line_len);
    let Some(&length) = args.first() else {
        return invalid(ProtocolError::BadFormat, line, false);
    };
    if args.len() + 3 > MAX_TOKENS {
        return invalid(ProtocolError::MetaFlagsTooLong, line, false);
    }
    // Non-negative, and below `INT_MAX - 2` as the C cast left it.
    let Some(length) = number::c_long(length)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= i32::MAX as usize - 2)
    else {
        return invalid(ProtocolError::BadFormat, line, false);
    };
    let total = line_len + length + 2;
    let swallow = |error| invalid(error, Skip::Bytes(total), false);
    let flags = &args[1..];
    let (key, base64, options) = match preparse(key, flags) {
        Ok(parsed) => parsed,
        Err(error) => return swallow(error),
    };
    if opaque_too_long(flags) {
        return swallow(ProtocolError::MetaOpaqueTooLong);
    }
    if !matches!(options.mode, None | Some(b'E' | b'A' | b'P' | b'R' | b'S')) {
        return swallow(ProtocolError::MetaSetMode);
    }
    if length > limits.max_value {
        // As memcached: the older value goes rather than stay stale.
        return Parsed::Invalid {
            error: ProtocolError::TooLarge,
            skip: Skip::Bytes(total),
            noreply: false,
            unlink: Some(key),
        };
    }
    if buf.len() < total {
        return Parsed::Incomplete;
    }
    if &buf[line_len + length..total] != b"\r\n" {
        // A meta set's errors are always replied.
        return swallow(ProtocolError::BadDataChunk);
    }
    let data = &buf[line_len..line_len + length];
    let meta = Meta {
        command: Command::Set,
        key,
        base64,
        flags: flags.to_vec(),
        options,
        data,
    };
    Parsed::Request(Request::Meta(meta), total)
}

fn opaque_too_long(flags: &[&[u8]]) -> bool {
    flags
        .iter()
        .any(|flag| flag.first() == Some(&b'O') && flag.len() > MAX_OPAQUE)
}

/// A base64 key decoded as memcached's decoder reads it (which is what clients of
/// memcached rely on): bytes outside the alphabet are skipped, the others must come in
/// groups of four, and decoding ends with the first group that holds padding. `None` where
/// that decoder gives nothing.
fn decode(key: &[u8]) -> Option<Vec<u8>> {
    let value = |b: u8| match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        b'=' => Some(0),
        _ => None,
    };
    let count = key.iter().filter(|&&b| value(b).is_some()).count();
    if count == 0 || count % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(count / 4 * 3);
    let (mut block, mut filled, mut pad) = ([0u8; 4], 0, 0);
    for &b in key {
        let Some(v) = value(b) else { continue };
        pad += usize::from(b == b'=');
        block[filled] = v;
        filled += 1;
        if filled == 4 {
            out.extend([
                block[0] << 2 | block[1] >> 4,
                block[1] << 4 | block[2] >> 2,
                block[2] << 6 | block[3],
            ]);
            filled = 0;
            if pad > 0 {
                // One or two padding characters drop as many bytes; more is invalid.
                out.truncate(out.len().checked_sub(pad).filter(|_| pad <= 2)?);
                break;
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The flags checked and parsed, and the key (decoded if `b` asks), as memcached's
/// `_meta_flag_preparse`: a repeated or unknown flag ends the check at once; a bad token is
/// noted and the check goes on, the last such error being the one reported.
fn preparse<'a>(
    key: &'a [u8],
    flags: &[&[u8]],
) -> Result<(Cow<'a, [u8]>, bool, Options), ProtocolError> {
    let mut options = Options::default();
    let mut seen = [false; 127];
    let mut error = None;
    // memcached's default error string, for a bad `F` (which sets no string of its own).
    let mut reported = ProtocolError::BadFormat;
    let mut fail = |e: Option<ProtocolError>| {
        if let Some(e) = e {
            reported = e;
        }
        error = Some(reported);
    };
    let mut decoded = Cow::Borrowed(key);
    let mut base64 = false;
    for flag in flags {
        let (&c, arg) = flag.split_first().unwrap_or((&0, &[]));
        match seen.get_mut(usize::from(c)) {
            Some(seen) if !*seen => *seen = true,
            _ => return Err(ProtocolError::MetaDuplicateFlag),
        }
        let bad_token = Some(ProtocolError::MetaBadToken);
        match c {
            b'b' => {
                base64 = true;
                match decode(key) {
                    Some(key) => decoded = Cow::Owned(key),
                    None => fail(Some(ProtocolError::MetaKeyDecode)),
                }
            }
            b'N' => match number::c_long(arg) {
                Some(t) => options.vivify = Some(t),
                None => fail(bad_token),
            },
            b'T' => match number::c_long(arg) {
                Some(t) => options.ttl = Some(t),
                None => fail(bad_token),
            },
            b'R' => match number::c_long(arg) {
                Some(t) => options.recache = Some(t),
                None => fail(bad_token),
            },
            b'C' => match number::c_ulonglong(arg) {
                Some(cas) => options.cas = Some(cas),
                None => fail(bad_token),
            },
            b'F' => match number::c_ulong(arg) {
                Some(f) => options.client_flags = f,
                None => fail(None),
            },
            b'M' => match arg {
                [mode] => options.mode = Some(*mode),
                _ => fail(Some(ProtocolError::MetaModeLength)),
            },
            b'J' => match number::c_ulonglong(arg) {
                Some(n) => options.initial = n,
                None => fail(Some(ProtocolError::MetaInitial)),
            },
            b'D' => match number::c_ulonglong(arg) {
                Some(n) => options.delta = n,
                None => fail(Some(ProtocolError::MetaDelta)),
            },
            b'v' => options.value = true,
            b'u' => options.no_bump = true,
            b'q' => options.quiet = true,
            b'I' => options.invalidate = true,
            b'l' | b'h' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' => {}
            _ => return Err(ProtocolError::MetaInvalidFlag),
        }
    }
    match error {
        Some(error) => Err(error),
        None => Ok((decoded, base64, options)),
    }
}

/// A statistic a meta command counts, as memcached counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tally {
    /// A get (`cmd_get`) that found its item (`get_hits`).
    GetHit,
    /// A get that did not (`get_misses`).
    GetMiss,
    /// A get that found its item expired (`get_expired`), counted with [`Tally::GetMiss`].
    GetExpired,
    /// A get that found its item flushed (`get_flushed`), counted with [`Tally::GetMiss`].
    GetFlushed,
    /// A get that set a new expiry (`cmd_touch`, `touch_hits`).
    TouchHit,
    /// A storage command (`cmd_set`).
    Set,
    /// An item stored (`total_items`).
    Stored,
    /// A compare-and-set that matched (`cas_hits`).
    CasHit,
    /// One that did not (`cas_badval`).
    CasBadval,
    /// One whose item was missing (`cas_misses`).
    CasMiss,
    /// A delete that deleted (`delete_hits`).
    DeleteHit,
    /// One that did not (`delete_misses`).
    DeleteMiss,
    /// `incr`/`decr` (`incr` true) that found its item.
    ArithHit(bool),
    /// One that did not.
    ArithMiss(bool),
    /// `me` (`cmd_meta`).
    Debug,
}

/// Runs `meta` on `store`, appending its reply (if any) to `out` and counting what it did
/// with `tally`. Returns whether it changed the cache (its reply must wait for durability).
///
/// # Errors
///
/// A heap error (nothing is appended).
pub fn execute<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    match meta.command {
        Command::Noop => {
            out.extend_from_slice(b"MN\r\n");
            Ok(false)
        }
        Command::Debug => debug(store, meta, out, tally),
        Command::Get => get(store, meta, out, tally),
        Command::Set => set_item(store, meta, out, tally),
        Command::Delete => delete(store, meta, out, tally),
        Command::Arith => arith(store, meta, out, tally),
    }
}

/// The reply's echo of the key (`k`), base64-encoded (and marked ` b`) if it came so.
fn push_key(line: &mut Vec<u8>, meta: &Meta<'_>) {
    line.extend_from_slice(b" k");
    if meta.base64 {
        line.extend_from_slice(BASE64.encode(&meta.key).as_bytes());
        line.extend_from_slice(b" b");
    } else {
        line.extend_from_slice(&meta.key);
    }
}

/// A reply without an item: `code`, then the echo of the opaque token (`O`) and the key
/// (`k`) in request order, and, for `ms`, the cas unique (`c`) it stored (`cas`: 0 if
/// none).
fn push_status(out: &mut Vec<u8>, code: &[u8], meta: &Meta<'_>, cas: Option<u64>) {
    out.extend_from_slice(code);
    for flag in &meta.flags {
        match flag.first() {
            Some(b'O') => {
                out.push(b' ');
                out.extend_from_slice(flag);
            }
            Some(b'k') => push_key(out, meta),
            Some(b'c') if let Some(cas) = cas => {
                push_number(out, b" c", cas);
            }
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// An expiry as memcached reports the time left: `-1` for never, else seconds.
fn ttl(exptime: i64, now: i64) -> i64 {
    if exptime == 0 { -1 } else { exptime - now }
}

/// `mg`.
fn get<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    let key = &meta.key[..];
    let o = &meta.options;
    let changes = o.ttl.is_some() || o.vivify.is_some() || o.recache.is_some();
    if !changes {
        // A read, unless the item is stale and no client was told it won yet. Whether it
        // was read before and when it was last used are read only if asked for (`h`, `l`),
        // before the bump.
        let asks_access = meta
            .flags
            .iter()
            .any(|f| matches!(f.first(), Some(b'h' | b'l')));
        let found = if asks_access || o.no_bump {
            store.lookup_quietly(key)?
        } else {
            store.lookup(key)?
        };
        match found {
            Lookup::Hit(item) if !item.stale || item.won => {
                let access = if asks_access {
                    store.access(key, &item)
                } else {
                    (false, 0)
                };
                if asks_access && !o.no_bump {
                    store.bump(key, &item);
                }
                hit(meta, item, false, access, store.now(), out);
                tally(Tally::GetHit);
                return Ok(false);
            }
            Lookup::Hit(_) => {}
            missed => {
                match missed {
                    Lookup::Expired => tally(Tally::GetExpired),
                    Lookup::Flushed => tally(Tally::GetFlushed),
                    _ => {}
                }
                tally(Tally::GetMiss);
                miss(meta, out);
                return Ok(false);
            }
        }
    }
    let found = store.update(key, |current, now| {
        let (item, created) = match current {
            Some(item) => (item, false),
            None if o.vivify.is_some() => (Item::fresh(0, 0, now, store.cas(), Vec::new()), true),
            None => return (Change::Keep, None),
        };
        let access = if created {
            (false, now)
        } else {
            store.access(key, &item)
        };
        let mut line = Vec::new();
        let (item, ttl_set, flags_changed) = hit(meta, item, created, access, now, &mut line);
        let wrote = created || flags_changed;
        let change = if wrote {
            Change::Set(item.clone())
        } else {
            Change::Keep
        };
        (change, Some((item, line, ttl_set, created, wrote)))
    })?;
    let Some((item, line, ttl_set, created, wrote)) = found else {
        tally(Tally::GetMiss);
        miss(meta, out);
        return Ok(false);
    };
    if !o.no_bump {
        store.bump(key, &item);
    }
    out.extend_from_slice(&line);
    tally(if ttl_set {
        Tally::TouchHit
    } else {
        Tally::GetHit
    });
    if created {
        tally(Tally::Stored);
    }
    Ok(wrote)
}

/// Appends to `line` `mg`'s reply for a found (or just created) item, following its flags in
/// order; returns the item as the flags leave it (a new expiry, the win mark), whether `T` set
/// the expiry, and whether the flags changed the item. `access` is whether the item was read
/// before and when it was last used.
fn hit(
    meta: &Meta<'_>,
    mut item: Item,
    created: bool,
    access: (bool, i64),
    now: i64,
    line: &mut Vec<u8>,
) -> (Item, bool, bool) {
    let o = &meta.options;
    let absolute = |exptime: Option<i64>| absolute(exptime.unwrap_or(0), now);
    let token_sent = item.won;
    let exptime = item.exptime;
    let mut won = false;
    let mut ttl_set = false;
    if o.value {
        push_number(line, b"VA ", item.data.len());
    } else {
        line.extend_from_slice(b"HD");
    }
    for flag in &meta.flags {
        match flag.first().copied().unwrap_or_default() {
            b'T' => {
                item.exptime = absolute(o.ttl);
                ttl_set = true;
            }
            b'N' if created => {
                item.exptime = absolute(o.vivify);
                won = true;
            }
            b'R' if !token_sent
                && !created
                && item.exptime != 0
                && item.exptime < absolute(o.recache) =>
            {
                won = true;
            }
            b's' => {
                push_number(line, b" s", item.data.len());
            }
            b't' => {
                push_number(line, b" t", ttl(item.exptime, now));
            }
            b'c' => {
                push_number(line, b" c", item.cas);
            }
            b'f' => {
                push_number(line, b" f", item.flags);
            }
            b'l' => {
                push_number(line, b" l", (now - access.1).max(0));
            }
            b'h' => {
                push_number(line, b" h", u8::from(access.0));
            }
            b'O' => {
                line.push(b' ');
                line.extend_from_slice(flag);
            }
            b'k' => push_key(line, meta),
            _ => {}
        }
    }
    // Told already: `Z` (before any `W`, as memcached orders them).
    if token_sent {
        line.extend_from_slice(b" Z");
    }
    if item.stale {
        line.extend_from_slice(b" X");
        if !token_sent {
            won = true;
        }
    }
    if won {
        line.extend_from_slice(b" W");
        item.won = true;
    }
    line.extend_from_slice(b"\r\n");
    if o.value {
        line.extend_from_slice(&item.data);
        line.extend_from_slice(b"\r\n");
    }
    // Only the expiry and the win mark can have changed.
    let changed = item.exptime != exptime || item.won != token_sent;
    (item, ttl_set, changed)
}

/// `mg`'s reply for a miss: `EN` with the echoes, or nothing with `q`.
fn miss(meta: &Meta<'_>, out: &mut Vec<u8>) {
    if meta.options.quiet {
        return;
    }
    push_status(out, b"EN", meta, None);
}

/// The outcome of an `ms`, `md` or `ma`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// `HD` (or `VA` for an `ma` with `v`).
    Done,
    /// `NS`.
    NotStored,
    /// `EX`.
    Exists,
    /// `NF`.
    NotFound,
}

impl Code {
    fn text(self) -> &'static [u8] {
        match self {
            Code::Done => b"HD",
            Code::NotStored => b"NS",
            Code::Exists => b"EX",
            Code::NotFound => b"NF",
        }
    }
}

/// `ms`.
fn set_item<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    let o = &meta.options;
    let mut mode = match o.mode {
        Some(b'E') => StoreMode::Add,
        Some(b'A') => StoreMode::Append,
        Some(b'P') => StoreMode::Prepend,
        Some(b'R') => StoreMode::Replace,
        _ => StoreMode::Set,
    };
    // A cas unique makes a set or replace a compare-and-set.
    if o.cas.is_some() && matches!(mode, StoreMode::Set | StoreMode::Replace) {
        mode = StoreMode::Cas;
    }
    let given = o.cas.unwrap_or(0);
    let (code, cas) = if mode == StoreMode::Set {
        // Whatever the key held: no need to read it.
        let cas = store.set(&meta.key, o.client_flags, o.ttl.unwrap_or(0), meta.data)?;
        (Code::Done, cas)
    } else {
        set_with(store, meta, mode, given)?
    };
    tally(Tally::Set);
    if code == Code::Done {
        tally(Tally::Stored);
    }
    if mode == StoreMode::Cas {
        tally(match code {
            Code::Done => Tally::CasHit,
            Code::NotFound => Tally::CasMiss,
            _ => Tally::CasBadval,
        });
    }
    if code == Code::Done && o.quiet {
        return Ok(true);
    }
    push_status(out, code.text(), meta, Some(cas));
    Ok(true)
}

/// `ms` in a mode that reads the item it replaces (add, replace, append, prepend, or a
/// compare-and-set): the code, and the cas unique stored (0 if none).
fn set_with<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    mode: StoreMode,
    given: u64,
) -> montage_core::Result<(Code, u64)> {
    let o = &meta.options;
    store.update(&meta.key, |current, now| {
        let fresh = |data| {
            let exptime = absolute(o.ttl.unwrap_or(0), now);
            Item::fresh(o.client_flags, exptime, now, store.cas(), data)
        };
        let stored = |item: Item| {
            let cas = item.cas;
            (Change::Set(item), (Code::Done, cas))
        };
        let not = |code| (Change::Keep, (code, 0));
        match (mode, current) {
            (StoreMode::Set | StoreMode::Add, None)
            | (StoreMode::Set | StoreMode::Replace, Some(_)) => stored(fresh(meta.data.to_vec())),
            (StoreMode::Add, Some(_))
            | (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                not(Code::NotStored)
            }
            (StoreMode::Cas, None) => not(Code::NotFound),
            (StoreMode::Cas, Some(old)) if given != 0 && given == old.cas => {
                stored(fresh(meta.data.to_vec()))
            }
            // An older cas with `I`: stored, but stale, keeping the expiry and the win mark.
            (StoreMode::Cas, Some(old)) if o.invalidate && given != 0 && given < old.cas => {
                stored(Item {
                    exptime: old.exptime,
                    stale: true,
                    won: old.won,
                    ..fresh(meta.data.to_vec())
                })
            }
            (StoreMode::Cas, Some(_)) => not(Code::Exists),
            (StoreMode::Append | StoreMode::Prepend, Some(old)) => {
                if given != 0 && given != old.cas {
                    return not(Code::Exists);
                }
                let data = if mode == StoreMode::Append {
                    [&old.data[..], meta.data].concat()
                } else {
                    [meta.data, &old.data[..]].concat()
                };
                stored(Item {
                    flags: old.flags,
                    exptime: old.exptime,
                    ..fresh(data)
                })
            }
        }
    })
}

/// `md`.
fn delete<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    let o = &meta.options;
    let code = store.update(&meta.key, |current, now| match current {
        None => (Change::Keep, Code::NotFound),
        Some(old) if o.cas.is_some_and(|cas| cas != old.cas) => (Change::Keep, Code::Exists),
        // Marked stale with a new cas unique (and expiry, if given); the next client to
        // get it wins the right to recache it.
        Some(old) if o.invalidate => {
            let exptime = match o.ttl {
                Some(ttl) => absolute(ttl, now),
                None => old.exptime,
            };
            let item = Item {
                exptime,
                cas: store.cas(),
                stale: true,
                won: false,
                ..old
            };
            (Change::Set(item), Code::Done)
        }
        Some(_) => (Change::Remove, Code::Done),
    })?;
    match code {
        Code::Done if !o.invalidate => tally(Tally::DeleteHit),
        Code::Done => {}
        _ => tally(Tally::DeleteMiss),
    }
    if code == Code::Done && o.quiet {
        return Ok(true);
    }
    push_status(out, code.text(), meta, None);
    Ok(true)
}

/// What an `ma` found.
enum Arith {
    /// The item was changed (or created): its reply line.
    Done(Vec<u8>, bool),
    NotFound,
    Exists,
    NonNumeric,
}

/// `ma`'s new item (or the item it creates): the item, its number as the reply gives it,
/// and whether it was created; or why there is none.
fn arithmetic<C: Clock>(
    store: &Store<C>,
    o: &Options,
    current: Option<Item>,
    now: i64,
    incr: bool,
) -> Result<(Item, Vec<u8>, bool), Arith> {
    let Some(old) = current else {
        if o.vivify.is_none() {
            return Err(Arith::NotFound);
        }
        let number = o.initial.to_string().into_bytes();
        let item = Item::fresh(0, 0, now, store.cas(), number.clone());
        return Ok((item, number, true));
    };
    if old.data.is_empty() {
        return Err(Arith::NonNumeric);
    }
    if o.cas.is_some_and(|cas| cas != 0 && cas != old.cas) {
        return Err(Arith::Exists);
    }
    let (item, new) = crate::store::incremented(&old, incr, o.delta, now, store.cas())
        .ok_or(Arith::NonNumeric)?;
    Ok((item, new.to_string().into_bytes(), false))
}

/// `ma`.
fn arith<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    let o = &meta.options;
    let incr = !matches!(o.mode, Some(b'D' | b'-'));
    let result = store.update(&meta.key, |current, now| {
        let (mut item, number, created) = match arithmetic(store, o, current, now, incr) {
            Ok(changed) => changed,
            Err(outcome) => return (Change::Keep, outcome),
        };
        let mut line = Vec::with_capacity(64);
        if o.value {
            push_number(&mut line, b"VA ", number.len());
        } else {
            line.extend_from_slice(b"HD");
        }
        for flag in &meta.flags {
            match flag.first().copied().unwrap_or_default() {
                b'c' => {
                    push_number(&mut line, b" c", item.cas);
                }
                b't' => {
                    push_number(&mut line, b" t", ttl(item.exptime, now));
                }
                b'T' => item.exptime = absolute(o.ttl.unwrap_or(0), now),
                b'N' if created => {
                    item.exptime = absolute(o.vivify.unwrap_or(0), now);
                }
                b'O' => {
                    line.push(b' ');
                    line.extend_from_slice(flag);
                }
                b'k' => push_key(&mut line, meta),
                _ => {}
            }
        }
        if o.value {
            line.extend_from_slice(b"\r\n");
            line.extend_from_slice(&number);
        }
        line.extend_from_slice(b"\r\n");
        (Change::Set(item), Arith::Done(line, created))
    })?;
    let code = match result {
        Arith::Done(line, created) => {
            if created {
                tally(Tally::Stored);
            } else {
                tally(Tally::ArithHit(incr));
            }
            // A created item's reply is sent even with `q`, as memcached does.
            if !o.quiet || created {
                out.extend_from_slice(&line);
            }
            return Ok(true);
        }
        Arith::NonNumeric => {
            out.extend_from_slice(
                b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
            );
            return Ok(false);
        }
        Arith::NotFound => {
            tally(Tally::ArithMiss(incr));
            Code::NotFound
        }
        Arith::Exists => Code::Exists,
    };
    push_status(out, code.text(), meta, None);
    Ok(false)
}

/// `me`: `ME <key> exp=.. la=.. cas=.. fetch=.. cls=.. size=..` or `EN`. memcached's
/// `exp` is the current time minus the expiry time (negative for an item that has not
/// expired), and this server prints it so; `cls` (memcached's slab class) is 1 and
/// `size` is the bytes of the item's block in the heap.
fn debug<C: Clock>(
    store: &Store<C>,
    meta: &Meta<'_>,
    out: &mut Vec<u8>,
    tally: &mut dyn FnMut(Tally),
) -> montage_core::Result<bool> {
    tally(Tally::Debug);
    let key = &meta.key[..];
    let Lookup::Hit(item) = store.lookup_quietly(key)? else {
        out.extend_from_slice(b"EN\r\n");
        return Ok(false);
    };
    let now = store.now();
    let (fetched, accessed) = store.access(key, &item);
    out.extend_from_slice(b"ME ");
    if meta.base64 {
        out.extend_from_slice(BASE64.encode(key).as_bytes());
    } else {
        out.extend_from_slice(key);
    }
    let exp = if item.exptime == 0 {
        -1
    } else {
        now - item.exptime
    };
    let _ = write!(
        out,
        " exp={exp} la={} cas={} fetch={} cls=1 size={}\r\n",
        (now - accessed).max(0),
        item.cas,
        if fetched { "yes" } else { "no" },
        crate::store::block(key, &item),
    );
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::parse;

    fn one(input: &[u8]) -> Parsed<'_> {
        parse(input, &Limits::default())
    }

    fn meta(input: &[u8]) -> Meta<'_> {
        match one(input) {
            Parsed::Request(Request::Meta(meta), _) => meta,
            other => panic!("{other:?}"),
        }
    }

    fn error(input: &[u8]) -> (ProtocolError, Skip) {
        match one(input) {
            Parsed::Invalid { error, skip, .. } => (error, skip),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flags_are_parsed_in_order_with_their_tokens() {
        let get = meta(b"mg key v T30 Oab k N-1 q\r\n");
        assert_eq!(get.command, Command::Get);
        assert_eq!(&get.key[..], b"key");
        let flags: Vec<&[u8]> = vec![b"v", b"T30", b"Oab", b"k", b"N-1", b"q"];
        assert_eq!(get.flags, flags);
        assert!(get.options.value && get.options.quiet);
        assert_eq!((get.options.ttl, get.options.vivify), (Some(30), Some(-1)));
        assert_eq!(get.options.delta, 1);
        let input = b"ms key 3 F7 C9 MA I\r\nabc\r\nmn\r\n";
        match one(input) {
            Parsed::Request(Request::Meta(set), used) => {
                assert_eq!((set.command, set.data), (Command::Set, &b"abc"[..]));
                assert_eq!(set.options.client_flags, 7);
                assert_eq!(set.options.cas, Some(9));
                assert_eq!(set.options.mode, Some(b'A'));
                assert!(set.options.invalidate);
                assert_eq!(used, input.len() - 4);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(meta(b"mn\r\n").command, Command::Noop);
        let arith = meta(b"ma n D5 J2 N0 MD\r\n");
        assert_eq!((arith.options.delta, arith.options.initial), (5, 2));
    }

    #[test]
    fn errors_are_memcached_s_and_a_meta_set_s_data_is_swallowed() {
        let line = |input: &[u8]| Skip::Bytes(input.len());
        for (input, expected) in [
            (&b"mg k v v\r\n"[..], ProtocolError::MetaDuplicateFlag),
            (b"mg k z\r\n", ProtocolError::MetaInvalidFlag),
            (b"mg k Tx\r\n", ProtocolError::MetaBadToken),
            // The last error noted is the one reported.
            (b"mg k Tx M\r\n", ProtocolError::MetaModeLength),
            (b"mg k Fx\r\n", ProtocolError::BadFormat),
            (b"md k z\r\n", ProtocolError::MetaInvalidOrDuplicateFlag),
            (b"ma k MX\r\n", ProtocolError::MetaArithMode),
            (
                b"mg k a b c d e f g h i j k l m n o p q r\r\n",
                ProtocolError::MetaGetFlagsTooLong,
            ),
            (b"mg\r\n", ProtocolError::UnknownCommand),
            (b"mz k\r\n", ProtocolError::UnknownCommand),
            (b"ms k\r\n", ProtocolError::BadFormat),
            (b"ms k -1\r\n", ProtocolError::BadFormat),
        ] {
            assert_eq!(error(input), (expected, line(input)), "{input:?}");
        }
        // Past the length, an error swallows the data block too.
        let input = b"ms k 3 MX\r\nabc\r\n";
        assert_eq!(
            error(input),
            (ProtocolError::MetaSetMode, Skip::Bytes(input.len()))
        );
        let input = b"ms k 1\r\nabc\r\n";
        assert_eq!(
            error(input),
            (
                ProtocolError::BadDataChunk,
                Skip::Bytes(b"ms k 1\r\nabc".len())
            )
        );
        assert_eq!(one(b"ms k 3\r\nab"), Parsed::Incomplete);
    }

    #[test]
    fn base64_keys_decode_as_memcached_decodes_them() {
        assert_eq!(decode(b"Zm9vYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(decode(b"Zm9vYg==").as_deref(), Some(&b"foob"[..]));
        assert_eq!(decode(b"Zm8=").as_deref(), Some(&b"fo"[..]));
        // Bytes outside the alphabet are skipped; the rest must come in fours.
        assert_eq!(decode(b"Zm9v-YmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(decode(b"Zm9"), None);
        assert_eq!(decode(b"----"), None);
        // Decoding ends at the first group with padding; three pads are invalid.
        assert_eq!(decode(b"Zm8=Zm9v").as_deref(), Some(&b"fo"[..]));
        assert_eq!(decode(b"Z==="), None);
        let binary = meta(b"mg AAEC b k\r\n");
        assert_eq!((&binary.key[..], binary.base64), (&[0u8, 1, 2][..], true));
        assert_eq!(error(b"mg ---- b\r\n").0, ProtocolError::MetaKeyDecode);
    }
}
