//! What the subcommands print: JSON values of decoded payloads, structure formats, sizes.

use std::io::Write;

use montage_collections::inspect::{Format, Value};

/// A decoded value as JSON: strings and integers as themselves (integers beyond 64 bits as
/// decimal strings), byte strings as strings where they are UTF-8 and `hex` is off, and as
/// `{"hex": "..."}` otherwise, `()` as `null`.
pub(crate) fn value_json(value: &Value, hex: bool) -> serde_json::Value {
    match value {
        Value::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) if !hex => serde_json::Value::from(text),
            _ => serde_json::json!({ "hex": to_hex(bytes) }),
        },
        Value::Str(text) => serde_json::Value::from(text.as_str()),
        Value::Unsigned(n) => {
            u64::try_from(*n).map_or_else(|_| n.to_string().into(), serde_json::Value::from)
        }
        Value::Signed(n) => {
            i64::try_from(*n).map_or_else(|_| n.to_string().into(), serde_json::Value::from)
        }
        Value::Bool(b) => serde_json::Value::from(*b),
        Value::Unit => serde_json::Value::Null,
    }
}

/// The fields of a decoded payload as one JSON object.
pub(crate) fn fields_json(fields: &[(&str, Value)], hex: bool) -> serde_json::Value {
    serde_json::Value::Object(
        fields
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value_json(value, hex)))
            .collect(),
    )
}

fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// How a format reads to a user: `hash-map<String, u64>`, `queue<Vec<u8>>`.
pub(crate) fn format_name(format: &Format) -> String {
    match format.key {
        Some(key) => format!(
            "{}<{}, {}>",
            format.kind,
            key.type_name(),
            format.value.type_name()
        ),
        None => format!("{}<{}>", format.kind, format.value.type_name()),
    }
}

/// The name of the payload type `type_id` where it is a collection's of plain codecs, else
/// its id in hex.
pub(crate) fn type_name(type_id: u64) -> String {
    montage_collections::inspect::format_of(type_id)
        .map_or_else(|| format!("type {type_id:#018x}"), |f| format_name(&f))
}

/// `bytes` in the largest binary unit that keeps it at least 1.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    // A size for reading: a rounding in the last of 52 bits does not show.
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &serde_json::Value) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_the_json_a_reader_expects() {
        assert_eq!(value_json(&Value::Bytes(b"ab".to_vec()), false), "ab");
        assert_eq!(
            value_json(&Value::Bytes(b"ab".to_vec()), true),
            serde_json::json!({"hex": "6162"})
        );
        assert_eq!(
            value_json(&Value::Bytes(vec![0xff, 0]), false),
            serde_json::json!({"hex": "ff00"})
        );
        assert_eq!(value_json(&Value::Unsigned(7), false), 7);
        assert_eq!(
            value_json(&Value::Unsigned(u128::MAX), false),
            u128::MAX.to_string()
        );
        assert_eq!(value_json(&Value::Signed(-3), false), -3);
        assert_eq!(value_json(&Value::Unit, false), serde_json::Value::Null);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(64 << 20), "64.0 MiB");
    }
}
