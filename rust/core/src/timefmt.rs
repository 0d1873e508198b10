//! Wall-clock times and durations for messages and reports, without a date
//! crate: `7d`, `10s` rather than milliseconds, as Flink's own durations read.

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    if ms == 0 {
        return "unknown".to_string();
    }
    let secs = ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (proleptic calendar,
/// 400-year eras of 146 097 days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as u32, day as u32)
}

/// A duration in its two largest units: `850ms`, `42s`, `3m 5s`, `2h 10m`,
/// `7d`, `1d 4h`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    let two = |a: u64, ua: &str, b: u64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua} {b}{ub}")
        }
    };
    if d > 0 {
        two(d, "d", h, "h")
    } else if h > 0 {
        two(h, "h", m, "m")
    } else if m > 0 {
        two(m, "m", s, "s")
    } else {
        format!("{s}s")
    }
}

/// A duration exactly, in the largest unit that divides it: `7d`, `3h`,
/// `10min`, `185s`, `250ms` (Flink's duration syntax, so a value can be
/// copied into a configuration). The same as the Java side's
/// `Durations.format`.
pub fn exact(ms: u64) -> String {
    if ms == 0 || ms == u64::MAX {
        return format!("{ms}ms");
    }
    for (unit, name) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
    ] {
        if ms % unit == 0 {
            return format!("{}{name}", ms / unit);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates() {
        assert_eq!(utc(1), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(0), "unknown");
        // 2000-02-29 12:34:56 UTC
        assert_eq!(utc(951_827_696_000), "2000-02-29 12:34:56 UTC");
        // 2026-09-14 00:00:00 UTC
        assert_eq!(utc(1_789_344_000_000), "2026-09-14 00:00:00 UTC");
        // 2100-03-01 (2100 is not a leap year)
        assert_eq!(utc(4_107_542_400_000), "2100-03-01 00:00:00 UTC");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(185_000), "3m 5s");
        assert_eq!(duration(7_800_000), "2h 10m");
        assert_eq!(duration(7 * 86_400_000), "7d");
        assert_eq!(duration(100_800_000), "1d 4h");
    }

    #[test]
    fn formats_exact_durations() {
        assert_eq!(exact(7 * 86_400_000), "7d");
        assert_eq!(exact(3 * 3_600_000), "3h");
        assert_eq!(exact(600_000), "10min");
        assert_eq!(exact(185_000), "185s");
        assert_eq!(exact(1_250), "1250ms");
        assert_eq!(exact(0), "0ms");
    }
}
