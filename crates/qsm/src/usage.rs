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
            eprintln!(
                "qsm: warning: --threads {n} is more than {THREADS_PER_CORE} per core: using {cap} ({cores} cores)"
            );
            Ok(Some(cap))
        }
        other => Ok(other),
    }
}

/// An error's message with each cause added once: a layer whose message already holds its
/// cause's text (a library that formats its source in) does not repeat it ("X: X").
pub fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
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
    fn threads_are_capped_and_zero_refused() {
        assert!(is_usage(&threads(Some(0)).unwrap_err()));
        let cap = std::thread::available_parallelism().map_or(1, |n| n.get()) * THREADS_PER_CORE;
        assert_eq!(threads(Some(usize::MAX)).unwrap(), Some(cap));
        assert_eq!(threads(Some(1)).unwrap(), Some(1));
        assert_eq!(threads(None).unwrap(), None);
    }
}
