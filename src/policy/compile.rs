//! Rules compiled once (config load, registration): each `when` parsed into a CEL program
//! within bounds that make its evaluation's cost bounded, or an error naming the rule, the
//! position and the cause.
//!
//! Bounds (docs/policy.md, "Cost"): at most [`MAX_RULES`] rules per list, a `when` of at
//! most [`MAX_WHEN_BYTES`] bytes, nesting at most [`MAX_DEPTH`] deep, and no comprehension
//! (`all`, `exists`, `map`, `filter`, …) inside another: an expression's work is at most its
//! size times the size of the call's arguments (which the request body bounds).

use cel::common::ast::{EntryExpr, Expr};
use cel::parser::Parser;
use cel::{IdedExpr, Program};

use super::rules::{Effect, RuleSpec};

/// Most rules in one list (the config's, or one registration's).
pub const MAX_RULES: usize = 64;
/// Longest `when`, bytes.
pub const MAX_WHEN_BYTES: usize = 2048;
/// Deepest nesting of a `when` (the parser's recursion bound).
pub const MAX_DEPTH: u16 = 12;
/// Deepest expression tree (operators chained count: `a + b + c` is 2 levels).
pub const MAX_TREE_DEPTH: usize = 24;
/// Longest `reason`, bytes.
pub const MAX_REASON_BYTES: usize = 512;

/// One compiled rule.
#[derive(Debug)]
pub struct Rule {
    pub spec: RuleSpec,
    pub(super) program: Program,
}

/// Which variables a list's rules read (only those are built for a call).
#[derive(Debug, Default, Clone, Copy)]
pub struct Needs {
    pub agent: bool,
    pub registration: bool,
    pub tool: bool,
    pub args: bool,
    pub upstream: bool,
}

/// A list of compiled rules, in order.
#[derive(Debug, Default)]
pub struct Rules {
    pub rules: Vec<Rule>,
    pub needs: Needs,
}

impl Rules {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// One rule denying every call: what a stored list that no longer compiles becomes
    /// (fail closed).
    pub fn deny_all() -> Rules {
        let spec = RuleSpec {
            id: "policy_invalid".into(),
            when: "true".into(),
            effect: Effect::Deny,
            reason: Some("this registration's policy no longer compiles".into()),
            approver: None,
            timeout_s: None,
            upstream: None,
        };
        match Program::compile("true") {
            Ok(program) => Rules {
                rules: vec![Rule { spec, program }],
                needs: Needs::default(),
            },
            Err(_) => Rules::default(),
        }
    }
}

/// The stack the parser runs on: its recursion per nesting level is deep (ANTLR; several
/// hundred KiB per level in a debug build), so it gets a thread of its own rather than
/// whatever stack the caller (an admin request's task) has left. Compiling is rare
/// (config load, registration); calls never parse.
const PARSE_STACK: usize = 16 * 1024 * 1024;

/// Compiles `specs` (`what` names the list in errors, e.g. `policy` or `policy.rules`);
/// `scoped`: whether rules may carry `upstream` (config rules).
pub fn compile(specs: &[RuleSpec], what: &str, scoped: bool) -> Result<Rules, String> {
    if specs.is_empty() {
        return Ok(Rules::default());
    }
    std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("policy-compile".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(sc, || compile_here(specs, what, scoped))
            .map_err(|e| format!("{what}: cannot start the compiler: {e}"))?
            .join()
            .map_err(|_| format!("{what}: the compiler failed"))?
    })
}

fn compile_here(specs: &[RuleSpec], what: &str, scoped: bool) -> Result<Rules, String> {
    if specs.len() > MAX_RULES {
        return Err(format!(
            "{what}: at most {MAX_RULES} rules (got {})",
            specs.len()
        ));
    }
    let mut out = Rules::default();
    let mut seen = std::collections::BTreeSet::new();
    for (i, s) in specs.iter().enumerate() {
        let at = format!("{what}[{i}] (rule {:?})", s.id);
        if s.id.is_empty()
            || s.id.len() > 64
            || !s
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            return Err(format!(
                "{at}: id must be 1-64 characters of [A-Za-z0-9_.-]"
            ));
        }
        if !seen.insert(s.id.as_str()) {
            return Err(format!("{at}: id used twice"));
        }
        if s.upstream.is_some() && !scoped {
            return Err(format!(
                "{at}: upstream: only config rules are scoped to an upstream"
            ));
        }
        if let Some(r) = &s.reason {
            if r.len() > MAX_REASON_BYTES || r.chars().any(char::is_control) {
                return Err(format!(
                    "{at}: reason: at most {MAX_REASON_BYTES} bytes without control characters"
                ));
            }
        }
        match s.effect {
            Effect::Approve => {
                if s.approver.is_none() {
                    return Err(format!(
                        "{at}: an approve rule needs approver = \"harness\" or \"client\""
                    ));
                }
                if s.timeout_s.is_some_and(|t| t == 0 || t > 86_400) {
                    return Err(format!("{at}: timeout_s must be 1-86400"));
                }
            }
            Effect::Allow | Effect::Deny => {
                if s.approver.is_some() || s.timeout_s.is_some() {
                    return Err(format!(
                        "{at}: approver and timeout_s belong to approve rules only"
                    ));
                }
            }
        }
        if s.when.len() > MAX_WHEN_BYTES {
            return Err(format!(
                "{at}: when: at most {MAX_WHEN_BYTES} bytes (got {})",
                s.when.len()
            ));
        }
        let program = compile_when(&s.when).map_err(|e| format!("{at}: when: {e}"))?;
        let refs = program.references();
        let n = &mut out.needs;
        n.agent |= refs.has_variable("agent");
        n.registration |= refs.has_variable("registration");
        n.tool |= refs.has_variable("tool");
        n.args |= refs.has_variable("args");
        n.upstream |= refs.has_variable("upstream");
        out.rules.push(Rule {
            spec: s.clone(),
            program,
        });
    }
    Ok(out)
}

/// Parses one `when` within the bounds; the error gives the position (line and column,
/// from 1) and the cause.
fn compile_when(src: &str) -> Result<Program, String> {
    if src.trim().is_empty() {
        return Err("empty expression".into());
    }
    // Nesting bounded before any parser runs (the parsers recurse per level: a deep
    // expression must not reach them, whatever thread compiles it).
    if let Some(col) = too_deep(src) {
        return Err(format!(
            "at column {col}: nested deeper than {MAX_DEPTH} levels (brackets and conditionals)"
        ));
    }
    // The parser's own check first (its errors carry the position), then the bounded one.
    let parsed = Parser::new()
        .max_recursion_depth(MAX_DEPTH)
        .parse(src)
        .map_err(|e| {
            e.errors
                .first()
                .map(|p| {
                    format!(
                        "at line {}, column {}: {}",
                        p.pos.0,
                        p.pos.1 + 1,
                        p.msg.trim()
                    )
                })
                .unwrap_or_else(|| e.to_string())
        })?;
    // Evaluation recurses per level of the tree (on the calling task's stack): bounded too
    // (a chain `a + a + …` or `x.y.z.…` is as deep as it is long).
    let depth = tree_depth(&parsed, 0);
    if depth > MAX_TREE_DEPTH {
        return Err(format!(
            "expression tree {depth} levels deep (at most {MAX_TREE_DEPTH}): split it into rules"
        ));
    }
    if let Some(inner) = nested_comprehension(&parsed, 0) {
        return Err(format!(
            "a comprehension inside another (at expression {inner}): at most one level, to keep evaluation linear in the arguments"
        ));
    }
    Program::compile(src).map_err(|e| e.to_string())
}

/// The column (from 1) where `src`'s nesting of brackets plus conditionals (`?`) outside
/// string literals passes [`MAX_DEPTH`], if it does.
fn too_deep(src: &str) -> Option<usize> {
    let (mut depth, mut ternaries) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in src.chars().enumerate() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            '?' => ternaries += 1,
            _ => {}
        }
        if depth + ternaries > usize::from(MAX_DEPTH) {
            return Some(i + 1);
        }
    }
    None
}

/// The depth of `e`'s tree (stops counting past [`MAX_TREE_DEPTH`]).
fn tree_depth(e: &IdedExpr, d: usize) -> usize {
    if d > MAX_TREE_DEPTH {
        return d;
    }
    let kids: Vec<&IdedExpr> = match &e.expr {
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::Call(c) => c
            .target
            .as_deref()
            .into_iter()
            .chain(c.args.iter())
            .collect(),
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => entries(&m.entries),
        Expr::Struct(s) => entries(&s.entries),
        Expr::Select(s) => vec![&*s.operand],
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => vec![],
    };
    kids.into_iter()
        .map(|k| tree_depth(k, d + 1))
        .max()
        .unwrap_or(d)
}

fn entries(es: &[cel::common::ast::IdedEntryExpr]) -> Vec<&IdedExpr> {
    es.iter()
        .flat_map(|x| match &x.expr {
            EntryExpr::StructField(f) => vec![&f.value],
            EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
        })
        .collect()
}

/// The id of a comprehension nested inside another, if any.
fn nested_comprehension(e: &IdedExpr, depth: usize) -> Option<u64> {
    match &e.expr {
        Expr::Comprehension(c) => {
            if depth >= 1 {
                return Some(e.id);
            }
            // The range is evaluated once; the loop parts per element.
            nested_comprehension(&c.iter_range, depth)
                .or_else(|| nested_comprehension(&c.accu_init, depth))
                .or_else(|| nested_comprehension(&c.loop_cond, depth + 1))
                .or_else(|| nested_comprehension(&c.loop_step, depth + 1))
                .or_else(|| nested_comprehension(&c.result, depth))
        }
        Expr::Call(c) => c
            .target
            .as_deref()
            .and_then(|t| nested_comprehension(t, depth))
            .or_else(|| c.args.iter().find_map(|a| nested_comprehension(a, depth))),
        Expr::List(l) => l
            .elements
            .iter()
            .find_map(|x| nested_comprehension(x, depth)),
        Expr::Map(m) => m.entries.iter().find_map(|x| match &x.expr {
            EntryExpr::StructField(f) => nested_comprehension(&f.value, depth),
            EntryExpr::MapEntry(me) => nested_comprehension(&me.key, depth)
                .or_else(|| nested_comprehension(&me.value, depth)),
        }),
        Expr::Select(s) => nested_comprehension(&s.operand, depth),
        Expr::Struct(s) => s.entries.iter().find_map(|x| match &x.expr {
            EntryExpr::StructField(f) => nested_comprehension(&f.value, depth),
            EntryExpr::MapEntry(me) => nested_comprehension(&me.key, depth)
                .or_else(|| nested_comprehension(&me.value, depth)),
        }),
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: &str, when: &str) -> RuleSpec {
        RuleSpec {
            id: id.into(),
            when: when.into(),
            effect: Effect::Deny,
            reason: Some("no".into()),
            approver: None,
            timeout_s: None,
            upstream: None,
        }
    }

    #[test]
    fn bad_expressions_name_the_rule_the_position_and_the_cause() {
        let e = compile(
            &[rule("ok", "true"), rule("bad", "args.path ==")],
            "policy",
            false,
        )
        .unwrap_err();
        assert!(e.contains("policy[1] (rule \"bad\")"), "{e}");
        assert!(e.contains("line 1, column"), "{e}");
        let e = compile(
            &[rule("deep", "args.a.all(x, args.b.exists(y, x == y))")],
            "policy",
            false,
        )
        .unwrap_err();
        assert!(e.contains("comprehension inside another"), "{e}");
        let deep = format!("{}true{}", "(".repeat(64), ")".repeat(64));
        let e = compile(&[rule("d", &deep)], "policy", false).unwrap_err();
        assert!(e.contains("column 13: nested deeper"), "{e}");
        // The deepest allowed expression compiles from a small stack (the parser gets its own).
        let n = usize::from(MAX_DEPTH);
        let deepest = format!(
            "{}[{}true{}]{} == [true]",
            "(".repeat(n / 2),
            "[".repeat(n / 2 - 1),
            "]".repeat(n / 2 - 1),
            ")".repeat(n / 2)
        );
        let r = std::thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || compile(&[rule("d", &deepest)], "policy", false).map(|_| ()))
            .unwrap()
            .join()
            .unwrap();
        assert!(r.is_ok(), "{r:?}");
        let chain = vec!["1"; 100].join(" + ");
        let e = compile(&[rule("c", &format!("{chain} > 0"))], "policy", false).unwrap_err();
        assert!(e.contains("levels deep"), "{e}");
        let r = compile(&[rule("fine", "args.a.all(x, x > 1)")], "policy", false).unwrap();
        assert!(r.needs.args && !r.needs.agent);
    }
}
