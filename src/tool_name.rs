//! The names agents see for upstream tools: `<upstream><separator><tool>` (separator `.`, `_`
//! or `__`), or the bare tool name, and, when asked, the model-safe rule that keeps every
//! name within `^[a-zA-Z0-9_-]{1,64}$` (the function-name rule of some model APIs).
//! Pure functions: the tool catalog (`upstream::pool`) calls [`exposed`] once per tool.
//!
//! Grants do not depend on any of this: they name an upstream tool by its *grant name*
//! `<upstream>.<tool>` (the tool's name after `rename`, before the separator and the
//! length rule), so `helpdesk.*` grants the same tools whatever the separator; the exposed
//! name is accepted as a grant too.

use sha2::{Digest, Sha256};

/// The longest model-safe name.
pub const MODEL_SAFE_MAX: usize = 64;

/// Hex digits of the digest suffix a too-long model-safe name ends with (`_` + 8 hex).
const DIGEST_HEX: usize = 8;

/// Between the upstream id and the tool name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Separator {
    /// `helpdesk.open_case` (the default).
    #[default]
    Dot,
    /// `helpdesk_open_case`.
    Underscore,
    /// `helpdesk__open_case`.
    DoubleUnderscore,
}

impl Separator {
    /// Parses a config value: `"."`, `"_"` or `"__"`.
    pub fn parse(s: &str) -> Option<Separator> {
        match s {
            "." => Some(Separator::Dot),
            "_" => Some(Separator::Underscore),
            "__" => Some(Separator::DoubleUnderscore),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Separator::Dot => ".",
            Separator::Underscore => "_",
            Separator::DoubleUnderscore => "__",
        }
    }
}

/// How one upstream's tools are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rule {
    pub separator: Separator,
    /// No `<upstream><separator>` prefix.
    pub bare: bool,
    /// Keep names within `^[a-zA-Z0-9_-]{1,64}$`.
    pub model_safe: bool,
}

/// The grant name of an upstream tool: `<upstream>.<local>`, `local` being its name after
/// `rename`.
pub fn grant_name(upstream: &str, local: &str) -> String {
    format!("{upstream}.{local}")
}

#[cfg(test)]
/// Is `name` within `^[a-zA-Z0-9_-]{1,64}$`?
pub fn is_model_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MODEL_SAFE_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The name agents see for the tool `local` (its name after `rename`) of `upstream`.
///
/// Without `model_safe`: `<upstream><sep><local>` (or `local` if bare), as is; the caller
/// checks it against the general tool-name rule. With `model_safe`: every character outside
/// `[A-Za-z0-9_-]` becomes `_`, and a name longer than 64 is cut to 55 characters followed by
/// `_` and the first 8 hex digits of SHA-256 of the grant name — deterministic, and distinct
/// for distinct tools but for a 32-bit digest clash, which registration refuses like any
/// other collision.
pub fn exposed(upstream: &str, local: &str, rule: Rule) -> String {
    let joined = if rule.bare {
        local.to_string()
    } else {
        format!("{upstream}{}{local}", rule.separator.as_str())
    };
    if !rule.model_safe {
        return joined;
    }
    let safe: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !safe.is_empty() && safe.len() <= MODEL_SAFE_MAX {
        return safe;
    }
    let digest = Sha256::digest(grant_name(upstream, local).as_bytes());
    let hex = hex::encode(&digest[..DIGEST_HEX / 2]);
    // `safe` is ASCII (every other char became `_`), so any byte index is a char boundary.
    let keep = MODEL_SAFE_MAX - DIGEST_HEX - 1;
    let head = safe.get(..keep.min(safe.len())).unwrap_or_default();
    format!("{head}_{hex}")
}

/// Two different tools under one exposed name: `(exposed, first, second)` by their
/// descriptions (grant names, or in-process names), for the registration's error.
pub fn first_collision<'a, I>(tools: I) -> Option<(String, String, String)>
where
    I: IntoIterator<Item = (&'a str, String)>,
{
    let mut seen: std::collections::HashMap<&'a str, String> = std::collections::HashMap::new();
    for (name, who) in tools {
        match seen.get(name) {
            Some(first) if *first != who => {
                return Some((name.to_string(), first.clone(), who));
            }
            Some(_) => {}
            None => {
                seen.insert(name, who);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(sep: &str, bare: bool, model_safe: bool) -> Rule {
        Rule {
            separator: Separator::parse(sep).unwrap_or_default(),
            bare,
            model_safe,
        }
    }

    #[test]
    fn separators() {
        assert_eq!(exposed("hd", "open_case", Rule::default()), "hd.open_case");
        assert_eq!(
            exposed("hd", "open_case", rule("_", false, false)),
            "hd_open_case"
        );
        assert_eq!(
            exposed("hd", "open_case", rule("__", false, false)),
            "hd__open_case"
        );
        assert_eq!(
            exposed("hd", "open_case", rule("__", true, false)),
            "open_case"
        );
        assert_eq!(Separator::parse("-"), None);
        assert_eq!(Separator::parse("___"), None);
        for s in [".", "_", "__"] {
            assert_eq!(Separator::parse(s).map(Separator::as_str), Some(s));
        }
    }

    #[test]
    fn model_safe_names_fit_the_rule_and_are_deterministic() {
        let r = rule("__", false, true);
        assert_eq!(exposed("hd", "open_case", r), "hd__open_case");
        // Characters outside the set become `_`.
        assert_eq!(exposed("hd", "get.thing/v2", r), "hd__get_thing_v2");
        // Too long: 55 characters, `_`, 8 hex digits of the grant name's digest.
        let long = "a".repeat(80);
        let n = exposed("hd", &long, r);
        assert_eq!(n.len(), MODEL_SAFE_MAX);
        assert!(is_model_safe(&n), "{n}");
        assert!(n.starts_with(&format!("hd__{}", "a".repeat(51))), "{n}");
        let hex = hex::encode(&Sha256::digest(format!("hd.{long}").as_bytes())[..4]);
        assert!(n.ends_with(&format!("_{hex}")), "{n}");
        assert_eq!(n, exposed("hd", &long, r), "deterministic");
        // Two long names with a common head differ by their suffix.
        let other = format!("{}b", "a".repeat(79));
        assert_ne!(exposed("hd", &other, r), n);
        // Exactly 64 is kept whole; 65 is cut.
        let t60 = "t".repeat(60);
        assert_eq!(exposed("hd", &t60, r), format!("hd__{t60}"));
        assert_eq!(exposed("hd", &format!("{t60}x"), r).len(), 64);
        assert!(exposed("hd", &format!("{t60}x"), r).starts_with("hd__ttt"));
        // Empty stays invalid-free: a bare empty name gets a digest.
        assert!(is_model_safe(&exposed("hd", "", rule("_", true, true))));
    }

    #[test]
    fn model_safe_rule() {
        assert!(is_model_safe("a-b_C9"));
        assert!(!is_model_safe("a.b"));
        assert!(!is_model_safe(""));
        assert!(!is_model_safe(&"x".repeat(65)));
        assert!(is_model_safe(&"x".repeat(64)));
    }

    #[test]
    fn collisions_name_both_tools() {
        let c = first_collision([
            ("hd__a_b", "hd.a.b".to_string()),
            ("hd__x", "hd.x".to_string()),
            ("hd__x", "hd.x".to_string()),
            ("hd__a_b", "hd.a_b".to_string()),
        ]);
        assert_eq!(
            c,
            Some(("hd__a_b".into(), "hd.a.b".into(), "hd.a_b".into()))
        );
        assert_eq!(
            first_collision([("a", "a".to_string()), ("a", "a".to_string())]),
            None
        );
    }
}
