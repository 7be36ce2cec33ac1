//! Drives the demo upstreams (`helpdesk` and `echo`) over in-memory duplex pipes.

// Test code: a failed expectation should stop the test loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use gatehouse::testing::demo_upstream::{serve, serve_echo, HelpdeskOptions};
use serde_json::{json, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};
use tokio::task::JoinHandle;

const LEASE_KEY: &str = "io.gatehouse/lease";

/// A client talking to one in-process server; the server task is aborted on drop.
struct TestClient {
    writer: Option<WriteHalf<DuplexStream>>,
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    server: JoinHandle<anyhow::Result<()>>,
    next_id: i64,
}

impl Drop for TestClient {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl TestClient {
    fn helpdesk(opts: HelpdeskOptions) -> Self {
        Self::start(|r, w| tokio::spawn(serve(r, w, opts)))
    }

    fn echo() -> Self {
        Self::start(|r, w| tokio::spawn(serve_echo(r, w)))
    }

    fn start(
        spawn: impl FnOnce(
            ReadHalf<DuplexStream>,
            WriteHalf<DuplexStream>,
        ) -> JoinHandle<anyhow::Result<()>>,
    ) -> Self {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (server_r, server_w) = tokio::io::split(server);
        let server = spawn(server_r, server_w);
        let (client_r, client_w) = tokio::io::split(client);
        Self {
            writer: Some(client_w),
            lines: BufReader::new(client_r).lines(),
            server,
            next_id: 0,
        }
    }

    async fn send_raw(&mut self, line: &str) {
        let writer = self.writer.as_mut().expect("input still open");
        writer.write_all(line.as_bytes()).await.expect("write");
        writer.write_all(b"\n").await.expect("write");
        writer.flush().await.expect("flush");
    }

    async fn send(&mut self, message: Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// Next message from the server (fails after 10 s of silence).
    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("server answered in time")
            .expect("read")
            .expect("server output still open");
        serde_json::from_str(&line).expect("server wrote JSON")
    }

    /// Send a request and return its id.
    async fn start_request(&mut self, method: &str, params: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        id
    }

    /// Send a request and wait for its response (nothing else may arrive first).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.start_request(method, params).await;
        let reply = self.recv().await;
        assert_eq!(reply["id"], json!(id), "unexpected message: {reply}");
        reply
    }

    /// `tools/call` under a lease (`None`: no lease in `_meta`); returns the result.
    async fn call(&mut self, lease: Option<&str>, tool: &str, arguments: Value) -> Value {
        let mut params = json!({ "name": tool, "arguments": arguments });
        if let Some(lease) = lease {
            params["_meta"] = json!({ LEASE_KEY: lease });
        }
        let reply = self.request("tools/call", params).await;
        assert!(reply.get("error").is_none(), "protocol error: {reply}");
        reply["result"].clone()
    }

    async fn initialize(&mut self, version: &str) -> Value {
        let reply = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": { "name": "test", "version": "0" }
                }),
            )
            .await;
        self.notify("notifications/initialized", json!({})).await;
        reply["result"].clone()
    }

    async fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({ "jsonrpc": "2.0", "method": method, "params": params }))
            .await;
    }

    /// Close the server's input; returns what `serve` returned.
    async fn close(&mut self) -> anyhow::Result<()> {
        if let Some(mut writer) = self.writer.take() {
            // Dropping one half of a split duplex does not close it; shutdown does.
            writer.shutdown().await.expect("shutdown");
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.server)
            .await
            .expect("server stopped in time")
            .expect("server task")
    }
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().expect("text content")
}

fn slow(ms: u64) -> HelpdeskOptions {
    HelpdeskOptions {
        slow_ms: ms,
        ..HelpdeskOptions::default()
    }
}

#[test]
fn default_options() {
    let opts = HelpdeskOptions::default();
    assert!(opts.lease_extension);
    assert_eq!(opts.slow_ms, 2000);
}

#[tokio::test]
async fn initialize_and_list_tools() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    let init = client.initialize("2025-06-18").await;
    assert_eq!(init["protocolVersion"], "2025-06-18");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(
        init["capabilities"]["experimental"]["io.gatehouse/lease"],
        json!({})
    );
    assert_eq!(init["serverInfo"]["name"], "gatehouse-helpdesk");
    assert_eq!(init["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));

    let unknown = client.initialize("1999-01-01").await;
    assert_eq!(unknown["protocolVersion"], "2025-11-25");
    for version in ["2024-11-05", "2025-03-26", "2025-11-25"] {
        assert_eq!(client.initialize(version).await["protocolVersion"], version);
    }

    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));

    let tools = client.request("tools/list", json!({})).await["result"]["tools"].clone();
    let tools = tools.as_array().expect("tools array");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        ["open_case", "add_note", "add_note_slow", "list_notes"]
    );
    for tool in tools {
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object", "{tool}");
        assert!(schema["properties"].is_object(), "{tool}");
        assert!(schema["required"].is_array(), "{tool}");
        assert!(tool["annotations"].is_object(), "{tool}");
    }
    assert_eq!(tools[0]["inputSchema"]["required"], json!(["title"]));
    assert_eq!(tools[1]["inputSchema"]["required"], json!(["text"]));
    assert_eq!(tools[3]["annotations"]["readOnlyHint"], true);
    assert_eq!(tools[0]["annotations"]["readOnlyHint"], false);

    client.close().await.expect("clean shutdown");
}

/// Issue 50 item 9: `open_case` declares its `outputSchema`, and its text is the JSON of its
/// `structuredContent` (the spec's SHOULD), which carries the title: a client that prefers
/// either form hands the model the same facts.
#[tokio::test]
async fn open_case_text_is_the_json_of_its_structured_content_and_its_output_schema_holds() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    client.initialize("2025-11-25").await;
    let tools = client.request("tools/list", json!({})).await["result"]["tools"].clone();
    let open = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "open_case")
        .unwrap()
        .clone();
    let schema = &open["outputSchema"];
    assert_eq!(schema["type"], "object", "{open}");
    assert_eq!(schema["required"], json!(["case_id", "title", "lease"]));
    for lease in [Some("lease-a"), None] {
        let r = client
            .call(lease, "open_case", json!({"title": "printer on fire"}))
            .await;
        assert_eq!(r["isError"], false, "{r}");
        let structured = &r["structuredContent"];
        let parsed: Value = serde_json::from_str(text(&r)).expect("the text is JSON");
        assert_eq!(&parsed, structured, "{r}");
        assert_eq!(structured["title"], "printer on fire");
        // Every required property is there with the declared type, and nothing undeclared.
        let props = schema["properties"].as_object().unwrap();
        for (k, v) in structured.as_object().unwrap() {
            assert!(props.contains_key(k), "{k} not declared: {schema}");
            assert_eq!(props[k]["type"], "string");
            assert!(v.is_string(), "{k}: {v}");
        }
        for k in schema["required"].as_array().unwrap() {
            assert!(
                structured.get(k.as_str().unwrap()).is_some(),
                "{k} missing: {r}"
            );
        }
    }
    client.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn without_extension_the_capability_is_not_advertised() {
    let mut client = TestClient::helpdesk(HelpdeskOptions {
        lease_extension: false,
        ..HelpdeskOptions::default()
    });
    let init = client.initialize("2025-11-25").await;
    assert!(init["capabilities"].get("experimental").is_none(), "{init}");
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true);
}

#[tokio::test]
async fn leases_keep_their_own_selected_case() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    client.initialize("2025-11-25").await;

    let a = client
        .call(Some("lease-a"), "open_case", json!({"title": "printer"}))
        .await;
    assert_eq!(a["structuredContent"]["title"], "printer");
    assert_eq!(a["structuredContent"]["case_id"], "case-1");
    assert_eq!(a["structuredContent"]["lease"], "lease-a");
    let b = client
        .call(Some("lease-b"), "open_case", json!({"title": "vpn"}))
        .await;
    assert_eq!(b["structuredContent"]["case_id"], "case-2");
    assert_eq!(b["structuredContent"]["lease"], "lease-b");

    let note = client
        .call(Some("lease-a"), "add_note", json!({"text": "a1"}))
        .await;
    assert_eq!(text(&note), "note added to case-1");
    assert_eq!(note["isError"], false);
    let note = client
        .call(Some("lease-b"), "add_note", json!({"text": "b1"}))
        .await;
    assert_eq!(text(&note), "note added to case-2");
    client
        .call(Some("lease-a"), "add_note", json!({"text": "a2"}))
        .await;

    let list = client.call(Some("lease-a"), "list_notes", json!({})).await;
    assert_eq!(text(&list), "a1\na2");
    assert_eq!(
        list["structuredContent"],
        json!({"case_id": "case-1", "notes": ["a1", "a2"], "lease": "lease-a"})
    );
    let list = client.call(Some("lease-b"), "list_notes", json!({})).await;
    assert_eq!(list["structuredContent"]["notes"], json!(["b1"]));
    assert_eq!(list["structuredContent"]["case_id"], "case-2");

    // The default lease (no `_meta`) has selected nothing.
    let none = client.call(None, "add_note", json!({"text": "x"})).await;
    assert_eq!(none["isError"], true);
    assert_eq!(text(&none), "no case selected: call open_case first");
    assert_eq!(none["_meta"]["lease"], "");
    let none = client.call(None, "list_notes", json!({})).await;
    assert_eq!(none["isError"], true);
}

#[tokio::test]
async fn without_extension_all_callers_share_one_selection() {
    let mut client = TestClient::helpdesk(HelpdeskOptions {
        lease_extension: false,
        ..HelpdeskOptions::default()
    });
    client.initialize("2025-11-25").await;
    client
        .call(Some("lease-a"), "open_case", json!({"title": "printer"}))
        .await;
    let b = client
        .call(Some("lease-b"), "open_case", json!({"title": "vpn"}))
        .await;
    assert_eq!(b["structuredContent"]["lease"], "");

    let note = client
        .call(Some("lease-a"), "add_note", json!({"text": "from a"}))
        .await;
    assert_eq!(text(&note), "note added to case-2");
    let list = client.call(None, "list_notes", json!({})).await;
    assert_eq!(
        list["structuredContent"],
        json!({"case_id": "case-2", "notes": ["from a"], "lease": ""})
    );

    // A lease release means nothing to a server without the extension.
    client
        .notify(
            "notifications/io.gatehouse/lease_released",
            json!({"lease": ""}),
        )
        .await;
    let list = client.call(Some("lease-b"), "list_notes", json!({})).await;
    assert_eq!(list["structuredContent"]["notes"], json!(["from a"]));
}

#[tokio::test]
async fn slow_note_reports_progress_without_blocking_others() {
    let mut client = TestClient::helpdesk(slow(500));
    client.initialize("2025-11-25").await;
    client
        .call(Some("l"), "open_case", json!({"title": "t"}))
        .await;

    let slow_id = client
        .start_request(
            "tools/call",
            json!({
                "name": "add_note_slow",
                "arguments": {"text": "slow one"},
                "_meta": {"progressToken": "tok-1", LEASE_KEY: "l"}
            }),
        )
        .await;
    // A quick request overtakes the slow one.
    let ping = client.request("ping", json!({})).await;
    assert_eq!(ping["result"], json!({}));

    let mut last_progress = 0.0;
    let mut notifications = 0;
    let result = loop {
        let msg = client.recv().await;
        if msg["method"] == "notifications/progress" {
            let params = &msg["params"];
            assert_eq!(params["progressToken"], "tok-1");
            assert_eq!(params["total"], 500);
            assert!(params["message"].is_string());
            let progress = params["progress"].as_f64().expect("number");
            assert!(progress > last_progress, "progress must increase");
            last_progress = progress;
            notifications += 1;
        } else {
            assert_eq!(msg["id"], slow_id, "{msg}");
            break msg["result"].clone();
        }
    };
    assert!(
        notifications >= 5,
        "only {notifications} progress notifications"
    );
    assert_eq!(text(&result), "note added to case-1");
    let list = client.call(Some("l"), "list_notes", json!({})).await;
    assert_eq!(list["structuredContent"]["notes"], json!(["slow one"]));
}

#[tokio::test]
async fn cancelled_slow_note_writes_nothing_and_sends_no_response() {
    let mut client = TestClient::helpdesk(slow(600));
    client.initialize("2025-11-25").await;
    client
        .call(Some("l"), "open_case", json!({"title": "t"}))
        .await;

    let slow_id = client
        .start_request(
            "tools/call",
            json!({
                "name": "add_note_slow",
                "arguments": {"text": "never"},
                "_meta": {"progressToken": 7, LEASE_KEY: "l"}
            }),
        )
        .await;
    let first = client.recv().await;
    assert_eq!(first["method"], "notifications/progress");
    assert_eq!(first["params"]["progressToken"], 7);

    client
        .notify(
            "notifications/cancelled",
            json!({"requestId": slow_id, "reason": "test"}),
        )
        .await;
    // Wait past the moment the note would have been written.
    tokio::time::sleep(Duration::from_millis(900)).await;

    let list_id = client
        .start_request(
            "tools/call",
            json!({"name": "list_notes", "arguments": {}, "_meta": {LEASE_KEY: "l"}}),
        )
        .await;
    let list = loop {
        let msg = client.recv().await;
        assert_ne!(msg["id"], slow_id, "cancelled request was answered: {msg}");
        if msg["id"] == list_id {
            break msg["result"].clone();
        }
        assert_eq!(msg["method"], "notifications/progress", "{msg}");
    };
    assert_eq!(list["structuredContent"]["notes"], json!([]));
    assert_eq!(text(&list), "");
}

#[tokio::test]
async fn slow_note_without_selection_fails_at_once() {
    let mut client = TestClient::helpdesk(slow(60_000));
    let result = client
        .call(Some("l"), "add_note_slow", json!({"text": "x"}))
        .await;
    assert_eq!(result["isError"], true);
    assert_eq!(text(&result), "no case selected: call open_case first");
}

#[tokio::test]
async fn lease_release_forgets_the_selection() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    client.initialize("2025-11-25").await;
    client
        .call(Some("a"), "open_case", json!({"title": "one"}))
        .await;
    client
        .call(Some("b"), "open_case", json!({"title": "two"}))
        .await;

    client
        .notify(
            "notifications/io.gatehouse/lease_released",
            json!({"lease": "a"}),
        )
        .await;
    let after = client
        .call(Some("a"), "add_note", json!({"text": "x"}))
        .await;
    assert_eq!(after["isError"], true);
    assert_eq!(text(&after), "no case selected: call open_case first");

    let other = client
        .call(Some("b"), "add_note", json!({"text": "y"}))
        .await;
    assert_eq!(text(&other), "note added to case-2");

    // A fresh open_case under the released lease id starts over.
    let reopened = client
        .call(Some("a"), "open_case", json!({"title": "three"}))
        .await;
    assert_eq!(reopened["structuredContent"]["case_id"], "case-3");
}

#[tokio::test]
async fn malformed_input_is_answered_and_the_server_keeps_going() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());

    client.send_raw("this is not json").await;
    let reply = client.recv().await;
    assert_eq!(reply["error"]["code"], -32700);
    assert_eq!(reply["id"], Value::Null);

    client
        .send_raw("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":")
        .await;
    assert_eq!(client.recv().await["error"]["code"], -32700);

    // Invalid UTF-8.
    {
        let writer = client.writer.as_mut().expect("open");
        writer
            .write_all(b"{\"a\":\"\xff\xfe\"}\n")
            .await
            .expect("write");
    }
    assert_eq!(client.recv().await["error"]["code"], -32700);

    for not_a_request in [
        "[]",
        "42",
        "{\"jsonrpc\":\"2.0\"}",
        "{\"id\":3,\"method\":\"ping\"}",
    ] {
        client.send_raw(not_a_request).await;
        let reply = client.recv().await;
        assert_eq!(reply["error"]["code"], -32600, "{not_a_request} → {reply}");
    }
    client
        .send_raw("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}")
        .await;
    let reply = client.recv().await;
    assert_eq!(reply["error"]["code"], -32600);
    assert_eq!(reply["id"], Value::Null);

    // Blank lines, unknown notifications and responses from the client get no answer.
    client.send_raw("").await;
    client.send_raw("   ").await;
    client.notify("notifications/whatever", json!({})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 99, "result": {}}))
        .await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 98, "error": {"code": 1, "message": "x"}}))
        .await;

    let reply = client.request("no/such/method", json!({})).await;
    assert_eq!(reply["error"]["code"], -32601);
    let reply = client.request("ping", json!({})).await;
    assert_eq!(reply["result"], json!({}));

    // String ids are echoed as they came.
    client
        .send_raw("{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"method\":\"ping\"}")
        .await;
    assert_eq!(client.recv().await["id"], "abc");

    client.close().await.expect("clean shutdown");
}

#[tokio::test]
async fn oversized_line_is_rejected_and_skipped() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    let huge = "x".repeat(9 * 1024 * 1024);
    let sender = {
        let mut writer = client.writer.take().expect("open");
        tokio::spawn(async move {
            writer.write_all(huge.as_bytes()).await.expect("write");
            writer.write_all(b"\n").await.expect("write");
            writer
        })
    };
    let reply = client.recv().await;
    assert_eq!(reply["error"]["code"], -32700);
    client.writer = Some(sender.await.expect("sender"));
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));
}

#[tokio::test]
async fn unknown_tool_and_bad_arguments() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    client.initialize("2025-11-25").await;

    let reply = client
        .request(
            "tools/call",
            json!({"name": "drop_tables", "arguments": {}}),
        )
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    assert_eq!(reply["error"]["message"], "Unknown tool: drop_tables");

    let reply = client.request("tools/call", json!({"arguments": {}})).await;
    assert_eq!(reply["error"]["code"], -32602);
    let reply = client
        .request(
            "tools/call",
            json!({"name": "list_notes", "arguments": [1]}),
        )
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    let reply = client
        .request(
            "tools/call",
            json!({"name": "list_notes", "_meta": {LEASE_KEY: 5}}),
        )
        .await;
    assert_eq!(reply["error"]["code"], -32602);

    let missing = client.call(Some("l"), "open_case", json!({})).await;
    assert_eq!(missing["isError"], true);
    assert!(text(&missing).contains("\"title\""), "{missing}");

    let wrong_type = client.call(Some("l"), "add_note", json!({"text": 5})).await;
    assert_eq!(wrong_type["isError"], true);
    assert!(text(&wrong_type).contains("\"text\""), "{wrong_type}");

    let extra = client
        .call(Some("l"), "open_case", json!({"title": "t", "priority": 1}))
        .await;
    assert_eq!(extra["isError"], true);
    assert!(text(&extra).contains("\"priority\""), "{extra}");

    // `arguments` may be omitted for a tool without parameters.
    let reply = client
        .request(
            "tools/call",
            json!({"name": "list_notes", "_meta": {LEASE_KEY: "l"}}),
        )
        .await;
    assert_eq!(reply["result"]["isError"], true);
}

#[tokio::test]
async fn echo_meta_hook_shows_what_was_forwarded() {
    let mut client = TestClient::helpdesk(HelpdeskOptions::default());
    let meta = json!({
        LEASE_KEY: "lease-7",
        "progressToken": "p-9",
        "io.gatehouse.test/echo_meta": true,
        "com.example/other": {"x": 1}
    });
    let reply = client
        .request(
            "tools/call",
            json!({"name": "open_case", "arguments": {"title": "t"}, "_meta": meta}),
        )
        .await;
    let result = &reply["result"];
    assert_eq!(result["_meta"]["io.gatehouse.test/seen_meta"], meta);
    assert_eq!(result["_meta"]["lease"], "lease-7");
    assert_eq!(result["structuredContent"]["lease"], "lease-7");

    // Without the flag the result carries no echo.
    let plain = client.call(Some("lease-7"), "list_notes", json!({})).await;
    assert!(plain["_meta"].get("io.gatehouse.test/seen_meta").is_none());
}

#[tokio::test]
async fn eof_ends_serve_even_with_slow_work_in_flight() {
    let mut client = TestClient::helpdesk(slow(3_600_000));
    client
        .call(Some("l"), "open_case", json!({"title": "t"}))
        .await;
    let slow_id = client
        .start_request(
            "tools/call",
            json!({"name": "add_note_slow", "arguments": {"text": "x"}, "_meta": {LEASE_KEY: "l"}}),
        )
        .await;
    let ping_id = client.start_request("ping", json!({})).await;
    client.close().await.expect("clean shutdown");
    // The ping is still answered; the abandoned slow call is not; then output ends.
    let reply = client.recv().await;
    assert_eq!(reply["id"], ping_id);
    assert_ne!(reply["id"], slow_id);
    let end = client.lines.next_line().await.expect("read");
    assert!(end.is_none(), "unexpected output: {end:?}");
}

#[tokio::test]
async fn echo_server_answers_pipelined_requests_in_order() {
    let mut client = TestClient::echo();
    let init = client.initialize("2025-03-26").await;
    assert_eq!(init["protocolVersion"], "2025-03-26");
    assert_eq!(init["serverInfo"]["name"], "gatehouse-echo");

    let tools = client.request("tools/list", json!({})).await;
    assert_eq!(tools["result"]["tools"][0]["name"], "echo");

    let mut batch = String::new();
    for i in 0..200 {
        batch.push_str(
            &json!({
                "jsonrpc": "2.0",
                "id": 1000 + i,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": format!("m{i}")}}
            })
            .to_string(),
        );
        batch.push('\n');
    }
    client.send_raw(batch.trim_end()).await;
    for i in 0..200 {
        let reply = client.recv().await;
        assert_eq!(reply["id"], 1000 + i);
        assert_eq!(text(&reply["result"]), format!("m{i}"));
    }

    let reply = client
        .request("tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(reply["error"]["code"], -32602);
    let reply = client
        .request("tools/call", json!({"name": "echo", "arguments": {}}))
        .await;
    assert_eq!(reply["result"]["isError"], true);
    client.send_raw("garbage").await;
    assert_eq!(client.recv().await["error"]["code"], -32700);
    assert_eq!(client.request("ping", json!({})).await["result"], json!({}));

    client.close().await.expect("clean shutdown");
}
