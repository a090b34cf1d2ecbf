//! Bad usage: a command given an option value it cannot use, or a file it cannot read as what
//! it should be. Such errors exit 2, as clap's own refusals do, before any work is done; every
//! other failure exits 1 (README, "Exit codes").

use anyhow::Result;

/// A refusal of how the command was given (exit 2).
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A [`Usage`] error saying `message`.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(message.into()))
}

/// Whether `e` is bad usage, here or in a library's terms.
pub fn is_usage(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Usage>()
            || matches!(
                c.downcast_ref::<qsm_client::ClientError>(),
                Some(qsm_client::ClientError::Usage(_))
            )
    })
}

/// Worker threads past this many per core only cost memory and switching (every thread has
/// its buffers in flight).
const THREADS_PER_CORE: usize = 4;

/// The threads asked for with `-T`, refused at 0 and capped at [`THREADS_PER_CORE`] per core
/// (saying so): a typo of many digits must not exhaust memory or spawn thousands of threads.
pub fn threads(asked: Option<usize>) -> Result<Option<usize>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = cores * THREADS_PER_CORE;
    match asked {
        Some(0) => Err(usage("--threads must be at least 1")),
        Some(n) if n > cap => {
            errln!(
                "qsm: warning: --threads {n} is more than {THREADS_PER_CORE} per core: using {cap} ({cores} cores)"
            );
            Ok(Some(cap))
        }
        other => Ok(other),
    }
}

pub use qsm_client::config::within;

/// A clap value parser of a number of `unit` from `min` to `max`, refused (exit 2) with the
/// limits in the message before any work is done.
pub fn range<T>(
    min: T,
    max: T,
    unit: &'static str,
) -> impl Fn(&str) -> std::result::Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
{
    move |text| {
        let value = text
            .trim()
            .parse::<T>()
            .map_err(|_| format!("{text:?} is not a number: give {min} to {max} {unit}"))?;
        within(value, min, max, unit)
    }
}

/// Like [`range`] up to the largest count a copy group keeps, or `nolimit` (TSM's NOLIMIT).
pub fn or_nolimit(
    min: u32,
    unit: &'static str,
) -> impl Fn(&str) -> std::result::Result<u32, String> + Clone + Send + Sync + 'static {
    let max = qsm_types::model::NO_LIMIT - 1;
    move |text| {
        if text.trim().eq_ignore_ascii_case("nolimit") {
            return Ok(qsm_types::model::NO_LIMIT);
        }
        range(min, max, unit)(text).map_err(|why| format!("{why}, or nolimit"))
    }
}

/// Seconds from `90`, `90s`, `30m`, `1h`, `1d` or `1w`.
pub fn seconds(text: &str) -> Result<i64, String> {
    let bad = || format!("invalid length of time {text:?} (e.g. 90s, 30m, 1h, 1d, 1w)");
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: i64 = number.parse().map_err(|_| bad())?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit).filter(|s| *s > 0).ok_or_else(bad)
}

/// An error's message with each cause said once (see [`qsm_client::error::chain`]).
pub fn chain(e: &anyhow::Error) -> String {
    qsm_client::error::chain(e.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn causes_are_said_once() {
        let io = std::io::Error::other("No space left on device");
        let e = Err::<(), _>(io)
            .context("writing x: No space left on device")
            .context("backup of /d")
            .unwrap_err();
        assert_eq!(chain(&e), "backup of /d: writing x: No space left on device");
    }

    #[test]
    fn ranges_say_their_limits_and_unit() {
        let threshold = range(1u32, 100, "percent");
        assert_eq!(threshold("60"), Ok(60));
        assert_eq!(threshold("0"), Err("0 is outside 1 to 100 percent".into()));
        assert_eq!(threshold("x"), Err("\"x\" is not a number: give 1 to 100 percent".into()));
        let seconds = range(0.001f64, 10.0, "seconds");
        assert!(seconds("NaN").is_err() && seconds("inf").is_err() && seconds("0").is_err());
        assert_eq!(seconds("1.5"), Ok(1.5));
        let days = or_nolimit(1, "days");
        assert_eq!(days("NOLIMIT"), Ok(qsm_types::model::NO_LIMIT));
        assert_eq!(
            days("4294967295"),
            Err("4294967295 is outside 1 to 4294967294 days, or nolimit".into())
        );
    }

    #[test]
    fn threads_are_capped_and_zero_refused() {
        assert!(is_usage(&threads(Some(0)).unwrap_err()));
        let cap = std::thread::available_parallelism().map_or(1, |n| n.get()) * THREADS_PER_CORE;
        assert_eq!(threads(Some(usize::MAX)).unwrap(), Some(cap));
        assert_eq!(threads(Some(1)).unwrap(), Some(1));
        assert_eq!(threads(None).unwrap(), None);
    }
}
