//! W3C Trace Context, read and written by hand: `traceparent` (version `00` and the
//! forward-compatible reading of later versions) and the bounds on `tracestate`. An invalid
//! value is ignored (`None`), never an error: a call is never refused for its trace context.

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    if text.len() != out.len() * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None, // upper case is invalid in traceparent
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(text[2 * i])? << 4 | digit(text[2 * i + 1])?;
    }
    Some(())
}

/// Reads a `traceparent` header or `_meta` value; `None` if it is not a valid one (version
/// `ff`, an all-zero id, upper-case hex, a version-00 value with more after it…).
pub fn parse_traceparent(text: &str) -> Option<TraceParent> {
    let b = text.trim().as_bytes();
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&b[0..2], &mut version)?;
    match version[0] {
        0xff => return None,
        0 if b.len() != 55 => return None,
        _ if b.len() > 55 && b[55] != b'-' => return None,
        _ => {}
    }
    let mut tp = TraceParent {
        trace_id: [0; 16],
        span_id: [0; 8],
        flags: 0,
    };
    hex_into(&b[3..35], &mut tp.trace_id)?;
    hex_into(&b[36..52], &mut tp.span_id)?;
    let mut flags = [0u8; 1];
    hex_into(&b[53..55], &mut flags)?;
    tp.flags = flags[0];
    if tp.trace_id == [0; 16] || tp.span_id == [0; 8] {
        return None;
    }
    Some(tp)
}

/// The `traceparent` of a span: version 00, the sampled flag only.
pub fn format_traceparent(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> String {
    format!(
        "00-{}-{}-{}",
        hex::encode(trace_id),
        hex::encode(span_id),
        if sampled { "01" } else { "00" }
    )
}

/// A `tracestate` kept as it came if within the W3C bounds (at most 32 members, 512
/// characters, printable ASCII), else dropped.
pub fn bounded_tracestate(text: &str) -> Option<&str> {
    let t = text.trim();
    let ok = !t.is_empty()
        && t.len() <= 512
        && t.split(',').count() <= 32
        && t.bytes().all(|c| (0x20..0x7f).contains(&c))
        && t.split(',').all(|m| m.trim().is_empty() || m.contains('='));
    ok.then_some(t)
}

/// A `baggage` value kept if within the W3C bound (8,192 bytes, printable ASCII), else
/// dropped.
pub fn bounded_baggage(text: &str) -> Option<&str> {
    let t = text.trim();
    (!t.is_empty() && t.len() <= 8192 && t.bytes().all(|c| (0x20..0x7f).contains(&c))).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_traceparents_are_read_and_invalid_ones_ignored() {
        let tp =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(hex::encode(tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(tp.span_id), "00f067aa0ba902b7");
        assert_eq!(tp.flags, 1);
        assert_eq!(
            format_traceparent(tp.trace_id, tp.span_id, true),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let unsampled =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert_eq!(unsampled.flags, 0);
        // A later version may carry more after the flags.
        assert!(parse_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-later"
        )
        .is_some());
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn tracestate_and_baggage_are_bounded() {
        assert_eq!(bounded_tracestate("a=1,b=2"), Some("a=1,b=2"));
        assert_eq!(bounded_tracestate(&"a=1,".repeat(40)), None);
        assert_eq!(bounded_tracestate(&format!("a={}", "x".repeat(600))), None);
        assert_eq!(bounded_tracestate("novalue"), None);
        assert_eq!(bounded_baggage("k=v"), Some("k=v"));
        assert_eq!(bounded_baggage(&"x".repeat(9000)), None);
    }
}
