//! Grants: what a registration may call, as registered: `<upstream>.<tool>`,
//! `<upstream>.*`, or an in-process tool's name or `prefix*` glob. A grant is parsed once
//! ([`Grant::parse`]) and matched by one rule ([`Grant::matches`]); what it names is read
//! through this type, never by splitting its text elsewhere.

use crate::tools::{Backend, GrantedTool};

/// A well-formed grant (tool-name characters, at most one `*`, at its end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pattern: String,
}

impl Grant {
    /// Checks `pattern`'s shape; the error says what a grant looks like.
    pub fn parse(pattern: &str) -> Result<Grant, String> {
        let body = pattern.strip_suffix('*').unwrap_or(pattern);
        let valid = !pattern.is_empty()
            && pattern.len() <= 128
            && !body.contains('*')
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-');
        if !valid {
            return Err(format!(
                "bad grant {pattern:?}: use a tool name, or a prefix ending in one '*' (e.g. \"helpdesk.*\")"
            ));
        }
        Ok(Grant {
            pattern: pattern.to_string(),
        })
    }

    /// The grant as registered.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// The one matching rule: `name` is the pattern, or starts with a `prefix*` glob's prefix.
    pub fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.pattern == name,
        }
    }

    /// Does this grant give `t`? An upstream tool is granted by its grant name
    /// `<upstream>.<tool>` (and `<upstream>.*`), and only by it, whatever its exposed name
    /// (`bare_names`, separator, model-safe rule; `tool_name`), so a grant means the same
    /// under every naming config; an in-process tool by its name.
    pub fn grants(&self, t: &GrantedTool) -> bool {
        match &t.backend {
            Backend::Upstream { grant_name, .. } => self.matches(grant_name),
            Backend::InProcess(_) => self.matches(&t.name),
        }
    }

    /// The upstream the grant would name: its text before the first `.` (an in-process
    /// tool's name has none; whether such an upstream is configured is the pool's to say).
    pub fn upstream(&self) -> Option<&str> {
        upstream_of(&self.pattern)
    }

    /// The distinct upstreams `grants` name that `configured` knows, in grant order.
    pub fn upstreams_of<G: AsRef<str>>(
        grants: &[G],
        configured: impl Fn(&str) -> bool,
    ) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for up in grants.iter().filter_map(|g| upstream_of(g.as_ref())) {
            if configured(up) && !out.contains(&up) {
                out.push(up);
            }
        }
        out
    }
}

impl AsRef<str> for Grant {
    fn as_ref(&self) -> &str {
        &self.pattern
    }
}

fn upstream_of(pattern: &str) -> Option<&str> {
    pattern.split_once('.').map(|(up, _)| up)
}

#[cfg(test)]
mod tests {
    use super::Grant;

    #[test]
    fn a_grant_names_its_upstream_and_upstreams_are_listed_once_in_order() {
        let g = |p: &str| Grant::parse(p).unwrap();
        assert_eq!(g("helpdesk.*").upstream(), Some("helpdesk"));
        assert_eq!(g("helpdesk.open_case").upstream(), Some("helpdesk"));
        assert_eq!(g("echo").upstream(), None);
        let grants = ["b.x", "a.*", "b.y", "gone.z", "echo"].map(g);
        assert_eq!(Grant::upstreams_of(&grants, |u| u != "gone"), ["b", "a"]);
    }

    #[test]
    fn a_grant_is_a_name_or_one_trailing_glob() {
        for ok in ["echo", "a.b", "a.*", "*", "a-b_c.d"] {
            assert!(Grant::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a*b", "**", "a b", "a/b", &"x".repeat(129)] {
            assert!(Grant::parse(bad).is_err(), "{bad}");
        }
        let g = Grant::parse("a.b*").unwrap();
        assert!(g.matches("a.bc") && g.matches("a.b") && !g.matches("a.c"));
        let exact = Grant::parse("a.b").unwrap();
        assert!(exact.matches("a.b") && !exact.matches("a.bc"));
    }
}
