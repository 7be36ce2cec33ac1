//! Rate limits over time: token buckets per registration (`limits.calls_per_minute`) and per
//! registration and tool (`limits.tool_calls_per_minute`). A bucket holds at most its
//! per-minute figure and refills at that many per minute; a call takes one token from every
//! bucket that applies (its registration's and each ancestor's), all or none.
//!
//! State is per node (not in the store): on N nodes a registration gets at most N times its
//! limit (docs/policy.md, "Rate limits in a cluster").

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::sync::lock;

/// One token bucket.
#[derive(Debug)]
pub struct Bucket {
    per_minute: u32,
    /// Tokens now (fractional: refill is continuous) and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(per_minute: u32) -> Bucket {
        Bucket {
            per_minute,
            state: Mutex::new((f64::from(per_minute), Instant::now())),
        }
    }

    /// Takes a token, or says in how many ms one is there.
    fn take(&self, now: Instant) -> Result<(), u64> {
        let rate = f64::from(self.per_minute) / 60_000.0; // tokens per ms
        let mut st = lock(&self.state);
        let elapsed = now.saturating_duration_since(st.1).as_secs_f64() * 1000.0;
        st.0 = (st.0 + elapsed * rate).min(f64::from(self.per_minute));
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            Ok(())
        } else {
            Err((((1.0 - st.0) / rate).ceil() as u64).max(1))
        }
    }

    /// Gives back a token taken for a call another bucket refused.
    fn give_back(&self) {
        let mut st = lock(&self.state);
        st.0 = (st.0 + 1.0).min(f64::from(self.per_minute));
    }
}

/// A registration's buckets.
#[derive(Debug, Default)]
pub struct Buckets {
    calls: Option<Bucket>,
    tools: BTreeMap<String, Bucket>,
}

/// A call over a rate limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// Which limit: `limits.calls_per_minute (N)` or `limits.tool_calls_per_minute[T] (N)`,
    /// with whose it is.
    pub message: String,
    pub retry_after_ms: u64,
}

impl Buckets {
    pub fn new(calls_per_minute: Option<u32>, tools: Option<&BTreeMap<String, u32>>) -> Buckets {
        Buckets {
            calls: calls_per_minute.map(Bucket::new),
            tools: tools
                .into_iter()
                .flatten()
                .map(|(t, n)| (t.clone(), Bucket::new(*n)))
                .collect(),
        }
    }

    /// No limit at all (the call path's one check).
    pub fn is_empty(&self) -> bool {
        self.calls.is_none() && self.tools.is_empty()
    }

    /// Takes a token for a call of `tool` from every bucket of `levels` (the registration's,
    /// then its ancestors', each with its id), all or none.
    pub fn take_all<'a>(
        levels: impl Iterator<Item = (&'a str, &'a Buckets)>,
        tool: &str,
    ) -> Result<(), RateLimited> {
        let now = Instant::now();
        let mut taken: Vec<&Bucket> = Vec::new();
        for (depth, (id, b)) in levels.enumerate() {
            let whose = if depth == 0 {
                "this registration".to_string()
            } else {
                format!("ancestor registration {id}")
            };
            let tool_bucket = b
                .tools
                .get(tool)
                .map(|x| (x, format!("limits.tool_calls_per_minute[{tool:?}]")));
            let call_bucket = b
                .calls
                .as_ref()
                .map(|x| (x, "limits.calls_per_minute".to_string()));
            for (bucket, what) in tool_bucket.into_iter().chain(call_bucket) {
                match bucket.take(now) {
                    Ok(()) => taken.push(bucket),
                    Err(ms) => {
                        for t in taken {
                            t.give_back();
                        }
                        return Err(RateLimited {
                            message: format!(
                                "rate limited: {what} ({}) of {whose} reached; retry after {ms} ms",
                                bucket.per_minute
                            ),
                            retry_after_ms: ms,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_figure_then_refuses_with_the_wait_and_refills() {
        let b = Bucket::new(60);
        let t0 = Instant::now();
        for _ in 0..60 {
            b.take(t0).unwrap();
        }
        let wait = b.take(t0).unwrap_err();
        assert!((900..=1000).contains(&wait), "{wait}");
        b.take(t0 + std::time::Duration::from_millis(1001)).unwrap();
    }

    #[test]
    fn all_or_none_across_levels() {
        let child = Buckets::new(Some(10), None);
        let parent = Buckets::new(Some(1), None);
        let levels = || [("c", &child), ("p", &parent)].into_iter();
        Buckets::take_all(levels(), "t").unwrap();
        let e = Buckets::take_all(levels(), "t").unwrap_err();
        assert!(
            e.message.contains("ancestor registration p"),
            "{}",
            e.message
        );
        // The child's token was given back: 9 left, not 8.
        let st = lock(&child.calls.as_ref().unwrap().state).0;
        assert!((8.9..9.1).contains(&st), "{st}");
    }
}
