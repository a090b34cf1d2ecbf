//! Times as users give and read them: UTC, `YYYY-MM-DD HH:MM:SS`, or `@SECONDS` since the
//! epoch. One form for every command and report that shows or takes a time.

/// Parses a UTC time: `YYYY-MM-DD`, optionally with ` HH:MM[:SS]` or `THH:MM[:SS]`, or
/// `@SECONDS` since the epoch.
pub fn parse_time(text: &str) -> std::result::Result<i64, String> {
    let bad = || {
        format!(
            "invalid time {text:?} (e.g. \"2026-11-22 14:30\", \"2026-11-22\", \"@1795350000\")"
        )
    };
    if let Some(secs) = text.strip_prefix('@') {
        return secs.parse().map_err(|_| bad());
    }
    let (date, time) = match text.split_once([' ', 'T']) {
        Some((d, t)) => (d, t.trim_end_matches('Z')),
        None => (text, "00:00"),
    };
    let d: Vec<i64> = date
        .split('-')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<std::result::Result<_, _>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().map_err(|_| bad()))
        .collect::<std::result::Result<_, _>>()?;
    let [y, m, day] = d[..] else { return Err(bad()) };
    let (hh, mm, ss) = match t[..] {
        [h, m] => (h, m, 0),
        [h, m, s] => (h, m, s),
        _ => return Err(bad()),
    };
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let in_month = usize::try_from(m - 1)
        .ok()
        .and_then(|i| month_days.get(i))
        .is_some_and(|&n| (1..=n).contains(&day));
    if !(1..=9999).contains(&y)
        || !in_month
        || !(0..24).contains(&hh)
        || !(0..60).contains(&mm)
        || !(0..=60).contains(&ss)
    {
        return Err(bad());
    }
    // Days from the civil date (H. Hinnant's algorithm), proleptic Gregorian, UTC.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// `secs` since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC): the form `parse_time` reads.
pub fn format_time(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days (H. Hinnant's algorithm), the inverse of `parse_time`'s.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::{format_time, parse_time};

    #[test]
    fn formatted_times_parse_back() {
        for t in [0, 951_782_400, 1_795_350_000, 4_102_444_799, 1_709_164_800] {
            assert_eq!(parse_time(&format_time(t)), Ok(t), "{}", format_time(t));
        }
        assert_eq!(format_time(1_709_164_800), "2024-02-29 00:00:00");
    }

    #[test]
    fn parses_times_in_utc() {
        assert_eq!(parse_time("1970-01-01"), Ok(0));
        assert!(parse_time("2024-02-29").is_ok());
        assert_eq!(parse_time("2000-03-01 00:00"), Ok(951_868_800));
        assert_eq!(parse_time("2026-11-22T05:30:15Z"), Ok(1_795_325_415));
        assert_eq!(parse_time("2026-11-22 05:30:15"), parse_time("@1795325415"));
        for bad in [
            "",
            "2026-13-01",
            "2026-11-22 25:00",
            "yesterday",
            "2026-11",
            "@x",
            "2026-02-31",
            "2025-02-29",
            "99999999999-01-01",
        ] {
            assert!(parse_time(bad).is_err(), "{bad} accepted");
        }
    }
}
