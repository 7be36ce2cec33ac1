//! A call decided: the config's rules, then the root registration's, then each child's down
//! the family. Within one list the first matching rule decides; `deny` (and `approve`) ends
//! the evaluation, `allow` ends only its own list, so a later list (a child's) can still
//! deny: a child only narrows. A call that neither the config's rules nor its root
//! registration's matched gets `[policy] default`. A rule whose `when` fails to evaluate
//! (or gives no boolean) denies the call: fail closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::{Context, Value as Cel};
use serde_json::Value;

use super::compile::{compile, Needs, Rules};
use super::rules::{Approver, DefaultEffect, Effect, PolicyConfig};

/// What a call's policy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// `rule`: the id of the rule that denied (`default` for `[policy] default = "deny"`).
    Deny {
        rule: String,
        reason: String,
    },
    /// Held until `approver` decides, at most `timeout_s` (issue 49 item 3: `approval`).
    Approve {
        rule: String,
        approver: Approver,
        timeout_s: Option<u64>,
    },
}

/// What a call's rules can read: its registration, agent, tool and arguments.
#[derive(Debug, Clone, Copy)]
pub struct CallFacts<'a> {
    pub registration_id: &'a str,
    pub agent_id: &'a str,
    /// A child's agent ids from the root down; `None` for a root (`[agent_id]`).
    pub agent_path: Option<&'a [String]>,
    pub label: Option<&'a str>,
    /// The name the registration sees.
    pub tool: &'a str,
    /// The upstream's own name of the tool (an in-process tool: its name).
    pub upstream_name: &'a str,
    /// The tool's definition (`annotations` is read from it).
    pub descriptor: &'a Value,
    pub args: &'a Value,
    /// The tool's upstream id; `None` for an in-process tool.
    pub upstream: Option<&'a str>,
}

/// The config's rules and default, compiled.
#[derive(Debug, Default)]
pub struct ConfigPolicy {
    pub rules: Rules,
    pub default: DefaultEffect,
}

/// The config's policy as it is now: replaced whole by a reload (new calls see the new rules;
/// a call already admitted keeps its decision). Off (no rule, default allow): one atomic load.
#[derive(Debug, Default)]
pub struct Live {
    active: AtomicBool,
    /// The config's `[policy]` as last put in place, and its compiled form (`None`: off).
    current: RwLock<(PolicyConfig, Option<Arc<ConfigPolicy>>)>,
}

impl Live {
    /// `config`'s policy compiled; the error names the rule (as config validation does).
    pub fn new(config: &PolicyConfig) -> Result<Live, String> {
        let live = Live::default();
        live.replace(config)?;
        Ok(live)
    }

    /// Compiles `config` and puts it in place (whether it differs from the one in place);
    /// on an error nothing changes.
    pub fn replace(&self, config: &PolicyConfig) -> Result<bool, String> {
        let rules = compile(&config.rules, "policy.rules", true)?;
        let active = !rules.is_empty() || config.default == DefaultEffect::Deny;
        let new = active.then(|| {
            Arc::new(ConfigPolicy {
                rules,
                default: config.default,
            })
        });
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        // The rules and the default (the approvals' bounds and webhook need a restart).
        let changed = cur.0.default != config.default || cur.0.rules != config.rules;
        *cur = (config.clone(), new);
        self.active.store(active, Ordering::Release);
        Ok(changed)
    }

    /// The policy in force, `None` when there is none (one atomic load).
    pub fn current(&self) -> Option<Arc<ConfigPolicy>> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }
}

/// A registration family's rules: the root registration's, then its descendants' down to
/// the calling one (those with rules).
#[derive(Debug, Default)]
pub struct Layers<'a> {
    pub root: Option<&'a Rules>,
    pub narrowing: Vec<&'a Rules>,
}

impl Layers<'_> {
    pub fn is_empty(&self) -> bool {
        self.root.is_none() && self.narrowing.is_empty()
    }
}

thread_local! {
    /// The standard environment, built once per thread; a call's variables go in a child
    /// scope of it.
    static ROOT: Context<'static, 'static> = Context::default();
}

/// Decides a call: `config` then `layers` (module doc).
pub fn decide(
    config: Option<&ConfigPolicy>,
    layers: &Layers<'_>,
    facts: &CallFacts<'_>,
) -> Decision {
    let mut needs = Needs::default();
    for r in config
        .map(|c| &c.rules)
        .into_iter()
        .chain(layers.root)
        .chain(layers.narrowing.iter().copied())
    {
        let n = r.needs;
        needs.agent |= n.agent;
        needs.registration |= n.registration;
        needs.tool |= n.tool;
        needs.args |= n.args;
        needs.upstream |= n.upstream;
    }
    ROOT.with(|root| {
        let mut ctx = root.new_inner_scope();
        bind(&mut ctx, needs, facts);
        let mut allowed = false;
        if let Some(c) = config {
            match first_match(&c.rules, &ctx, facts.upstream) {
                Some(Ok(Effect::Allow)) => allowed = true,
                Some(other) => return ended(other, &c.rules),
                None => {}
            }
        }
        if let Some(r) = layers.root {
            match first_match(r, &ctx, facts.upstream) {
                Some(Ok(Effect::Allow)) => allowed = true,
                Some(other) => return ended(other, r),
                None => {}
            }
        }
        if !allowed && config.is_some_and(|c| c.default == DefaultEffect::Deny) {
            return Decision::Deny {
                rule: "default".into(),
                reason: "no policy rule allows this call ([policy] default = \"deny\")".into(),
            };
        }
        for r in &layers.narrowing {
            match first_match(r, &ctx, facts.upstream) {
                Some(Ok(Effect::Allow)) | None => {}
                Some(other) => return ended(other, r),
            }
        }
        Decision::Allow
    })
}

/// The index of the first matching rule's effect, or the index of a rule that failed.
type Matched = Result<Effect, (usize, String)>;

/// The first rule of `rules` that matches: its effect (and index, kept in `LAST`).
fn first_match(rules: &Rules, ctx: &Context<'_, '_>, upstream: Option<&str>) -> Option<Matched> {
    for (i, r) in rules.rules.iter().enumerate() {
        if let Some(u) = &r.spec.upstream {
            if upstream != Some(u.as_str()) {
                continue;
            }
        }
        match r.program.execute(ctx) {
            Ok(Cel::Bool(true)) => {
                LAST.with(|l| l.set(i));
                return Some(Ok(r.spec.effect));
            }
            Ok(Cel::Bool(false)) => {}
            Ok(other) => {
                return Some(Err((
                    i,
                    format!("gave {:?}, not a boolean", other.type_of()),
                )))
            }
            Err(e) => return Some(Err((i, e.to_string()))),
        }
    }
    None
}

thread_local! {
    /// The index of the rule `first_match` matched last (this thread).
    static LAST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The decision of a list that did not merely allow.
fn ended(m: Matched, rules: &Rules) -> Decision {
    match m {
        Err((i, why)) => {
            let id = rules.rules.get(i).map_or("?", |r| r.spec.id.as_str());
            Decision::Deny {
                rule: id.to_string(),
                reason: format!("policy rule {id} could not be evaluated: {why}"),
            }
        }
        Ok(effect) => {
            let i = LAST.with(|l| l.get());
            let Some(r) = rules.rules.get(i) else {
                return Decision::Deny {
                    rule: "?".into(),
                    reason: "policy: no such rule".into(),
                };
            };
            let rule = r.spec.id.clone();
            match effect {
                Effect::Approve => Decision::Approve {
                    rule,
                    approver: r.spec.approver.unwrap_or(Approver::Harness),
                    timeout_s: r.spec.timeout_s,
                },
                Effect::Deny | Effect::Allow => Decision::Deny {
                    reason: r
                        .spec
                        .reason
                        .clone()
                        .unwrap_or_else(|| format!("denied by policy rule {rule}")),
                    rule,
                },
            }
        }
    }
}

/// A variable's value, built as the interpreter reads it (not through [`Cel`], which it
/// would convert again, whole, when the variable is bound).
type Val = Box<dyn cel::common::value::Val>;

fn s(v: &str) -> Val {
    Box::new(CelString::from(v.to_string()))
}

fn null() -> Val {
    Box::new(CelNull)
}

fn list(items: Vec<Val>) -> Val {
    Box::new(CelList::from(items))
}

fn map(entries: Vec<(&'static str, Val)>) -> Val {
    let m: HashMap<CelMapKey<'static>, Val> = entries
        .into_iter()
        .map(|(k, v)| (CelMapKey::from(k), v))
        .collect();
    Box::new(CelMap::from(m))
}

/// JSON as CEL (a number: int if it is one, else float).
fn json(v: &Value) -> Val {
    match v {
        Value::Null => null(),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            (None, None) => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(x) => s(x),
        Value::Array(a) => list(a.iter().map(json).collect()),
        Value::Object(o) => {
            let m: HashMap<CelMapKey<'static>, Val> = o
                .iter()
                .map(|(k, v)| (CelMapKey::from(k.clone()), json(v)))
                .collect();
            Box::new(CelMap::from(m))
        }
    }
}

/// Binds the variables the rules read.
fn bind(ctx: &mut Context<'_, '_>, needs: Needs, f: &CallFacts<'_>) {
    if needs.agent {
        let path = match f.agent_path {
            Some(p) => list(p.iter().map(|a| s(a)).collect()),
            None => list(vec![s(f.agent_id)]),
        };
        ctx.add_variable_as_val("agent", map(vec![("id", s(f.agent_id)), ("path", path)]));
    }
    if needs.registration {
        let labels = list(f.label.map(s).into_iter().collect());
        let label = f.label.map_or_else(null, s);
        ctx.add_variable_as_val(
            "registration",
            map(vec![
                ("id", s(f.registration_id)),
                ("label", label),
                ("labels", labels),
            ]),
        );
    }
    if needs.tool {
        let annotations = f
            .descriptor
            .get("annotations")
            .filter(|a| a.is_object())
            .map_or_else(|| map(Vec::new()), json);
        ctx.add_variable_as_val(
            "tool",
            map(vec![
                ("name", s(f.tool)),
                ("upstream_name", s(f.upstream_name)),
                ("annotations", annotations),
            ]),
        );
    }
    if needs.args {
        let args = if f.args.is_null() {
            map(Vec::new())
        } else {
            json(f.args)
        };
        ctx.add_variable_as_val("args", args);
    }
    if needs.upstream {
        ctx.add_variable_as_val("upstream", f.upstream.map_or_else(null, s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::rules::RuleSpec;
    use serde_json::json;

    fn rule(id: &str, when: &str, effect: Effect) -> RuleSpec {
        RuleSpec {
            id: id.into(),
            when: when.into(),
            effect,
            reason: Some(format!("{id} says no")),
            approver: (effect == Effect::Approve).then_some(Approver::Harness),
            timeout_s: None,
            upstream: None,
        }
    }

    /// One rule, compiled as a registration's.
    fn one(r: RuleSpec) -> Rules {
        compile(&[r], "policy", false).unwrap()
    }

    /// A root's rules and no narrowing.
    fn only(r: &Rules) -> Layers<'_> {
        Layers {
            root: Some(r),
            narrowing: vec![],
        }
    }

    fn facts<'a>(args: &'a Value, d: &'a Value) -> CallFacts<'a> {
        CallFacts {
            registration_id: "r",
            agent_id: "a",
            agent_path: None,
            label: Some("l"),
            tool: "fs.write",
            upstream_name: "write",
            descriptor: d,
            args,
            upstream: Some("fs"),
        }
    }

    #[test]
    fn first_match_decides_children_narrow_and_errors_deny() {
        let d = json!({"annotations": {"destructiveHint": true}});
        let outside = json!({"path": "/etc/passwd"});
        let inside = json!({"path": "/workspace/a"});
        let root = compile(
            &[
                rule(
                    "ws",
                    "tool.name == 'fs.write' && !args.path.startsWith('/workspace/')",
                    Effect::Deny,
                ),
                rule("ok", "true", Effect::Allow),
                rule("never", "true", Effect::Deny),
            ],
            "policy",
            false,
        )
        .unwrap();
        let layers = only(&root);
        assert!(
            matches!(decide(None, &layers, &facts(&outside, &d)), Decision::Deny { rule, .. } if rule == "ws")
        );
        assert_eq!(decide(None, &layers, &facts(&inside, &d)), Decision::Allow);
        // A child's allow cannot undo the parent's deny; its deny narrows.
        let child = one(rule("widen", "true", Effect::Allow));
        let narrow = one(rule("ro", "tool.annotations.destructiveHint", Effect::Deny));
        let l2 = Layers {
            root: Some(&root),
            narrowing: vec![&child],
        };
        assert!(matches!(
            decide(None, &l2, &facts(&outside, &d)),
            Decision::Deny { .. }
        ));
        let l3 = Layers {
            root: Some(&root),
            narrowing: vec![&narrow],
        };
        assert!(
            matches!(decide(None, &l3, &facts(&inside, &d)), Decision::Deny { rule, .. } if rule == "ro")
        );
        // Default deny: a child's allow does not widen it.
        let cfg = ConfigPolicy {
            rules: Rules::default(),
            default: DefaultEffect::Deny,
        };
        let l4 = Layers {
            root: None,
            narrowing: vec![&child],
        };
        assert!(
            matches!(decide(Some(&cfg), &l4, &facts(&inside, &d)), Decision::Deny { rule, .. } if rule == "default")
        );
        // An evaluation error (no such key) denies, naming the rule.
        let bad = one(rule("missing", "args.nope == 1", Effect::Allow));
        let l5 = only(&bad);
        assert!(
            matches!(decide(None, &l5, &facts(&inside, &d)), Decision::Deny { rule, .. } if rule == "missing")
        );
        // Approve: the rule, its approver and its timeout.
        let ap = one(rule("pay", "true", Effect::Approve));
        let l6 = only(&ap);
        let d6 = decide(None, &l6, &facts(&inside, &d));
        assert!(
            matches!(d6, Decision::Approve { rule, approver: Approver::Harness, timeout_s: None } if rule == "pay")
        );
    }

    #[test]
    // At MAX_TREE_DEPTH, in a debug build, within half of a tokio worker's 2 MiB stack.
    fn the_deepest_allowed_expression_evaluates_on_a_small_stack() {
        let chain = vec!["args.n"; 23].join(" + ");
        let deep = one(rule("deep", &format!("{chain} > 0"), Effect::Deny));
        let d = json!({});
        let args = json!({"n": 1});
        let got = std::thread::Builder::new()
            .stack_size(1024 * 1024)
            .spawn(move || {
                let layers = only(&deep);
                decide(None, &layers, &facts(&args, &d))
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(matches!(got, Decision::Deny { rule, .. } if rule == "deep"));
    }
}
