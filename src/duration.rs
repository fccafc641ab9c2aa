//! How the program prints a duration: `40 s`, `12 min`, `1 h 05 min`. One formatter for every
//! estimate, progress line and summary, so that no unit is carried wrongly (`4 h 60 min`).

/// `seconds` as people read it: whole seconds below 90 s, whole minutes below an hour, hours
/// and minutes above. The value is rounded once, to the unit shown, before it is split, so a
/// carry moves into the larger unit (59 min 59.6 s is `1 h 00 min`). Not a time (NaN, ∞) reads
/// `unknown`; a negative time reads `0 s`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() {
        return "unknown".into();
    }
    let s = seconds.max(0.0).round() as u64;
    if s < 90 {
        return format!("{s} s");
    }
    let minutes = (s + 30) / 60;
    if minutes < 60 {
        format!("{minutes} min")
    } else {
        format!("{} h {:02} min", minutes / 60, minutes % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn durations_read_as_seconds_minutes_or_hours() {
        assert_eq!(duration(40.2), "40 s");
        assert_eq!(duration(720.0), "12 min");
        assert_eq!(duration(3900.0), "1 h 05 min");
        assert_eq!(duration(-3.0), "0 s");
        assert_eq!(duration(f64::NAN), "unknown");
        assert_eq!(duration(f64::INFINITY), "unknown");
    }

    #[test]
    fn carries_move_into_the_larger_unit_at_every_boundary() {
        assert_eq!(duration(59.5), "60 s");
        assert_eq!(duration(89.4), "89 s");
        assert_eq!(duration(89.5), "2 min");
        assert_eq!(duration(59.0 * 60.0 + 29.4), "59 min");
        assert_eq!(duration(59.0 * 60.0 + 29.6), "1 h 00 min");
        assert_eq!(duration(59.0 * 60.0 + 59.6), "1 h 00 min");
        // 4 h 59 min 30 s: never "4 h 60 min".
        assert_eq!(duration(4.0 * 3600.0 + 59.0 * 60.0 + 30.0), "5 h 00 min");
        assert_eq!(duration(23.0 * 3600.0 + 59.0 * 60.0 + 59.9), "24 h 00 min");
        assert_eq!(duration(23.0 * 3600.0 + 59.0 * 60.0 + 29.0), "23 h 59 min");
    }
}
