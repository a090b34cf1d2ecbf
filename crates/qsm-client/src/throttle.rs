//! A bandwidth limit on what the client sends (`--limit-upload`), to emulate a slow link as
//! the ADSM study's 10 Mbit/s experiments did: a token bucket holding at most a tenth of a
//! second of traffic, so time spent idle (scanning, waiting for a commit) cannot be spent later
//! in one burst, which a real link would not allow either.

use std::time::{Duration, Instant};

/// Keeps a byte stream at or below a rate.
#[derive(Debug)]
pub struct Throttle {
    rate: f64,
    /// Bytes that may leave now without waiting (negative: owed).
    credit: f64,
    /// The last pass; none yet: a link gives no credit for the time before its first byte
    /// (TCP starts slow), and a backup's set-up must not leave as a free burst.
    last: Option<Instant>,
}

impl Throttle {
    /// A limit of `bytes_per_second` (at least 1).
    pub fn new(bytes_per_second: u64) -> Throttle {
        Throttle { rate: bytes_per_second.max(1) as f64, credit: 0.0, last: None }
    }

    /// Accounts for `bytes` about to leave, sleeping until the rate allows them.
    pub fn pass(&mut self, bytes: u64) {
        let now = Instant::now();
        let burst = self.rate / 10.0;
        let idle = self.last.map_or(0.0, |last| now.duration_since(last).as_secs_f64());
        self.credit = (self.credit + idle * self.rate).min(burst) - bytes as f64;
        self.last = Some(now);
        if self.credit < 0.0 {
            std::thread::sleep(Duration::from_secs_f64(-self.credit / self.rate));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_time_is_not_saved_up_beyond_a_tenth_of_a_second() {
        let mut t = Throttle::new(1_000_000);
        std::thread::sleep(Duration::from_millis(50));
        t.pass(0);
        // However long the pause, credit is capped at 100 ms worth of bytes.
        assert!(t.credit <= 100_000.0 + 1.0);
        t.pass(300_000);
        assert!(t.credit < 0.0, "300 kB at 1 MB/s must owe time, credit {}", t.credit);
    }

    #[test]
    fn the_time_before_the_first_byte_is_no_credit() {
        let mut t = Throttle::new(1_000_000);
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        t.pass(100_000);
        // 100 kB at 1 MB/s: a tenth of a second, none of it paid by the wait before.
        assert!(started.elapsed() >= Duration::from_millis(95), "{:?}", started.elapsed());
    }
}
