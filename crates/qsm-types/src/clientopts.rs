//! The client options a server's option set may give its nodes (issue 26, TSM's DEFINE
//! CLIENTOPT), each named as client.toml names it. The server checks a value when it is
//! defined, the client again when it uses it: both by the kinds here.

use crate::model::TxnLimits;

/// What an option's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A pattern (include, exclude): a set may hold several, all added to the node's own.
    Pattern,
    /// A compression setting (`auto`, `off`, `CODEC[:LEVEL]`), checked in full by the codecs.
    Compression,
    /// `on` or `off`.
    Switch,
    /// A whole number in a range.
    Count(u64, u64),
    /// A rate (`10Mbit`, `5MB`).
    Rate,
}

/// Every option a set may give, in the order they are described.
pub const OPTIONS: [(&str, Kind); 9] = [
    ("include", Kind::Pattern),
    ("exclude", Kind::Pattern),
    ("compression", Kind::Compression),
    ("dedup", Kind::Switch),
    ("encryption", Kind::Switch),
    ("limit_upload", Kind::Rate),
    ("txn_group_max", Kind::Count(1, TxnLimits::MAX_GROUP as u64)),
    ("txn_byte_limit", Kind::Count(1, TxnLimits::MAX_BYTES)),
    // As many as `-T` takes.
    ("threads", Kind::Count(1, 1024)),
];

/// The kind of option `name`, if a set may give it.
pub fn kind(name: &str) -> Option<Kind> {
    OPTIONS.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
}

/// `on`, `off` and their synonyms, as a switch.
pub fn switch(text: &str) -> Option<bool> {
    match text {
        "on" | "yes" | "true" => Some(true),
        "off" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// Refuses an option a set cannot give, or a value of the wrong kind, saying why.
pub fn check(name: &str, value: &str) -> Result<Kind, String> {
    let names: Vec<&str> = OPTIONS.iter().map(|(n, _)| *n).collect();
    let kind = kind(name)
        .ok_or_else(|| format!("no client option {name:?}: a set gives {}", names.join(", ")))?;
    let bad = |why: &str| Err(format!("{name} {value:?}: {why}"));
    match kind {
        Kind::Pattern if value.is_empty() || value.len() > 4096 || value.contains(['\n', '\0']) => {
            bad("a pattern is 1 to 4096 bytes without a newline or NUL")
        }
        Kind::Compression
            if value.is_empty() || value.len() > 32 || value.contains(char::is_whitespace) =>
        {
            bad("auto, auto:fast, auto:small, off or CODEC[:LEVEL]")
        }
        Kind::Switch if switch(value).is_none() => bad("on or off"),
        Kind::Count(lo, hi) if !value.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n)) => {
            bad(&format!("a whole number from {lo} to {hi}"))
        }
        Kind::Rate => parse_rate(value).map(|_| kind).map_err(|e| format!("{name} {e}")),
        _ => Ok(kind),
    }
}

/// A rate such as `10Mbit`, `1Gbit`, `500kbit` (bits per second) or `5MB`, `100KiB` (bytes
/// per second), in bytes per second.
pub fn parse_rate(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{text:?}: expected e.g. 10Mbit or 5MB"))?;
    let per_second = match unit.trim().trim_end_matches("/s").trim_end_matches("ps") {
        "bit" | "b" => n / 8.0,
        "kbit" | "Kbit" => n * 1e3 / 8.0,
        "Mbit" | "mbit" => n * 1e6 / 8.0,
        "Gbit" | "gbit" => n * 1e9 / 8.0,
        "" | "B" => n,
        "kB" | "KB" => n * 1e3,
        "MB" => n * 1e6,
        "GB" => n * 1e9,
        "KiB" => n * 1024.0,
        "MiB" => n * 1024.0 * 1024.0,
        "GiB" => n * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use bit, kbit, Mbit, Gbit, B, kB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    if per_second < 1.0 {
        return Err(format!("{text:?}: at least 1 byte per second"));
    }
    Ok(per_second as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_by_kind() {
        assert_eq!(check("exclude", "*.tmp"), Ok(Kind::Pattern));
        assert_eq!(check("dedup", "on"), Ok(Kind::Switch));
        assert_eq!(check("limit_upload", "10Mbit"), Ok(Kind::Rate));
        assert_eq!(check("threads", "4"), Ok(Kind::Count(1, 1024)));
        for (name, value) in [
            ("colour", "blue"),
            ("dedup", "maybe"),
            ("threads", "0"),
            ("threads", "-1"),
            ("limit_upload", "fast"),
            ("exclude", ""),
            ("compression", "zstd 3"),
        ] {
            assert!(check(name, value).is_err(), "{name}={value} taken");
        }
    }
}
