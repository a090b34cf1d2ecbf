//! Reports written once: a command's library returns a report that serializes, and
//! [`emit`] writes it either as JSON (`--json`) or through its [`Text`] rendering, so the two
//! forms show the same values and a command cannot print one without the other.

use anyhow::Result;
use serde::Serialize;

/// How a report reads on a terminal.
pub trait Text {
    /// Writes the report's lines (with [`outln!`]).
    fn text(&self);
}

/// Writes `report` as pretty JSON or as its text.
pub fn emit<R: Serialize + Text + ?Sized>(report: &R, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(report)?);
    } else {
        report.text();
    }
    Ok(())
}

pub(crate) fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}
