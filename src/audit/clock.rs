//! The writer's timestamps.

/// The writer's timestamps, as chrono writes them (RFC 3339, UTC, microseconds, `Z`:
/// `2026-11-29T17:27:10.123456Z`); the text up to the seconds is formatted once per second.
#[derive(Default)]
pub(super) struct Clock {
    /// The second `text` was formatted for, and where its fraction starts.
    cached: Option<(u64, usize)>,
    text: String,
}

impl Clock {
    pub(super) fn now(&mut self) -> &str {
        let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            self.cached = None;
            self.text = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            return &self.text;
        };
        match self.cached {
            Some((secs, frac)) if secs == d.as_secs() => {
                self.text.truncate(frac);
                let mut micros = d.subsec_micros();
                let mut digits = [b'0'; 6];
                for b in digits.iter_mut().rev() {
                    *b = b'0' + (micros % 10) as u8;
                    micros /= 10;
                }
                self.text
                    .push_str(std::str::from_utf8(&digits).unwrap_or("000000"));
                self.text.push('Z');
            }
            _ => {
                // The same conversion as `chrono::Utc::now()`.
                let t = i64::try_from(d.as_secs())
                    .ok()
                    .and_then(|s| chrono::DateTime::from_timestamp(s, d.subsec_nanos()))
                    .unwrap_or_else(chrono::Utc::now);
                self.text = t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                // `….SS.ffffffZ`: the fraction is the 6 digits before the `Z`.
                let b = self.text.as_bytes();
                let n = b.len();
                self.cached =
                    (n >= 8 && b[n - 8] == b'.' && b[n - 1] == b'Z').then(|| (d.as_secs(), n - 7));
            }
        }
        &self.text
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn clock_matches_the_previous_formatting() {
        let mut c = Clock::default();
        for _ in 0..3 {
            let before = chrono::Utc::now();
            let t = c.now().to_string();
            let after = chrono::Utc::now();
            let parsed = chrono::DateTime::parse_from_rfc3339(&t).unwrap();
            assert!(before.timestamp_micros() <= parsed.timestamp_micros());
            assert!(parsed.timestamp_micros() <= after.timestamp_micros());
            assert_eq!(
                t,
                parsed
                    .with_timezone(&chrono::Utc)
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            );
        }
    }
}
