//! `gatehouse audit summary`: per agent and per tool, calls, errors by outcome and p50/p95
//! duration of the `governed_mcp_call` records.

use std::collections::BTreeMap;

use serde::Serialize;

use super::record::Record;

/// One row: the calls of one agent, or of one tool.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Row {
    pub key: String,
    pub calls: u64,
    /// Calls whose outcome is not `ok`.
    pub errors: u64,
    /// Count per outcome other than `ok` (`tool_error`, `denied`, `timeout`, …).
    pub by_outcome: BTreeMap<String, u64>,
    pub p50_ms: f64,
    pub p95_ms: f64,
}

/// Per agent and per tool rows, sorted by key.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    pub agents: Vec<Row>,
    pub tools: Vec<Row>,
}

/// Nearest-rank percentile of sorted values (`q` in 0..=1).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Default)]
struct Acc {
    calls: u64,
    by_outcome: BTreeMap<String, u64>,
    durations: Vec<f64>,
}

fn rows(map: BTreeMap<String, Acc>) -> Vec<Row> {
    map.into_iter()
        .map(|(key, mut a)| {
            a.durations.sort_by(|x, y| x.total_cmp(y));
            Row {
                key,
                calls: a.calls,
                errors: a.by_outcome.values().sum(),
                by_outcome: a.by_outcome,
                p50_ms: percentile(&a.durations, 0.50),
                p95_ms: percentile(&a.durations, 0.95),
            }
        })
        .collect()
}

/// Summarises the call records among `records`.
pub fn summarize<'a, 'b: 'a>(records: impl IntoIterator<Item = &'a Record<'b>>) -> Summary {
    let mut agents: BTreeMap<String, Acc> = BTreeMap::new();
    let mut tools: BTreeMap<String, Acc> = BTreeMap::new();
    for r in records {
        if r.event != "governed_mcp_call" {
            continue;
        }
        let agent = r.agent_id.as_deref().unwrap_or("-").to_string();
        let tool = r.tool.as_deref().unwrap_or("-").to_string();
        let outcome = r.outcome.as_deref().unwrap_or("-").to_string();
        for acc in [
            agents.entry(agent).or_default(),
            tools.entry(tool).or_default(),
        ] {
            acc.calls += 1;
            if outcome != "ok" {
                *acc.by_outcome.entry(outcome.clone()).or_default() += 1;
            }
            if let Some(d) = r.duration_ms {
                acc.durations.push(d);
            }
        }
    }
    Summary {
        agents: rows(agents),
        tools: rows(tools),
    }
}

impl Summary {
    /// Two fixed-width tables: by agent, then by tool.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for (title, rows) in [("AGENT", &self.agents), ("TOOL", &self.tools)] {
            out.push_str(&format!(
                "{:<28} {:>7} {:>7} {:>10} {:>10}  {}\n",
                title, "CALLS", "ERRORS", "P50_MS", "P95_MS", "ERRORS_BY_OUTCOME"
            ));
            for r in rows {
                let by: Vec<String> = r
                    .by_outcome
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                out.push_str(&format!(
                    "{:<28} {:>7} {:>7} {:>10.2} {:>10.2}  {}\n",
                    r.key,
                    r.calls,
                    r.errors,
                    r.p50_ms,
                    r.p95_ms,
                    if by.is_empty() {
                        "-".into()
                    } else {
                        by.join(" ")
                    }
                ));
            }
            out.push('\n');
        }
        out
    }
}
