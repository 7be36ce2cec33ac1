//! OpenTelemetry traces (issue 38), end to end with software nobody here wrote: an OTLP/HTTP
//! receiver decoding with the `opentelemetry-proto` protobuf classes (tests/peers/otel_receiver.py),
//! a traced Python MCP SDK 2.x client (otel_client.py) and a Python SDK 2.x stdio upstream that
//! exports its own spans (otel_upstream.py), both through the OpenTelemetry Python SDK; and, in
//! front of the receiver, the Rotel collector (PyPI `rotel`, whose wheel ships `rotel-agent`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use serde_json::{json, Value};

fn python() -> PathBuf {
    let py = common::repo_root().join("tests/peers/.venv/bin/python");
    assert!(
        py.exists(),
        "tests/peers/.venv is missing: run `bash tests/peers/setup.sh`"
    );
    py
}

fn peer(name: &str) -> String {
    common::repo_root()
        .join("tests/peers")
        .join(name)
        .display()
        .to_string()
}

/// tests/peers/otel_receiver.py on a loopback port; every line it printed kept.
struct Receiver {
    child: Child,
    port: u16,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start() -> Receiver {
        let mut child = Command::new(python())
            .arg(peer("otel_receiver.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap();
                if let Some(p) = v.get("listening") {
                    let _ = tx.send(p.as_u64().unwrap() as u16);
                }
                kept.lock().unwrap().push(v);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("otel_receiver.py did not start");
        Receiver { child, port, lines }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn all(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }

    fn spans(&self) -> Vec<Value> {
        self.all()
            .into_iter()
            .filter_map(|v| v.get("span").cloned())
            .collect()
    }

    fn requests(&self) -> Vec<Value> {
        self.all()
            .into_iter()
            .filter_map(|v| v.get("request").cloned())
            .collect()
    }

    /// The spans, once `f` holds of them (`secs` at most).
    async fn wait_spans(&self, secs: u64, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let spans = self.spans();
            if f(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "spans not as expected in {secs} s: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn set_mode(&self, mode: &str) {
        let r = reqwest::Client::new()
            .post(format!("{}/mode", self.endpoint()))
            .body(mode.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

fn service(span: &Value) -> &str {
    span["resource"]["service.name"]
        .as_str()
        .unwrap_or_default()
}

const SERVER: u64 = 2;
const CLIENT: u64 = 3;

fn of_trace<'a>(spans: &'a [Value], trace_id: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["trace_id"] == trace_id).collect()
}

fn find<'a>(spans: &[&'a Value], service_name: &str, kind: u64) -> Option<&'a Value> {
    spans
        .iter()
        .copied()
        .find(|s| service(s) == service_name && s["kind"] == kind)
}

/// The span of `service_name` of `kind` named `name`.
fn named<'a>(spans: &[&'a Value], service_name: &str, kind: u64, name: &str) -> Option<&'a Value> {
    spans
        .iter()
        .copied()
        .find(|s| service(s) == service_name && s["kind"] == kind && s["name"] == name)
}

/// The SDK client's span of its `tools/call` (it also traces `initialize` and the rest).
fn sdk_call<'a>(spans: &[&'a Value]) -> Option<&'a Value> {
    spans.iter().copied().find(|s| {
        service(s) == "otel-client"
            && s["kind"] == CLIENT
            && s["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("MCP send tools/call"))
    })
}

/// The daemon, exporting to `rx`, with the traced stdio upstream `traced` (exporting to `rx`
/// as well) and `env` added.
fn daemon(rx: &Receiver, env: &[(&str, &str)]) -> Daemon {
    daemon_with(rx, "", env)
}

/// [`daemon`] with `toml` written before the upstream.
fn daemon_with(rx: &Receiver, toml: &str, env: &[(&str, &str)]) -> Daemon {
    daemon_sharing(rx, toml, "shared", env)
}

/// [`daemon_with`], the upstream's `sharing` as given.
fn daemon_sharing(rx: &Receiver, toml: &str, sharing: &str, env: &[(&str, &str)]) -> Daemon {
    daemon_at(&rx.endpoint(), toml, sharing, "", env)
}

/// The daemon and its traced upstream exporting to `endpoint` (the receiver, or a collector in
/// front of it); `audit` goes into the `[audit]` table.
fn daemon_at(
    endpoint: &str,
    toml: &str,
    sharing: &str,
    audit: &str,
    env: &[(&str, &str)],
) -> Daemon {
    let upstream = format!(
        "{toml}[[upstreams]]\nid = \"traced\"\ncommand = {:?}\nargs = [{:?}]\nsharing = {sharing:?}\n[upstreams.env]\nOTEL_EXPORTER_OTLP_ENDPOINT = {:?}\n",
        python().display().to_string(),
        peer("otel_upstream.py"),
        endpoint,
    );
    let mut all: Vec<(&str, &str)> = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=k3y%20v"),
        ("OTEL_SERVICE_NAME", "gatehouse-test"),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci"),
    ];
    all.extend_from_slice(env);
    if !env.iter().any(|(k, _)| *k == "OTEL_BSP_SCHEDULE_DELAY") {
        all.push(("OTEL_BSP_SCHEDULE_DELAY", "100"));
    }
    Daemon::start(&upstream, audit, "info", &all)
}

/// Runs tests/peers/otel_client.py against the registration; its JSON report.
async fn client(rx: &Receiver, reg: &Value, tool: &str, args: Value, more: &[&str]) -> Value {
    client_at(&rx.endpoint(), reg, tool, args, more).await
}

/// [`client`], its spans exported to `endpoint`.
async fn client_at(endpoint: &str, reg: &Value, tool: &str, args: Value, more: &[&str]) -> Value {
    let out = tokio::process::Command::new(python())
        .arg(peer("otel_client.py"))
        .arg(format!("--url={}", reg["mcp_url"].as_str().unwrap()))
        // `=`: a token may start with `-`.
        .arg(format!("--token={}", reg["token"].as_str().unwrap()))
        .arg(format!("--tool={tool}"))
        .arg(format!("--args={args}"))
        .args(more)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), out)
        .await
        .expect("otel_client.py hung")
        .unwrap();
    assert!(
        out.status.success(),
        "otel_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn traceparent_of_echo(report: &Value) -> String {
    let text = report["results"][0]["text"].as_str().unwrap();
    let echoed: Value = serde_json::from_str(text).unwrap();
    echoed["meta"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceparent reached the upstream: {echoed}"))
        .to_string()
}

fn audit_cli(d: &Daemon, trace_id: &str) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["audit", "--json", "--trace-id", trace_id, "--file"])
        .arg(d.audit_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn one_trace_from_the_sdk_client_through_gatehouse_to_the_sdk_upstream() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-otel", "tools": ["traced.*", "demo.echo"]}))
        .await;
    let reg_id = reg["id"].as_str().unwrap();
    let report = client(&rx, &reg, "traced.echo", json!({"text": "hi"}), &[]).await;
    let trace_id = report["trace_id"].as_str().unwrap().to_string();
    let root_id = report["root_span_id"].as_str().unwrap().to_string();
    assert_eq!(report["results"][0]["isError"], false, "{report}");

    // One trace: client root → SDK client span → gatehouse SERVER → gatehouse CLIENT →
    // upstream SERVER.
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &trace_id);
            sdk_call(&t).is_some()
                && named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").is_some()
                && find(&t, "gatehouse-test", CLIENT).is_some()
                && find(&t, "otel-upstream", SERVER).is_some()
        })
        .await;
    let t = of_trace(&spans, &trace_id);
    let root = t
        .iter()
        .find(|s| s["span_id"] == root_id)
        .expect("root span");
    assert_eq!(root["parent_span_id"], "");
    let sdk_client = sdk_call(&t).unwrap();
    let gw_server = named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").unwrap();
    let gw_client = find(&t, "gatehouse-test", CLIENT).unwrap();
    let up_server = find(&t, "otel-upstream", SERVER).unwrap();
    assert_eq!(sdk_client["parent_span_id"], root_id);
    assert_eq!(
        gw_server["parent_span_id"], sdk_client["span_id"],
        "{gw_server:#}"
    );
    assert_eq!(
        gw_client["parent_span_id"], gw_server["span_id"],
        "{gw_client:#}"
    );
    assert_eq!(
        up_server["parent_span_id"], gw_client["span_id"],
        "{up_server:#}"
    );
    // One SERVER span per request the SDK sent (`initialize` too: each the child of the SDK's
    // span of that request, named after its method), one CLIENT span: the tool call's.
    let ours: Vec<&Value> = t
        .iter()
        .copied()
        .filter(|s| service(s) == "gatehouse-test")
        .collect();
    assert_eq!(
        ours.iter().filter(|s| s["kind"] == CLIENT).count(),
        1,
        "{ours:#?}"
    );
    assert_eq!(
        ours.iter()
            .filter(|s| s["name"] == "tools/call traced.echo")
            .count(),
        1,
        "{ours:#?}"
    );
    let servers: Vec<&&Value> = ours.iter().filter(|s| s["kind"] == SERVER).collect();
    assert!(
        servers
            .iter()
            .any(|s| s["attributes"]["mcp.method.name"] == "initialize"),
        "a SERVER span of initialize: {servers:#?}"
    );
    for s in &servers {
        let method = s["attributes"]["mcp.method.name"].as_str().unwrap();
        let parent = t
            .iter()
            .find(|p| p["span_id"] == s["parent_span_id"])
            .unwrap_or_else(|| panic!("the parent of {s:#}"));
        assert_eq!(service(parent), "otel-client", "{s:#}");
        assert!(
            parent["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("MCP send {method}")),
            "{parent:#} / {s:#}"
        );
        assert_eq!(s["attributes"]["gen_ai.agent.id"], "agent-otel", "{s:#}");
        assert_eq!(s["attributes"]["network.transport"], "tcp", "{s:#}");
        assert!(s["attributes"]["jsonrpc.request.id"].is_string(), "{s:#}");
    }

    // Attributes after the MCP conventions.
    assert_eq!(gw_server["name"], "tools/call traced.echo");
    let a = &gw_server["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.tool.name"], "traced.echo");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool");
    assert_eq!(a["gen_ai.agent.id"], "agent-otel");
    assert_eq!(a["gatehouse.registration.id"], reg_id);
    assert_eq!(a["network.transport"], "tcp");
    assert!(a["jsonrpc.request.id"].is_string(), "{a}");
    assert!(a["mcp.protocol.version"].is_string(), "{a}");
    assert!(a.get("error.type").is_none(), "{a}");
    // A stdio upstream: no credential went upstream (the record leaves the default out).
    assert_eq!(a["gatehouse.upstream_auth"], "none", "{a}");
    // Tool arguments and results only with `capture_tool_io`.
    assert!(a.get("gen_ai.tool.call.arguments").is_none(), "{a}");
    assert!(a.get("gen_ai.tool.call.result").is_none(), "{a}");
    assert_eq!(gw_server["status"]["code"], 0, "unset: no error");
    assert_eq!(gw_client["name"], "tools/call echo");
    let a = &gw_client["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call");
    assert_eq!(a["gen_ai.tool.name"], "echo");
    assert_eq!(a["network.transport"], "pipe");
    assert_eq!(a["gatehouse.upstream.name"], "traced");
    assert!(a["jsonrpc.request.id"].is_string(), "{a}");
    assert_eq!(gw_server["resource"]["deployment.environment"], "ci");
    // The upstream saw the gateway's CLIENT span as its parent, sampled.
    assert_eq!(
        traceparent_of_echo(&report),
        format!(
            "00-{trace_id}-{}-01",
            gw_client["span_id"].as_str().unwrap()
        )
    );

    // Exported with OTLP/HTTP protobuf, with the configured header; no token anywhere.
    let reqs = rx.requests();
    assert!(reqs.iter().all(|r| r["path"] == "/v1/traces"), "{reqs:#?}");
    assert!(reqs
        .iter()
        .all(|r| r["content_type"] == "application/x-protobuf"));
    assert!(
        reqs.iter()
            .any(|r| r["headers"]["x-collector-key"] == "k3y v"),
        "{reqs:#?}"
    );
    let everything = serde_json::to_string(&rx.all()).unwrap();
    for secret in [reg["token"].as_str().unwrap(), d.token.as_str()] {
        assert!(
            !everything.contains(secret),
            "a token reached the collector"
        );
    }

    // The audit record carries the trace id, and `gatehouse audit --trace-id` finds it.
    d.wait_audit(10, |r| {
        r.iter().any(|r| {
            r.event == "governed_mcp_call" && r.rare().trace_id.as_deref() == Some(&trace_id)
        })
    })
    .await;
    let found = audit_cli(&d, &trace_id);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["tool"], "traced.echo");
    assert_eq!(found[0]["agent_id"], "agent-otel");
    assert!(
        found[0].get("upstream_auth").is_none(),
        "none is absent: {found:?}"
    );
    // Microseconds, never the float noise of nanoseconds (`0.41234199999999997`).
    let ms = found[0]["duration_ms"].as_f64().unwrap();
    assert!(
        ms > 0.0 && ms.to_string().split('.').nth(1).map_or(0, str::len) <= 3,
        "{ms}"
    );
    assert!(audit_cli(&d, &"0".repeat(32)).is_empty());

    // The conventions' metrics, and the exporter's counters.
    let m = d.metrics().await;
    assert!(
        m.lines().any(
            |l| l.starts_with("mcp_server_operation_duration_seconds_count{")
                && l.contains(r#"gen_ai_tool_name="traced.echo""#)
                && l.contains(r#"network_transport="tcp""#)
                && l.ends_with(" 1")
        ),
        "{m}"
    );
    assert!(
        m.lines().any(
            |l| l.starts_with("mcp_client_operation_duration_seconds_count{")
                && l.contains(r#"network_transport="pipe""#)
        ),
        "{m}"
    );
    assert!(
        m.contains(r#"le="0.01""#) && m.contains(r#"le="300.0""#),
        "{m}"
    );
    assert!(
        !m.contains("agent-otel") && !m.contains(reg_id),
        "never by agent or registration"
    );
    let sent = m
        .lines()
        .find_map(|l| l.strip_prefix("gatehouse_otel_spans_sent_total "))
        .unwrap_or("0");
    assert!(sent.parse::<u64>().unwrap() >= 2, "{m}");
}

#[tokio::test]
async fn an_http_upstream_gets_the_client_span_context_in_meta_and_headers() {
    let rx = Receiver::start();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut up = tokio::process::Command::new(python())
        .arg(peer("otel_upstream.py"))
        .args(["--http", &port.to_string()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "otel_upstream.py --http did not start"
        );
        assert!(
            up.try_wait().unwrap().is_none(),
            "otel_upstream.py --http exited"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let endpoint = rx.endpoint();
    let d = Daemon::start(
        &format!("[[upstreams]]\nid = \"web\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"),
        "",
        "info",
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{endpoint}/v1/traces"),
            ),
            ("OTEL_SERVICE_NAME", "gatehouse-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let reg = d
        .register(json!({"agent_id": "agent-web", "tools": ["web.*"]}))
        .await;
    let report = client(&rx, &reg, "web.echo", json!({"text": "w"}), &[]).await;
    let tid = report["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &tid);
            find(&t, "gatehouse-test", CLIENT).is_some()
                && find(&t, "otel-upstream", SERVER).is_some()
        })
        .await;
    let t = of_trace(&spans, &tid);
    let gw_client = find(&t, "gatehouse-test", CLIENT).unwrap();
    let up_server = find(&t, "otel-upstream", SERVER).unwrap();
    assert_eq!(gw_client["attributes"]["network.transport"], "tcp");
    // The HTTP upstream's host and port, never its URL (path or query).
    assert_eq!(gw_client["attributes"]["server.address"], "127.0.0.1");
    assert_eq!(gw_client["attributes"]["server.port"], port);
    assert!(
        !serde_json::to_string(gw_client).unwrap().contains("/mcp"),
        "{gw_client:#}"
    );
    assert_eq!(up_server["parent_span_id"], gw_client["span_id"]);
    let text = report["results"][0]["text"].as_str().unwrap();
    let echoed: Value = serde_json::from_str(text).unwrap();
    let want = format!("00-{tid}-{}-01", gw_client["span_id"].as_str().unwrap());
    assert_eq!(echoed["meta"]["traceparent"], want.as_str(), "{echoed}");
    assert_eq!(echoed["headers"]["traceparent"], want.as_str(), "{echoed}");
    assert!(echoed["headers"].get("authorization").is_none(), "{echoed}");
    drop(d);
    let _ = up.kill().await;
}

#[tokio::test]
async fn errors_unsampled_requests_and_a_differing_header_context() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-e", "tools": ["traced.*"]}))
        .await;

    // isError → error.type tool_error, status ERROR, on both gatehouse spans.
    let failed = client(&rx, &reg, "traced.fail", json!({}), &[]).await;
    assert_eq!(failed["results"][0]["isError"], true);
    let tid = failed["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &tid);
            named(&t, "gatehouse-test", SERVER, "tools/call traced.fail").is_some()
                && find(&t, "gatehouse-test", CLIENT).is_some()
        })
        .await;
    let t = of_trace(&spans, &tid);
    for (kind, name) in [
        (SERVER, "tools/call traced.fail"),
        (CLIENT, "tools/call fail"),
    ] {
        let s = named(&t, "gatehouse-test", kind, name).unwrap();
        assert_eq!(s["attributes"]["error.type"], "tool_error", "{s:#}");
        assert_eq!(s["status"]["code"], 2, "ERROR: {s:#}");
    }

    // Unsampled: no gatehouse span, but the upstream gets the trace with flags 00.
    let quiet = client(
        &rx,
        &reg,
        "traced.echo",
        json!({"text": "q"}),
        &["--unsampled"],
    )
    .await;
    let qid = quiet["trace_id"].as_str().unwrap().to_string();
    let tp = traceparent_of_echo(&quiet);
    assert!(
        tp.starts_with(&format!("00-{qid}-")) && tp.ends_with("-00"),
        "{tp}"
    );
    // A sampled call after it: once its spans are in, the unsampled one's would be too.
    let after = client(&rx, &reg, "traced.echo", json!({"text": "a"}), &[]).await;
    let aid = after["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &aid);
            named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").is_some()
                && find(&t, "gatehouse-test", CLIENT).is_some()
        })
        .await;
    assert!(
        of_trace(&spans, &qid).is_empty(),
        "{:#?}",
        of_trace(&spans, &qid)
    );
    // Its audit record still names the trace.
    d.wait_audit(10, |r| {
        r.iter().any(|r| r.rare().trace_id.as_deref() == Some(&qid))
    })
    .await;

    // `_meta` wins; a differing HTTP traceparent becomes a link.
    let other_trace = "0af7651916cd43dd8448eb211c80319c";
    let header = format!("00-{other_trace}-b7ad6b7169203331-01");
    let linked = client(
        &rx,
        &reg,
        "traced.echo",
        json!({"text": "l"}),
        &[&format!("--header-traceparent={header}")],
    )
    .await;
    let lid = linked["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            named(
                &of_trace(s, &lid),
                "gatehouse-test",
                SERVER,
                "tools/call traced.echo",
            )
            .is_some()
        })
        .await;
    let t = of_trace(&spans, &lid);
    let s = named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").unwrap();
    let sdk_client = sdk_call(&t).unwrap();
    assert_eq!(s["parent_span_id"], sdk_client["span_id"]);
    assert_eq!(
        s["links"],
        json!([{"trace_id": other_trace, "span_id": "b7ad6b7169203331"}])
    );
    // An invalid traceparent in the header alone is ignored: a new root, the call served.
    let r = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "traced.echo")
        .header("traceparent", "00-zz-not-valid-01")
        .json(
            &json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{
            "name":"traced.echo","arguments":{"text":"x"},
            "_meta":{"traceparent":"garbage","io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{}}}}),
        )
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let text = v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let echoed: Value = serde_json::from_str(text).unwrap();
    let tp = echoed["meta"]["traceparent"].as_str().unwrap();
    assert!(
        tp.starts_with("00-") && tp.len() == 55 && !tp.contains("garbage"),
        "{tp}"
    );

    // A tracestate carrying the caller's token is dropped: never upstream, never exported.
    let token = reg["token"].as_str().unwrap();
    let smuggler = "11111111111111111111111111111111";
    let r = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "traced.echo")
        .json(
            &json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{
            "name":"traced.echo","arguments":{"text":"s"},
            "_meta":{"traceparent": format!("00-{smuggler}-2222222222222222-01"),
                     "tracestate": format!("vendor={token}"),
                     "baggage": "user.id=alice",
                     "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{}}}}),
        )
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let text = v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!text.contains(token), "the token went upstream: {text}");
    let echoed: Value = serde_json::from_str(text).unwrap();
    // `baggage` passes only with `propagate_baggage = true` (not set here).
    assert!(echoed["meta"].get("baggage").is_none(), "{echoed}");
    assert!(
        echoed["meta"]["traceparent"]
            .as_str()
            .unwrap()
            .starts_with(&format!("00-{smuggler}-")),
        "{echoed}"
    );
    rx.wait_spans(30, |s| {
        find(&of_trace(s, smuggler), "gatehouse-test", CLIENT).is_some()
    })
    .await;
    let everything = serde_json::to_string(&rx.all()).unwrap();
    assert!(!everything.contains(token), "a token reached the collector");
}

#[tokio::test]
async fn baggage_goes_upstream_only_when_configured() {
    let rx = Receiver::start();
    let d = daemon_with(&rx, "[telemetry]\npropagate_baggage = true\n", &[]);
    let reg = d
        .register(json!({"agent_id": "agent-b", "tools": ["traced.*"]}))
        .await;
    let r = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "traced.echo")
        .json(
            &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
            "name":"traced.echo","arguments":{"text":"b"},
            "_meta":{"traceparent": "00-33333333333333333333333333333333-4444444444444444-01",
                     "baggage": "user.id=alice",
                     "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{}}}}),
        )
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let text = v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let echoed: Value = serde_json::from_str(text).unwrap();
    assert_eq!(echoed["meta"]["baggage"], "user.id=alice", "{echoed}");
}

fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

fn counter(m: &str, name: &str) -> u64 {
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or("0")
        .parse()
        .unwrap()
}

/// Calls `demo.echo` `n` times, 8 at a time, over stateless HTTP; the slowest call.
async fn calls(reg: &Value, n: u64) -> Duration {
    let url = reg["mcp_url"].as_str().unwrap().to_string();
    let token = reg["token"].as_str().unwrap().to_string();
    let mut slowest = Duration::ZERO;
    for chunk in 0..n / 8 {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (url, token) = (url.clone(), token.clone());
            set.spawn(async move {
                let t = Instant::now();
                let v = common::stateless(
                    &url,
                    &token,
                    chunk * 8 + i,
                    "tools/call",
                    json!({"name": "demo.echo", "arguments": {"text": "x"}}),
                )
                .await;
                assert!(v["result"].is_object(), "{v}");
                t.elapsed()
            });
        }
        while let Some(d) = set.join_next().await {
            slowest = slowest.max(d.unwrap());
        }
    }
    slowest
}

#[tokio::test]
async fn a_stalled_or_refusing_collector_never_slows_calls_and_its_drops_are_counted() {
    let rx = Receiver::start();
    let d = daemon(
        &rx,
        &[
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "20000"),
        ],
    );
    let reg = d
        .register(json!({"agent_id": "agent-load", "tools": ["demo.echo"]}))
        .await;
    let warm = calls(&reg, 64).await;
    rx.set_mode("stall").await;
    let pid = d.child.id();
    let slowest = calls(&reg, 800).await;
    let rss_before = rss_kb(pid);
    let slowest2 = calls(&reg, 2400).await;
    let rss_after = rss_kb(pid);
    let m = d.metrics().await;
    let dropped = counter(&m, "gatehouse_otel_spans_dropped_total");
    assert!(dropped > 0, "{m}");
    assert!(
        counter(&m, "gatehouse_otel_queue_depth") <= 64,
        "the queue is bounded: {m}"
    );
    // A stalled collector holds the exporter for 30 s; the calls never waited for it.
    assert!(
        slowest < Duration::from_secs(2) && slowest2 < Duration::from_secs(2),
        "warm {warm:?}, stalled {slowest:?} / {slowest2:?}"
    );
    assert!(
        rss_after < rss_before + 8 * 1024,
        "memory grew from {rss_before} to {rss_after} KiB over 2,400 dropped-span calls"
    );

    // A collector answering 503: the exports fail, are counted, and calls go on.
    rx.set_mode("503").await;
    // Wait for the stalled export to end (30 s stall + the 20 s timeout at most).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        calls(&reg, 16).await;
        let m = d.metrics().await;
        if counter(&m, "gatehouse_otel_spans_failed_total") > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no failed export counted: {m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(calls(&reg, 64).await < Duration::from_secs(2));
}

#[tokio::test]
async fn sigterm_flushes_the_spans_still_queued() {
    let rx = Receiver::start();
    // Nothing is posted by the timer within the test: only the shutdown's flush.
    let mut d = daemon(&rx, &[("OTEL_BSP_SCHEDULE_DELAY", "600000")]);
    let reg = d
        .register(json!({"agent_id": "agent-term", "tools": ["demo.echo"]}))
        .await;
    calls(&reg, 24).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.spans().iter().all(|s| service(s) != "gatehouse-test"),
        "posted before the shutdown"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the daemon did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spans = rx
        .wait_spans(10, |s| {
            s.iter()
                .filter(|s| service(s) == "gatehouse-test" && s["kind"] == SERVER)
                .count()
                >= 24
        })
        .await;
    let ours: Vec<_> = spans
        .iter()
        .filter(|s| service(s) == "gatehouse-test")
        .collect();
    assert_eq!(ours.len(), 24, "each call's SERVER span, once");
    assert!(ours.iter().all(|s| s["name"] == "tools/call demo.echo"));
}

/// The span of `trace` whose id is `id`.
fn by_id<'a>(spans: &[&'a Value], id: &Value) -> Option<&'a Value> {
    spans.iter().copied().find(|s| &s["span_id"] == id)
}

#[tokio::test]
async fn proxied_prompts_and_resources_get_server_and_client_spans_and_metrics_by_method() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-px", "tools": ["traced.*"]}))
        .await;
    let token = reg["token"].as_str().unwrap().to_string();
    let report = client(
        &rx,
        &reg,
        "traced.echo",
        json!({"text": "p"}),
        &[
            "--prompt=traced.greet",
            "--resource=memo://greeting",
            "--resource=memo://user:pw0rdX@greeting?sig=S3CRETQ#frag",
        ],
    )
    .await;
    assert_eq!(report["prompt"], "Greet gatehouse.", "{report}");
    assert_eq!(
        report["resources"][0], "hello from the traced upstream",
        "{report}"
    );
    let tid = report["trace_id"].as_str().unwrap().to_string();
    let reads = |t: &[&Value]| {
        t.iter()
            .filter(|s| {
                service(s) == "gatehouse-test"
                    && s["kind"] == SERVER
                    && s["name"] == "resources/read"
            })
            .count()
    };
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &tid);
            named(&t, "gatehouse-test", SERVER, "prompts/get traced.greet").is_some()
                && named(&t, "gatehouse-test", CLIENT, "prompts/get greet").is_some()
                && reads(&t) == 2
                && t.iter()
                    .filter(|s| {
                        service(s) == "gatehouse-test"
                            && s["kind"] == CLIENT
                            && s["name"] == "resources/read"
                    })
                    .count()
                    == 2
                && t.iter().filter(|s| service(s) == "otel-upstream").count() >= 3
        })
        .await;
    let t = of_trace(&spans, &tid);

    // prompts/get: SERVER (the SDK's span its parent) → CLIENT → the upstream's SERVER.
    let server = named(&t, "gatehouse-test", SERVER, "prompts/get traced.greet").unwrap();
    let parent = by_id(&t, &server["parent_span_id"]).expect("its parent");
    assert_eq!(service(parent), "otel-client");
    assert!(
        parent["name"]
            .as_str()
            .unwrap()
            .starts_with("MCP send prompts/get"),
        "{parent:#}"
    );
    let a = &server["attributes"];
    assert_eq!(a["mcp.method.name"], "prompts/get");
    assert_eq!(a["gen_ai.prompt.name"], "traced.greet");
    assert_eq!(a["gen_ai.agent.id"], "agent-px");
    assert_eq!(a["gatehouse.registration.id"], reg["id"]);
    assert!(a["jsonrpc.request.id"].is_string(), "{a}");
    let client_span = named(&t, "gatehouse-test", CLIENT, "prompts/get greet").unwrap();
    assert_eq!(client_span["parent_span_id"], server["span_id"]);
    let a = &client_span["attributes"];
    assert_eq!(a["mcp.method.name"], "prompts/get");
    assert_eq!(a["gen_ai.prompt.name"], "greet");
    assert_eq!(a["network.transport"], "pipe");
    assert_eq!(a["gatehouse.upstream.name"], "traced");
    assert!(a["jsonrpc.request.id"].is_string(), "{a}");
    assert!(
        t.iter().any(|s| service(s) == "otel-upstream"
            && s["kind"] == SERVER
            && s["parent_span_id"] == client_span["span_id"]),
        "the upstream's span of prompts/get is the CLIENT span's child: {t:#?}"
    );
    // Finding the prompt listed the upstream's prompts: a CLIENT span too, the same parent.
    let listed = named(&t, "gatehouse-test", CLIENT, "prompts/list").unwrap();
    assert_eq!(listed["parent_span_id"], server["span_id"]);

    // resources/read: no URI in the name; the URI an attribute, its userinfo, query and
    // fragment cut.
    let read_servers: Vec<&Value> = t
        .iter()
        .copied()
        .filter(|s| {
            service(s) == "gatehouse-test" && s["kind"] == SERVER && s["name"] == "resources/read"
        })
        .collect();
    for s in &read_servers {
        let uri = s["attributes"]["mcp.resource.uri"].as_str().unwrap();
        assert!(uri == "memo://greeting", "{s:#}");
        let children: Vec<&&Value> = t
            .iter()
            .filter(|c| c["parent_span_id"] == s["span_id"] && service(c) == "gatehouse-test")
            .collect();
        assert!(
            children.iter().any(|c| c["name"] == "resources/read"
                && c["kind"] == CLIENT
                && c["attributes"]["mcp.resource.uri"] == "memo://greeting"),
            "{children:#?}"
        );
        assert!(
            children.iter().any(|c| c["name"] == "resources/list"),
            "{children:#?}"
        );
    }
    // The SDK client's and upstream's own spans carry the URI as sent (not ours to cut).
    let ours = serde_json::to_string(
        &rx.spans()
            .into_iter()
            .filter(|s| service(s) == "gatehouse-test")
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for secret in ["S3CRETQ", "pw0rdX", "frag"] {
        assert!(!ours.contains(secret), "{secret} in a span of ours");
    }
    let everything = serde_json::to_string(&rx.all()).unwrap();
    for secret in [token.as_str(), d.token.as_str()] {
        assert!(
            !everything.contains(secret),
            "a token reached the collector"
        );
    }

    // The conventions' histograms, by method, for every method.
    let m = d.metrics().await;
    for method in ["initialize", "prompts/get", "resources/read"] {
        assert!(
            m.lines().any(
                |l| l.starts_with("mcp_server_operation_duration_seconds_count{")
                    && l.contains(&format!(r#"mcp_method_name="{method}""#))
            ),
            "{method}: {m}"
        );
    }
    for method in ["prompts/get", "prompts/list", "resources/read"] {
        assert!(
            m.lines().any(
                |l| l.starts_with("mcp_client_operation_duration_seconds_count{")
                    && l.contains(&format!(r#"mcp_method_name="{method}""#))
                    && l.contains(r#"network_transport="pipe""#)
            ),
            "{method}: {m}"
        );
    }
    assert!(
        !m.contains("agent-px")
            && !m.contains(reg["id"].as_str().unwrap())
            && !m.contains("greeting"),
        "never by agent, registration or URI: {m}"
    );
}

#[tokio::test]
async fn pool_work_has_its_own_trace_linked_from_the_call_that_waited_on_it() {
    let rx = Receiver::start();
    // One connection per registration: its first call spawns it (and waits).
    let d = daemon_sharing(&rx, "", "per_registration", &[]);
    let reg = d
        .register(json!({"agent_id": "agent-pool", "tools": ["traced.*"]}))
        .await;
    // The registration read the upstream's catalog: pool work, a root of its own.
    let spans = rx
        .wait_spans(30, |s| {
            s.iter()
                .any(|s| service(s) == "gatehouse-test" && s["name"] == "catalog traced")
        })
        .await;
    let catalog = spans
        .iter()
        .find(|s| service(s) == "gatehouse-test" && s["name"] == "catalog traced")
        .unwrap();
    assert_eq!(catalog["parent_span_id"], "");
    assert_eq!(catalog["kind"], 1, "INTERNAL");
    assert_eq!(catalog["attributes"]["gatehouse.pool.work"], "catalog");

    let first = client(&rx, &reg, "traced.echo", json!({"text": "1"}), &[]).await;
    let tid = first["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            named(
                &of_trace(s, &tid),
                "gatehouse-test",
                CLIENT,
                "tools/call echo",
            )
            .is_some()
                && named(
                    &of_trace(s, &tid),
                    "gatehouse-test",
                    SERVER,
                    "tools/call traced.echo",
                )
                .is_some()
                && s.iter()
                    .any(|s| service(s) == "gatehouse-test" && s["name"] == "spawn traced")
        })
        .await;
    let spawns: Vec<&Value> = spans
        .iter()
        .filter(|s| service(s) == "gatehouse-test" && s["name"] == "spawn traced")
        .collect();
    // The catalog's probe and the registration's own connection.
    let spawn = spawns.last().unwrap();
    assert_eq!(spawn["parent_span_id"], "", "a trace of its own");
    assert_ne!(spawn["trace_id"], tid.as_str());
    let a = &spawn["attributes"];
    assert_eq!(a["gatehouse.pool.work"], "spawn");
    assert_eq!(a["gatehouse.upstream.name"], "traced");
    assert_eq!(a["network.transport"], "pipe");
    assert!(a["gatehouse.upstream.epoch"].is_i64(), "{a}");
    let link = json!([{"trace_id": spawn["trace_id"], "span_id": spawn["span_id"]}]);
    let t = of_trace(&spans, &tid);
    let call_client = named(&t, "gatehouse-test", CLIENT, "tools/call echo").unwrap();
    let call_server = named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").unwrap();
    assert_eq!(call_client["links"], link, "{call_client:#}");
    assert_eq!(call_server["links"], link, "{call_server:#}");
    // The upstream's own spans of the pool's requests joined the pool work's traces: its
    // `initialize` under the spawn, its `tools/list` under the catalog read.
    let catalog_id = catalog["span_id"].clone();
    let spawn_id = spawn["span_id"].clone();
    rx.wait_spans(30, |s| {
        let under = |id: &Value| {
            s.iter()
                .any(|x| service(x) == "otel-upstream" && &x["parent_span_id"] == id)
        };
        under(&catalog_id) && under(&spawn_id)
    })
    .await;
    // No span of the call's trace is pool work: one agent's trace never holds it.
    assert!(t
        .iter()
        .all(|s| s["attributes"].get("gatehouse.pool.work").is_none()));

    // The next call finds the connection up: it waited on nothing, and links nothing.
    let second = client(&rx, &reg, "traced.echo", json!({"text": "2"}), &[]).await;
    let tid2 = second["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            named(
                &of_trace(s, &tid2),
                "gatehouse-test",
                SERVER,
                "tools/call traced.echo",
            )
            .is_some()
        })
        .await;
    let t2 = of_trace(&spans, &tid2);
    for s in t2.iter().filter(|s| service(s) == "gatehouse-test") {
        assert_eq!(s["links"], json!([]), "{s:#}");
    }
    // Never the upstream's argv or env in a span of ours.
    let ours = serde_json::to_string(
        &spans
            .iter()
            .filter(|s| service(s) == "gatehouse-test")
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(!ours.contains("otel_upstream.py"), "argv in a span");
    assert!(!ours.contains(&rx.endpoint()), "env in a span");
}

#[tokio::test]
async fn capture_tool_io_records_bounded_arguments_and_results_and_never_a_token() {
    let rx = Receiver::start();
    let d = daemon_at(
        &rx.endpoint(),
        "[telemetry]\ncapture_tool_io = true\n",
        "shared",
        "redact_keys = [\"password\"]",
        &[],
    );
    let reg = d
        .register(json!({"agent_id": "agent-io", "tools": ["traced.*"]}))
        .await;
    let token = reg["token"].as_str().unwrap().to_string();
    let server_of = |tid: String| {
        let rx = &rx;
        async move {
            let spans = rx
                .wait_spans(30, |s| {
                    named(
                        &of_trace(s, &tid),
                        "gatehouse-test",
                        SERVER,
                        "tools/call traced.echo",
                    )
                    .is_some()
                })
                .await;
            named(
                &of_trace(&spans, &tid),
                "gatehouse-test",
                SERVER,
                "tools/call traced.echo",
            )
            .unwrap()
            .clone()
        }
    };

    let small = client(
        &rx,
        &reg,
        "traced.echo",
        json!({"text": "io-small", "password": "hunter2"}),
        &[],
    )
    .await;
    let s = server_of(small["trace_id"].as_str().unwrap().to_string()).await;
    let a = &s["attributes"];
    // As the audit keeps them: `[audit] redact_keys` applied.
    assert_eq!(
        a["gen_ai.tool.call.arguments"], r#"{"text":"io-small","password":"[redacted]"}"#,
        "{a}"
    );
    let result = a["gen_ai.tool.call.result"].as_str().unwrap();
    assert!(
        result.contains("io-small") && result.contains("content"),
        "{result}"
    );

    let long = "x".repeat(10_000);
    let big = client(&rx, &reg, "traced.echo", json!({"text": long}), &[]).await;
    let s = server_of(big["trace_id"].as_str().unwrap().to_string()).await;
    for key in ["gen_ai.tool.call.arguments", "gen_ai.tool.call.result"] {
        let v = s["attributes"][key].as_str().unwrap();
        assert!(
            v.len() <= 4096 + '…'.len_utf8() && v.ends_with('…'),
            "{key}: {} bytes",
            v.len()
        );
    }

    // Arguments carrying the caller's token (and so its echo): neither is recorded.
    let smuggler = "55555555555555555555555555555555";
    let r = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "traced.echo")
        .json(
            &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{
            "name":"traced.echo","arguments":{"text": format!("key {token}")},
            "_meta":{"traceparent": format!("00-{smuggler}-6666666666666666-01"),
                     "io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{}}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let s = server_of(smuggler.to_string()).await;
    assert!(
        s["attributes"].get("gen_ai.tool.call.arguments").is_none(),
        "{s:#}"
    );
    assert!(
        s["attributes"].get("gen_ai.tool.call.result").is_none(),
        "{s:#}"
    );
    let everything = serde_json::to_string(&rx.all()).unwrap();
    assert!(
        !everything.contains(&token),
        "a token reached the collector"
    );
    assert!(
        !everything.contains("hunter2"),
        "a redacted value reached the collector"
    );
}

/// Rotel (PyPI `rotel`, whose wheel ships the Rust collector `rotel-agent`), receiving OTLP/HTTP
/// on a loopback port and exporting OTLP/HTTP to the receiver.
struct Collector {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    fn start(rx: &Receiver) -> Collector {
        let out = Command::new(python())
            .args([
                "-c",
                "import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rotel is missing from tests/peers/.venv: run `bash tests/peers/setup.sh`"
        );
        let agent = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(
            std::path::Path::new(&agent).exists(),
            "no rotel-agent at {agent}"
        );
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(agent)
            .arg("start")
            .args(["--otlp-grpc-endpoint", "127.0.0.1:0"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{port}")])
            .args(["--exporter", "otlp", "--otlp-exporter-protocol", "http"])
            .args(["--otlp-exporter-endpoint", &rx.endpoint()])
            .args(["--batch-timeout", "100ms"])
            .arg("--pid-file")
            .arg(dir.path().join("rotel.pid"))
            .arg("--log-file")
            .arg(dir.path().join("rotel.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "rotel-agent did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Collector {
            child,
            port,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

#[tokio::test]
async fn through_the_rotel_collector_the_receiver_still_holds_one_trace() {
    let rx = Receiver::start();
    let collector = Collector::start(&rx);
    let endpoint = collector.endpoint();
    // The client, gatehouse and the upstream all export to the collector, which forwards.
    let d = daemon_at(&endpoint, "", "shared", "", &[]);
    let reg = d
        .register(json!({"agent_id": "agent-col", "tools": ["traced.*"]}))
        .await;
    let report = client_at(&endpoint, &reg, "traced.echo", json!({"text": "c"}), &[]).await;
    let tid = report["trace_id"].as_str().unwrap().to_string();
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, &tid);
            sdk_call(&t).is_some()
                && named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").is_some()
                && named(&t, "gatehouse-test", CLIENT, "tools/call echo").is_some()
                && find(&t, "otel-upstream", SERVER).is_some()
        })
        .await;
    let t = of_trace(&spans, &tid);
    let sdk_client = sdk_call(&t).unwrap();
    let gw_server = named(&t, "gatehouse-test", SERVER, "tools/call traced.echo").unwrap();
    let gw_client = named(&t, "gatehouse-test", CLIENT, "tools/call echo").unwrap();
    let up_server = find(&t, "otel-upstream", SERVER).unwrap();
    assert_eq!(gw_server["parent_span_id"], sdk_client["span_id"]);
    assert_eq!(gw_client["parent_span_id"], gw_server["span_id"]);
    assert_eq!(up_server["parent_span_id"], gw_client["span_id"]);
    assert_eq!(gw_server["attributes"]["gen_ai.agent.id"], "agent-col");
    // What arrived came through the collector (its own client, gzip), with no token.
    let reqs = rx.requests();
    assert!(!reqs.is_empty());
    assert!(
        reqs.iter()
            .all(|r| r["headers"]["content-encoding"] == "gzip"),
        "{reqs:#?}"
    );
    let everything = serde_json::to_string(&rx.all()).unwrap();
    for secret in [reg["token"].as_str().unwrap(), d.token.as_str()] {
        assert!(
            !everything.contains(secret),
            "a token reached the collector"
        );
    }
}

/// A stateless (2026-07-28) request; `header`: a `traceparent` header too.
async fn stateless_traced(
    reg: &Value,
    id: u64,
    method: &str,
    params: Value,
    header: Option<&str>,
) -> Value {
    let mut req = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(h) = header {
        req = req.header("traceparent", h);
    }
    if let Some(name) = params["name"].as_str() {
        req = req.header("mcp-name", name);
    }
    let mut params = params;
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let r = req
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    r.json().await.unwrap()
}

#[tokio::test]
async fn stateless_discover_list_and_prompts_get_server_spans_parented_from_meta_or_header() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-sl", "tools": ["traced.*"]}))
        .await;
    let t1 = "77777777777777777777777777777777";
    let t2 = "88888888888888888888888888888888";
    let t3 = "99999999999999999999999999999999";
    let discover = stateless_traced(
        &reg,
        1,
        "server/discover",
        json!({"_meta": {"traceparent": format!("00-{t1}-1111111111111111-01")}}),
        None,
    )
    .await;
    assert!(discover["result"]["capabilities"].is_object(), "{discover}");
    let list = stateless_traced(
        &reg,
        2,
        "tools/list",
        json!({}),
        Some(&format!("00-{t2}-2222222222222222-01")),
    )
    .await;
    assert!(list["result"]["tools"].is_array(), "{list}");
    let bad = stateless_traced(
        &reg,
        3,
        "prompts/get",
        json!({"name": "traced.nope", "_meta": {"traceparent": format!("00-{t3}-3333333333333333-01")}}),
        None,
    )
    .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let spans = rx
        .wait_spans(30, |s| {
            named(
                &of_trace(s, t1),
                "gatehouse-test",
                SERVER,
                "server/discover",
            )
            .is_some()
                && named(&of_trace(s, t2), "gatehouse-test", SERVER, "tools/list").is_some()
                && named(
                    &of_trace(s, t3),
                    "gatehouse-test",
                    SERVER,
                    "prompts/get traced.nope",
                )
                .is_some()
        })
        .await;
    let s = named(
        &of_trace(&spans, t1),
        "gatehouse-test",
        SERVER,
        "server/discover",
    )
    .unwrap();
    assert_eq!(s["parent_span_id"], "1111111111111111");
    assert_eq!(s["attributes"]["mcp.method.name"], "server/discover");
    assert_eq!(
        s["attributes"]["mcp.protocol.version"],
        json!(null),
        "no session: {s:#}"
    );
    assert!(s["attributes"].get("mcp.session.id").is_none(), "{s:#}");
    assert_eq!(s["attributes"]["gatehouse.transport"], "stateless");
    let s = named(
        &of_trace(&spans, t2),
        "gatehouse-test",
        SERVER,
        "tools/list",
    )
    .unwrap();
    assert_eq!(
        s["parent_span_id"], "2222222222222222",
        "the header's context"
    );
    assert_eq!(s["attributes"]["jsonrpc.request.id"], "2");
    let s = named(
        &of_trace(&spans, t3),
        "gatehouse-test",
        SERVER,
        "prompts/get traced.nope",
    )
    .unwrap();
    assert_eq!(s["status"]["code"], 2, "ERROR: {s:#}");
    assert_eq!(
        s["attributes"]["error.type"],
        bad["error"]["code"].as_i64().unwrap().to_string(),
        "{s:#}"
    );
    let m = d.metrics().await;
    for method in ["server/discover", "tools/list", "prompts/get"] {
        assert!(
            m.lines().any(
                |l| l.starts_with("mcp_server_operation_duration_seconds_count{")
                    && l.contains(&format!(r#"mcp_method_name="{method}""#))
            ),
            "{method}: {m}"
        );
    }
}

#[tokio::test]
async fn a_streamable_initialize_is_parented_from_the_http_header() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-init", "tools": ["traced.*"]}))
        .await;
    let t = "abababababababababababababababab";
    let r = reqwest::Client::new()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("traceparent", format!("00-{t}-4444444444444444-01"))
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("mcp-session-id").is_some(), "{r:?}");
    let spans = rx
        .wait_spans(30, |s| {
            named(&of_trace(s, t), "gatehouse-test", SERVER, "initialize").is_some()
        })
        .await;
    let s = named(&of_trace(&spans, t), "gatehouse-test", SERVER, "initialize").unwrap();
    assert_eq!(
        s["parent_span_id"], "4444444444444444",
        "the header's context: {s:#}"
    );
}

#[tokio::test]
async fn task_requests_get_client_spans_under_their_server_span() {
    let rx = Receiver::start();
    // In process, with server-everything (a task-required research tool) as the upstream.
    let tg = common::TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.telemetry.endpoint = Some(rx.endpoint());
        c.telemetry.service_name = "gatehouse-test".into();
        c.telemetry.delay_ms = 100;
        c.upstreams = vec![common::everything("everything", "shared", 30, "")];
    });
    let reg = tg
        .gateway
        .register(gatehouse::RegistrationSpec::new("agent-task").grant("everything.*"))
        .await
        .unwrap();
    let mut c = common::SseClient::connect(&reg.sse_url(), reg.token()).await;
    let r = c
        .request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}),
        )
        .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-11-25", "{r}");
    c.notify("notifications/initialized", json!({})).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": "everything.simulate-research-query",
                   "arguments": {"topic": "tides"}, "task": {"ttl": 60_000}}),
        )
        .await;
    let task = r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let tid = "abababababababababababababababab";
    let meta = |span: &str| json!({"traceparent": format!("00-{tid}-{span}-01")});
    let got = c
        .request(
            "tasks/get",
            json!({"taskId": task, "_meta": meta("1212121212121212")}),
        )
        .await;
    assert_eq!(got["result"]["taskId"], task.as_str(), "{got}");
    let done = c
        .request(
            "tasks/result",
            json!({"taskId": task, "_meta": meta("3434343434343434")}),
        )
        .await;
    assert!(done["result"].is_object(), "{done}");
    let spans = rx
        .wait_spans(30, |s| {
            let t = of_trace(s, tid);
            named(&t, "gatehouse-test", SERVER, "tasks/result").is_some()
                && named(&t, "gatehouse-test", CLIENT, "tasks/result").is_some()
        })
        .await;
    let t = of_trace(&spans, tid);
    let server = named(&t, "gatehouse-test", SERVER, "tasks/result").unwrap();
    assert_eq!(server["parent_span_id"], "3434343434343434");
    let client = named(&t, "gatehouse-test", CLIENT, "tasks/result").unwrap();
    assert_eq!(client["parent_span_id"], server["span_id"]);
    assert_eq!(client["attributes"]["network.transport"], "pipe");
    assert_eq!(
        client["attributes"]["gatehouse.upstream.name"],
        "everything"
    );
    let get = named(&t, "gatehouse-test", SERVER, "tasks/get").unwrap();
    assert_eq!(get["parent_span_id"], "1212121212121212");
    let everything = serde_json::to_string(&rx.all()).unwrap();
    assert!(
        !everything.contains(reg.token()),
        "a token reached the collector"
    );
    drop(reg);
}

/// A JSON-RPC batch (2025-03-26) with a `traceparent` header: each call's server span is
/// parented from the header, as a single request's is (the batch's request context once
/// lacked the trace headers).
#[tokio::test]
async fn a_streamable_batch_is_parented_from_the_http_header() {
    let rx = Receiver::start();
    let d = daemon(&rx, &[]);
    let reg = d
        .register(json!({"agent_id": "agent-batch", "tools": ["traced.*"]}))
        .await;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(reg["mcp_url"].as_str().unwrap())
            .bearer_auth(reg["token"].as_str().unwrap())
            .header("accept", "application/json, text/event-stream")
            .json(&body)
    };
    let r = post(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    )
    .send()
    .await
    .unwrap();
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let t = "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";
    let r = post(json!([
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    ]))
    .header("mcp-session-id", &sid)
    .header("mcp-protocol-version", "2025-03-26")
    .header("traceparent", format!("00-{t}-5555555555555555-01"))
    .send()
    .await
    .unwrap();
    let replies: Value = r.json().await.unwrap();
    assert_eq!(replies.as_array().map(Vec::len), Some(2), "{replies}");
    let spans = rx
        .wait_spans(30, |s| {
            named(&of_trace(s, t), "gatehouse-test", SERVER, "tools/list").is_some()
        })
        .await;
    let s = named(&of_trace(&spans, t), "gatehouse-test", SERVER, "tools/list")
        .unwrap_or_else(|| panic!("no tools/list span in the header's trace"));
    assert_eq!(
        s["parent_span_id"], "5555555555555555",
        "the header's context: {s:#}"
    );
}
