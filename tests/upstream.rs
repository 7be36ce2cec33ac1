//! Tests for the upstream connection layer against a Python stdio mock server and axum Streamable HTTP mock servers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::post;
use axum::Router;
use gatehouse::testing::upstream::{
    event_channel, ConnectOptions, Connection, EventReceiver, IdCounter, NotificationsRefused,
    RequestOptions, RequestTag, Transport, UpstreamError, UpstreamEvent,
};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

fn fixture_path() -> String {
    format!(
        "{}/tests/fixtures/mock_stdio_server.py",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "upstream_scratch=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A connected stdio upstream plus the receiving end of its events.
struct TestUpstream {
    conn: Connection,
    events: EventReceiver,
}

impl TestUpstream {
    /// `python3 mock_stdio_server.py <flags>`.
    async fn stdio(flags: &[&str]) -> Self {
        let mut args = vec![fixture_path()];
        args.extend(flags.iter().map(|f| f.to_string()));
        Self::with_transport(stdio_transport("python3", args), |_| {}).await
    }

    /// `sh -c 'sleep 1000 & exec python3 mock_stdio_server.py <flags>'`: a launcher that leaves a
    /// grandchild behind (holding stdout open).
    async fn stdio_with_grandchild(flags: &str, tweak: impl FnOnce(&mut ConnectOptions)) -> Self {
        let script = format!("sleep 1000 & exec python3 {} {flags}", fixture_path());
        Self::with_transport(stdio_transport("sh", vec!["-c".into(), script]), tweak).await
    }

    async fn with_transport(transport: Transport, tweak: impl FnOnce(&mut ConnectOptions)) -> Self {
        init_tracing();
        let mut opts = ConnectOptions::new("mock", transport);
        opts.epoch = 7;
        opts.request_timeout = Duration::from_secs(10);
        tweak(&mut opts);
        let (tx, events) = event_channel("mock", NotificationsRefused::default());
        let conn = Connection::connect(opts, tx).await.expect("connect");
        Self { conn, events }
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(self.conn.pid().expect("stdio pid") as i32)
    }

    /// Waits for the next event matching `pred`, skipping others.
    async fn next_event(&mut self, pred: impl Fn(&UpstreamEvent) -> bool) -> UpstreamEvent {
        timeout(Duration::from_secs(5), async {
            loop {
                let event = self.events.recv().await.expect("event channel open");
                if pred(&event) {
                    return event;
                }
            }
        })
        .await
        .expect("expected event did not arrive")
    }

    /// The `notifications/message` the mock sends for each `notifications/cancelled` it receives.
    async fn next_cancelled_report(&mut self) -> Value {
        let event = self
            .next_event(|e| {
                matches!(e, UpstreamEvent::Notification { method, params, .. }
                if method == "notifications/message"
                    && params.as_ref().and_then(|p| p.pointer("/data/cancelled")).is_some())
            })
            .await;
        match event {
            UpstreamEvent::Notification {
                params: Some(params),
                ..
            } => params["data"].clone(),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn stdio_transport(command: &str, args: Vec<String>) -> Transport {
    Transport::Stdio {
        command: command.into(),
        args,
        env: BTreeMap::new(),
        cwd: None,
    }
}

fn call(name: &str, arguments: Value) -> Value {
    json!({ "name": name, "arguments": arguments })
}

/// Polls until no process of the group is left (zombies awaiting init included), up to 10 s.
async fn assert_group_gone(pgid: Pid) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match killpg(pgid, None) {
            Err(Errno::ESRCH) => return,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "process group {pgid} still exists: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// stdio
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn initialize_and_list_tools_follows_cursors() {
    let mut up = TestUpstream::stdio(&["--lease"]).await;
    let init = up.conn.initialize_result();
    assert_eq!(init["serverInfo"]["name"], "mock-stdio");
    assert_eq!(up.conn.protocol_version(), Some("2025-06-18"));
    assert!(up.conn.supports_lease());
    assert_eq!(up.conn.epoch(), 7);
    assert_eq!(up.conn.upstream_id(), "mock");
    assert!(up.conn.pid().is_some());

    let tools = up.conn.list_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(up.conn.in_flight(), 0);

    up.conn.close().await;
    assert!(up.conn.is_closed());
    assert!(matches!(
        up.next_event(|e| matches!(e, UpstreamEvent::Closed { .. }))
            .await,
        UpstreamEvent::Closed { epoch: 7, .. }
    ));
    assert_group_gone(up.pgid()).await;
}

#[tokio::test]
async fn lease_absent_without_capability() {
    let up = TestUpstream::stdio(&[]).await;
    assert!(!up.conn.supports_lease());
    up.conn.close().await;
}

#[tokio::test]
async fn ids_continue_across_epochs_from_a_shared_counter() {
    let ids = IdCounter::starting_at(100);
    let first = {
        let ids = ids.clone();
        TestUpstream::with_transport(stdio_transport("python3", vec![fixture_path()]), |o| {
            o.ids = ids
        })
        .await
    };
    let r1 = first
        .conn
        .request(
            "tools/call",
            call("echo", json!({})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    first.conn.close().await;
    let second = {
        let ids = ids.clone();
        TestUpstream::with_transport(stdio_transport("python3", vec![fixture_path()]), |o| {
            o.ids = ids;
            o.epoch = 8;
        })
        .await
    };
    let r2 = second
        .conn
        .request(
            "tools/call",
            call("echo", json!({})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    // 100 = initialize, 101 = echo; the second epoch starts after them.
    assert_eq!(r1.upstream_id, 101);
    assert_eq!(r2.upstream_id, 103);
    assert_eq!(r2.epoch, 8);
    second.conn.close().await;
}

#[tokio::test]
async fn concurrent_requests_get_distinct_ids_and_their_own_responses() {
    let up = TestUpstream::stdio(&[]).await;
    let (started_a, id_a) = oneshot::channel();
    let (started_b, id_b) = oneshot::channel();
    let slow = up.conn.request(
        "tools/call",
        call("delay", json!({"ms": 400, "tag": "A"})),
        RequestOptions {
            started: Some(started_a),
            ..Default::default()
        },
    );
    let fast = up.conn.request(
        "tools/call",
        call("delay", json!({"ms": 10, "tag": "B"})),
        RequestOptions {
            started: Some(started_b),
            ..Default::default()
        },
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let (a, b) = tokio::join!(
        async {
            let r = slow.await.unwrap();
            order.lock().unwrap().push("A");
            r
        },
        async {
            let r = fast.await.unwrap();
            order.lock().unwrap().push("B");
            r
        }
    );
    let (id_a, id_b) = (id_a.await.unwrap(), id_b.await.unwrap());
    assert_ne!(id_a, id_b);
    assert_eq!(*order.lock().unwrap(), ["B", "A"], "answered out of order");
    assert_eq!(a.upstream_id, id_a);
    assert_eq!(b.upstream_id, id_b);
    let (a, b) = (a.outcome.unwrap(), b.outcome.unwrap());
    assert_eq!(
        (a["tag"].as_str(), a["id_seen"].as_u64()),
        (Some("A"), Some(id_a))
    );
    assert_eq!(
        (b["tag"].as_str(), b["id_seen"].as_u64()),
        (Some("B"), Some(id_b))
    );
    up.conn.close().await;
}

#[tokio::test]
async fn progress_tokens_are_rewritten_and_restored() {
    let mut up = TestUpstream::stdio(&[]).await;
    let (progress_tx, mut progress_rx) = mpsc::channel(16);
    let mut params = call("progress", json!({}));
    params["_meta"] = json!({ "progressToken": "client-token-1", "other": "kept" });
    let response = up
        .conn
        .request(
            "tools/call",
            params,
            RequestOptions {
                progress: Some(progress_tx),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let seen = response.outcome.unwrap()["token_seen"].clone();
    assert_ne!(
        seen,
        json!("client-token-1"),
        "upstream saw a rewritten token"
    );
    assert!(seen.as_str().unwrap().starts_with("gatehouse-7-"));

    let mut delivered = Vec::new();
    while let Ok(Some(p)) = timeout(Duration::from_millis(300), progress_rx.recv()).await {
        delivered.push(p);
    }
    // Two before the response; the one sent after the response is not delivered.
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    for (i, p) in delivered.iter().enumerate() {
        assert_eq!(p["progressToken"], "client-token-1");
        assert_eq!(p["progress"], json!(i + 1));
    }

    // Without a per-request channel, progress arrives as an event with the original token.
    let mut params = call("progress", json!({}));
    params["_meta"] = json!({ "progressToken": 42 });
    let response = up
        .conn
        .request("tools/call", params, RequestOptions::default())
        .await
        .unwrap();
    // (The late progress of the first call is an event too, for the task table: skipped.)
    let second = response.upstream_id;
    match up
        .next_event(|e| {
            matches!(e, UpstreamEvent::Progress { upstream_request_id, .. } if *upstream_request_id == second)
        })
        .await
    {
        UpstreamEvent::Progress {
            epoch,
            upstream_request_id,
            params,
        } => {
            assert_eq!(epoch, 7);
            assert_eq!(upstream_request_id, response.upstream_id);
            assert_eq!(params["progressToken"], 42);
        }
        other => panic!("unexpected {other:?}"),
    }
    up.conn.close().await;
}

#[tokio::test]
async fn cancel_sends_notification_and_drops_late_response() {
    let mut up = TestUpstream::stdio(&[]).await;
    let cancel = CancellationToken::new();
    let (started, id) = oneshot::channel();
    let call_fut = up.conn.request(
        "tools/call",
        call("late", json!({"ms": 300})),
        RequestOptions {
            cancel: cancel.clone(),
            started: Some(started),
            ..Default::default()
        },
    );
    let canceller = async {
        let id = id.await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
        id
    };
    let (result, id) = tokio::join!(call_fut, canceller);
    assert!(
        matches!(result, Err(UpstreamError::Cancelled)),
        "{result:?}"
    );
    assert_eq!(up.conn.in_flight(), 0);

    let report = up.next_cancelled_report().await;
    assert_eq!(report["cancelled"], json!(id));

    // Let the late response arrive; it is dropped and the connection keeps working.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = up
        .conn
        .request(
            "tools/call",
            call("echo", json!({"x": 1})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(next.outcome.unwrap()["params"]["arguments"]["x"], 1);
    assert!(!up.conn.is_closed());
    up.conn.close().await;
}

#[tokio::test]
async fn timeout_sends_cancelled_and_fails() {
    let mut up = TestUpstream::stdio(&[]).await;
    let (started, id) = oneshot::channel();
    let result = up
        .conn
        .request(
            "tools/call",
            call("hang", json!({})),
            RequestOptions {
                timeout: Some(Duration::from_millis(200)),
                started: Some(started),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(result, Err(UpstreamError::Timeout(_))),
        "{result:?}"
    );
    let report = up.next_cancelled_report().await;
    assert_eq!(report["cancelled"], json!(id.await.unwrap()));
    assert_eq!(report["reason"], "request timed out");
    assert_eq!(up.conn.in_flight(), 0);
    up.conn.close().await;
}

#[tokio::test]
async fn dropped_request_future_cancels_upstream() {
    let mut up = TestUpstream::stdio(&[]).await;
    let (started, id) = oneshot::channel();
    let fut = up.conn.request(
        "tools/call",
        call("hang", json!({})),
        RequestOptions {
            started: Some(started),
            ..Default::default()
        },
    );
    // Poll it for a moment, then drop it.
    let _ = timeout(Duration::from_millis(100), fut).await;
    assert_eq!(up.conn.in_flight(), 0);
    let report = up.next_cancelled_report().await;
    assert_eq!(report["cancelled"], json!(id.await.unwrap()));
    up.conn.close().await;
}

#[tokio::test]
async fn killed_child_fails_pending_at_once_and_emits_closed() {
    // The grandchild keeps stdout open, so only the exit watcher can notice.
    let mut up = TestUpstream::stdio_with_grandchild("", |_| {}).await;
    let pid = up.pgid();
    let conn = up.conn.clone();
    let pending = tokio::spawn(async move {
        conn.request(
            "tools/call",
            call("hang", json!({})),
            RequestOptions::default(),
        )
        .await
    });
    while up.conn.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = Instant::now();
    kill(pid, Signal::SIGKILL).unwrap();
    let result = timeout(Duration::from_secs(2), pending)
        .await
        .expect("pending request must not hang")
        .unwrap();
    assert!(
        matches!(result, Err(UpstreamError::Closed(_))),
        "{result:?}"
    );
    assert!(killed_at.elapsed() < Duration::from_secs(1));
    match up
        .next_event(|e| matches!(e, UpstreamEvent::Closed { .. }))
        .await
    {
        UpstreamEvent::Closed { epoch, reason } => {
            assert_eq!(epoch, 7);
            assert!(reason.contains("exited"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(up.conn.is_closed());
    let after = up
        .conn
        .request(
            "tools/call",
            call("echo", json!({})),
            RequestOptions::default(),
        )
        .await;
    assert!(matches!(after, Err(UpstreamError::Closed(_))));
    // The grandchild is still in the group until close() reaps the group.
    up.conn.close().await;
    assert_group_gone(pid).await;
}

#[tokio::test]
async fn garbage_lines_are_skipped() {
    let up = TestUpstream::stdio(&[]).await;
    let response = up
        .conn
        .request(
            "tools/call",
            call("garbage", json!({})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(response.outcome.unwrap()["survived"], true);
    assert!(!up.conn.is_closed());
    let tools = up.conn.list_tools().await.unwrap();
    assert_eq!(tools.len(), 4);
    up.conn.close().await;
}

#[tokio::test]
async fn upstream_errors_are_outcomes_not_failures() {
    let up = TestUpstream::stdio(&[]).await;
    let response = up
        .conn
        .request(
            "tools/call",
            call("nope", json!({})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(response.outcome.unwrap_err()["code"], -32602);
    up.conn.close().await;
}

#[tokio::test]
async fn server_requests_are_routed_and_ping_is_answered() {
    let mut up = TestUpstream::stdio(&[]).await;
    let conn = up.conn.clone();
    let (started, id) = oneshot::channel();
    let call_task = tokio::spawn(async move {
        conn.request(
            "tools/call",
            call("sample", json!({})),
            RequestOptions {
                started: Some(started),
                // Made for a client: only such requests count for the stdio attribution.
                tag: Some(RequestTag(std::sync::Arc::new("the caller"))),
                ..Default::default()
            },
        )
        .await
    });
    let id = id.await.unwrap();
    let (request_id, related) = match up
        .next_event(|e| matches!(e, UpstreamEvent::Request { .. }))
        .await
    {
        UpstreamEvent::Request {
            epoch,
            id,
            method,
            related_request,
            ..
        } => {
            assert_eq!(epoch, 7);
            assert_eq!(method, "sampling/createMessage");
            (id, related_request)
        }
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(related, Some(id), "exactly one pending request");
    up.conn
        .respond(
            request_id,
            Ok(json!({"role": "assistant", "content": {"type": "text", "text": "hi"}})),
        )
        .await
        .unwrap();
    let result = call_task.await.unwrap().unwrap().outcome.unwrap();
    assert_eq!(result["pong"]["result"], json!({}));
    assert_eq!(result["answer"]["id"], "srv-sample-1");
    assert_eq!(result["answer"]["result"]["content"]["text"], "hi");
    up.conn.close().await;
}

#[tokio::test]
async fn close_leaves_no_process_in_the_group() {
    let up = TestUpstream::stdio_with_grandchild("", |_| {}).await;
    let pgid = up.pgid();
    assert!(killpg(pgid, None).is_ok());
    up.conn.close().await;
    up.conn.close().await; // idempotent
    assert_group_gone(pgid).await;
}

#[tokio::test]
async fn close_escalates_to_sigkill_for_stubborn_servers() {
    let up = TestUpstream::stdio_with_grandchild("--stubborn", |o| {
        o.shutdown_grace = Duration::from_millis(200);
    })
    .await;
    let pgid = up.pgid();
    let started = Instant::now();
    up.conn.close().await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_group_gone(pgid).await;
}

#[tokio::test]
async fn dropping_the_last_handle_kills_the_group() {
    let up = TestUpstream::stdio_with_grandchild("", |_| {}).await;
    let pgid = up.pgid();
    let clone = up.conn.clone();
    drop(up);
    assert!(killpg(pgid, None).is_ok(), "a clone still holds it");
    drop(clone);
    assert_group_gone(pgid).await;
}

#[tokio::test]
async fn spawn_failure_is_an_error() {
    init_tracing();
    let opts = ConnectOptions::new(
        "missing",
        stdio_transport("/nonexistent/definitely-not-here", vec![]),
    );
    let (tx, _rx) = event_channel("missing", NotificationsRefused::default());
    let err = Connection::connect(opts, tx).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Spawn(_)), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// Streamable HTTP
// ---------------------------------------------------------------------------------------------

const SESSION: &str = "sess-0123456789";

#[derive(Debug, Clone)]
struct SeenPost {
    body: Value,
    session: Option<String>,
    version: Option<String>,
    api_key: Option<String>,
    accept: Option<String>,
}

#[derive(Default)]
struct HttpState {
    sse: bool,
    posts: Mutex<Vec<SeenPost>>,
    deleted: Mutex<Vec<Option<String>>>,
}

/// A Streamable HTTP MCP server on 127.0.0.1:0, stopped on drop.
struct HttpUpstream {
    url: String,
    state: Arc<HttpState>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.server.abort();
    }
}

impl HttpUpstream {
    async fn start(sse: bool) -> Self {
        init_tracing();
        let state = Arc::new(HttpState {
            sse,
            ..Default::default()
        });
        let app = Router::new()
            .route("/mcp", post(http_post).delete(http_delete))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        });
        Self {
            url: format!("http://{addr}/mcp"),
            state,
            shutdown,
            server,
        }
    }

    /// Stops the server and waits until every connection is closed.
    async fn stop(&mut self) {
        self.shutdown.cancel();
        let _ = (&mut self.server).await;
    }

    async fn connect(&self) -> TestUpstream {
        let transport = Transport::Http {
            url: self.url.clone(),
            headers: BTreeMap::from([("X-Api-Key".to_owned(), "upstream-secret".to_owned())]),
            tls: Default::default(),
        };
        TestUpstream::with_transport(transport, |_| {}).await
    }

    fn posts(&self) -> Vec<SeenPost> {
        self.state.posts.lock().unwrap().clone()
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn json_response(body: Value) -> HttpResponse {
    ([("content-type", "application/json")], body.to_string()).into_response()
}

async fn http_post(
    State(state): State<Arc<HttpState>>,
    headers: HeaderMap,
    body: Bytes,
) -> HttpResponse {
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(msg) => msg,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    state.posts.lock().unwrap().push(SeenPost {
        body: msg.clone(),
        session: header(&headers, "mcp-session-id"),
        version: header(&headers, "mcp-protocol-version"),
        api_key: header(&headers, "x-api-key"),
        accept: header(&headers, "accept"),
    });
    let method = msg["method"].as_str().unwrap_or("");
    let id = msg["id"].clone();
    if method == "initialize" {
        let result = json!({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "mock-http", "version": "0"},
        }});
        let mut response = json_response(result);
        response
            .headers_mut()
            .insert("mcp-session-id", SESSION.parse().unwrap());
        return response;
    }
    if header(&headers, "mcp-session-id").as_deref() != Some(SESSION) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    if id.is_null() || msg.get("method").is_none() {
        return StatusCode::ACCEPTED.into_response(); // notification or response
    }
    let result = match method {
        "tools/list" => match msg["params"]["cursor"].as_str() {
            None => json!({"tools": [{"name": "h1"}], "nextCursor": "2"}),
            Some(_) => json!({"tools": [{"name": "h2"}]}),
        },
        _ => json!({"echo": msg["params"]}),
    };
    let response = json!({"jsonrpc": "2.0", "id": id, "result": result});
    if !state.sse {
        return json_response(response);
    }
    let token = msg["params"]["_meta"]["progressToken"].clone();
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": token, "progress": 1, "total": 1}});
    let ping = json!({"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"});
    let roots = json!({"jsonrpc": "2.0", "id": "srv-roots", "method": "roots/list"});
    // Priming event, a comment, then messages split awkwardly across chunks.
    let text = format!(
        "id: 0\ndata:\n\n: keep-alive\n\nevent: message\ndata: {progress}\n\ndata: {ping}\n\ndata: {roots}\n\ndata: {response}\n\n"
    );
    let bytes = text.into_bytes();
    let chunks: Vec<Result<Bytes, std::convert::Infallible>> = bytes
        .chunks(37)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    HttpResponse::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap()
}

async fn http_delete(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> StatusCode {
    state
        .deleted
        .lock()
        .unwrap()
        .push(header(&headers, "mcp-session-id"));
    StatusCode::OK
}

#[tokio::test]
async fn http_json_session_headers_and_delete() {
    let server = HttpUpstream::start(false).await;
    let up = server.connect().await;
    assert_eq!(
        up.conn.initialize_result()["serverInfo"]["name"],
        "mock-http"
    );
    assert_eq!(up.conn.pid(), None);
    let tools = up.conn.list_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["h1", "h2"]);
    up.conn.close().await;

    let posts = server.posts();
    let methods: Vec<_> = posts
        .iter()
        .map(|p| p.body["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/list"
        ]
    );
    for (i, post) in posts.iter().enumerate() {
        assert_eq!(post.api_key.as_deref(), Some("upstream-secret"));
        assert_eq!(
            post.accept.as_deref(),
            Some("application/json, text/event-stream")
        );
        if i == 0 {
            assert_eq!(post.session, None);
            assert_eq!(post.version, None);
        } else {
            assert_eq!(post.session.as_deref(), Some(SESSION));
            assert_eq!(post.version.as_deref(), Some("2025-06-18"));
        }
    }
    assert_eq!(
        *server.state.deleted.lock().unwrap(),
        [Some(SESSION.to_owned())]
    );
}

#[tokio::test]
async fn http_sse_progress_server_requests_then_result() {
    let server = HttpUpstream::start(true).await;
    let mut up = server.connect().await;
    let (progress_tx, mut progress_rx) = mpsc::channel(8);
    let mut params = call("anything", json!({"k": "v"}));
    params["_meta"] = json!({"progressToken": "dl-1"});
    let response = up
        .conn
        .request(
            "tools/call",
            params,
            RequestOptions {
                progress: Some(progress_tx),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let result = response.outcome.unwrap();
    assert_eq!(result["echo"]["arguments"]["k"], "v");
    let upstream_token = result["echo"]["_meta"]["progressToken"].as_str().unwrap();
    assert!(upstream_token.starts_with("gatehouse-7-"));

    let progress = progress_rx.recv().await.unwrap();
    assert_eq!(progress["progressToken"], "dl-1");
    assert_eq!(progress["progress"], 1);

    // roots/list arrived on this request's stream: structurally related.
    match up
        .next_event(|e| matches!(e, UpstreamEvent::Request { .. }))
        .await
    {
        UpstreamEvent::Request {
            method,
            related_request,
            id,
            ..
        } => {
            assert_eq!(method, "roots/list");
            assert_eq!(id, "srv-roots");
            assert_eq!(related_request, Some(response.upstream_id));
        }
        other => panic!("unexpected {other:?}"),
    }
    // The server's ping was answered with a POSTed `{}` result.
    let pong = server
        .posts()
        .into_iter()
        .find(|p| p.body["id"] == "srv-ping")
        .expect("ping answered");
    assert_eq!(pong.body["result"], json!({}));
    up.conn.close().await;
}

#[tokio::test]
async fn http_transport_failure_closes_the_connection() {
    let mut server = HttpUpstream::start(false).await;
    let mut up = server.connect().await;
    server.stop().await;
    let result = up
        .conn
        .request("tools/list", json!({}), RequestOptions::default())
        .await;
    assert!(
        matches!(result, Err(UpstreamError::Closed(_))),
        "{result:?}"
    );
    assert!(up.conn.is_closed());
    up.next_event(|e| matches!(e, UpstreamEvent::Closed { .. }))
        .await;
    up.conn.close().await;
}
