//! MCP Apps (`io.modelcontextprotocol/ui`) through a registration (issue 52 item 1,
//! docs/apps.md), with the SDK's real example app servers from npm (tests/peers):
//! `server-basic-vanillajs`, `server-map` and `server-pdf`, each a stdio child.
//!
//! - the extension is advertised to a registration granted a tool with a view, not to others;
//! - a granted tool's `_meta` (`ui.resourceUri`, `ui.visibility`, the flat `ui/resourceUri`)
//!   is listed as the upstream wrote it;
//! - a granted tool's `ui://` view is listed and read (its mimeType and `_meta` untouched) on
//!   that registration; another registration's read answers -32602 and its list omits it;
//! - a call to an app-only tool is governed and audited like any call, with `initiator: "app"`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

const UI: &str = "io.modelcontextprotocol/ui";
const MIME: &str = "text/html;profile=mcp-app";
const TIME_VIEW: &str = "ui://get-time/mcp-app.html";
const MAP_VIEW: &str = "ui://cesium-map/mcp-app.html";
const PDF_VIEW: &str = "ui://pdf-viewer/mcp-app.html";

/// An example app server of `@modelcontextprotocol/<package>` over stdio, one process per
/// registration; `args` after `--stdio`.
fn app_server(id: &str, package: &str, args: &[&str]) -> UpstreamConfig {
    let script = repo_root().join(format!(
        "tests/peers/node_modules/@modelcontextprotocol/{package}/dist/index.js"
    ));
    assert!(
        script.exists(),
        "run tests/peers/setup.sh first ({} missing)",
        script.display()
    );
    let mut argv = vec![script.display().to_string(), "--stdio".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    toml::from_str(&format!(
        "id = {id:?}\ncommand = \"node\"\nargs = {argv:?}\nsharing = \"per_registration\"\ncall_timeout_s = 60\n"
    ))
    .unwrap()
}

/// A one-page PDF (valid enough for a reader: header, catalog, pages, page, xref, trailer).
fn tiny_pdf(path: &std::path::Path) {
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>",
    ];
    let mut out = String::from("%PDF-1.4\n");
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.push_str(&format!("{} 0 obj\n{o}\nendobj\n", i + 1));
    }
    let xref = out.len();
    out.push_str(&format!(
        "xref\n0 {}\n0000000000 65535 f \n",
        objects.len() + 1
    ));
    for o in offsets {
        out.push_str(&format!("{o:010} 00000 n \n"));
    }
    out.push_str(&format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    ));
    std::fs::write(path, out).unwrap();
}

fn tool<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

fn uris(list: &Value) -> Vec<String> {
    list["result"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources: {list}"))
        .iter()
        .filter_map(|r| r["uri"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn apps_views_and_app_calls_through_a_registration() {
    let dir = tempfile::tempdir().unwrap();
    let pdf = dir.path().join("tiny.pdf");
    tiny_pdf(&pdf);
    let pdf_arg = pdf.display().to_string();
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![
            app_server("basic", "server-basic-vanillajs", &[]),
            app_server("map", "server-map", &[]),
            app_server("pdf", "server-pdf", &[&pdf_arg]),
        ]
    });
    let a = tg
        .gateway
        .register(
            RegistrationSpec::new("app-agent")
                .grant("basic.*")
                .grant("map.show-map")
                .grant("pdf.read_pdf_bytes")
                .grant("pdf.display_pdf"),
        )
        .await
        .unwrap();
    // B holds a grant on map, but not on the tool whose view is the map; nothing of basic.
    let b = tg
        .gateway
        .register(RegistrationSpec::new("plain-agent").grant("map.geocode"))
        .await
        .unwrap();

    // A host's session: it declares the extension, and is told it is there.
    let mut host = SseClient::connect(&a.sse_url(), a.token()).await;
    let init = host
        .initialize_with(json!({"extensions": {UI: {"mimeTypes": [MIME]}}}))
        .await;
    let ext = &init["result"]["capabilities"]["extensions"][UI];
    assert_eq!(ext["mimeTypes"], json!([MIME]), "{init}");

    // Tools keep their `_meta` as the example servers wrote it (nested and flat keys).
    let list = host.request("tools/list", json!({})).await;
    assert_eq!(
        tool(&list, "basic.get-time")["_meta"],
        json!({"ui": {"resourceUri": TIME_VIEW}, "ui/resourceUri": TIME_VIEW}),
        "{list}"
    );
    assert_eq!(
        tool(&list, "map.show-map")["_meta"]["ui"]["resourceUri"],
        MAP_VIEW
    );
    // The app-only tool is listed (the host hides it from the model, not the gateway).
    assert_eq!(
        tool(&list, "pdf.read_pdf_bytes")["_meta"],
        json!({"ui": {"visibility": ["app"]}}),
        "{list}"
    );

    // A's views: listed, and read with their type and `_meta` untouched.
    let listed = host.request("resources/list", json!({})).await;
    let listed = uris(&listed);
    for v in [TIME_VIEW, MAP_VIEW, PDF_VIEW] {
        assert!(listed.iter().any(|u| u == v), "{v} not listed: {listed:?}");
    }
    let read = host
        .request("resources/read", json!({"uri": TIME_VIEW}))
        .await;
    let c = &read["result"]["contents"][0];
    assert_eq!(c["mimeType"], MIME, "{read}");
    assert!(c["text"].as_str().unwrap().contains("<html"), "{read}");
    let read = host
        .request("resources/read", json!({"uri": MAP_VIEW}))
        .await;
    let c = &read["result"]["contents"][0];
    assert_eq!(c["mimeType"], MIME);
    assert_eq!(
        c["_meta"]["ui"]["csp"]["connectDomains"][0], "https://*.openstreetmap.org",
        "the view's _meta (its CSP) is passed as written"
    );

    // B: the same views are unknown, listed or read, whichever transport.
    let mut other = SseClient::connect(&b.sse_url(), b.token()).await;
    let init = other
        .initialize_with(json!({"extensions": {UI: {"mimeTypes": [MIME]}}}))
        .await;
    assert!(
        init["result"]["capabilities"]["extensions"][UI].is_null(),
        "B has no tool with a view: {init}"
    );
    let listed = other.request("resources/list", json!({})).await;
    assert!(
        !uris(&listed).iter().any(|u| u.starts_with("ui://")),
        "{listed}"
    );
    for (i, v) in [TIME_VIEW, MAP_VIEW, PDF_VIEW, "ui://nothing/here.html"]
        .iter()
        .enumerate()
    {
        let r = other.request("resources/read", json!({"uri": v})).await;
        assert_eq!(r["error"]["code"], -32602, "{v}: {r}");
        let r = stateless(
            &b.mcp_url(),
            b.token(),
            i as u64,
            "resources/read",
            json!({"uri": v}),
        )
        .await;
        assert_eq!(r["error"]["code"], -32602, "{v} (2026-07-28): {r}");
    }
    // A, statelessly (2026-07-28): discovered, and the view read.
    let d = stateless(&a.mcp_url(), a.token(), 1, "server/discover", json!({})).await;
    assert_eq!(
        d["result"]["capabilities"]["extensions"][UI]["mimeTypes"],
        json!([MIME]),
        "{d}"
    );
    let r = stateless(
        &a.mcp_url(),
        a.token(),
        2,
        "resources/read",
        json!({"uri": PDF_VIEW}),
    )
    .await;
    assert_eq!(r["result"]["contents"][0]["mimeType"], MIME, "{r}");

    // The view's own call (an app-only tool) and the model's call (a tool it sees).
    let r = host
        .call(
            "pdf.read_pdf_bytes",
            json!({"url": pdf_arg, "offset": 0, "byteCount": 64}),
        )
        .await;
    assert_ne!(r["result"]["isError"], true, "{r}");
    let bytes = r["result"]["structuredContent"]["bytes"].as_str().unwrap();
    assert!(bytes.starts_with("JVBERi0"), "the PDF's first bytes: {r}");
    let r = host.call("basic.get-time", json!({})).await;
    assert!(r["result"]["structuredContent"]["time"].is_string(), "{r}");
    // B cannot make A's app call: not granted, refused and audited as such.
    let r = other
        .call("pdf.read_pdf_bytes", json!({"url": pdf_arg}))
        .await;
    assert!(
        r.get("error").is_some() || r["result"]["isError"] == true,
        "{r}"
    );

    let calls = tg.calls();
    let app_call = calls
        .iter()
        .find(|c| {
            c.tool.as_deref() == Some("pdf.read_pdf_bytes")
                && c.agent_id.as_deref() == Some("app-agent")
        })
        .expect("the app's call is audited");
    assert_eq!(app_call.outcome.as_deref(), Some("ok"));
    assert_eq!(app_call.registration_id.as_deref(), Some(a.id()));
    assert_eq!(app_call.rare().initiator.as_deref(), Some("app"));
    assert!(app_call.args_digest.is_some());
    let model_call = calls
        .iter()
        .find(|c| c.tool.as_deref() == Some("basic.get-time"))
        .unwrap();
    assert_eq!(model_call.outcome.as_deref(), Some("ok"));
    assert_eq!(
        model_call.rare().initiator,
        None,
        "a model's call has no initiator"
    );
    let refused = calls
        .iter()
        .find(|c| c.agent_id.as_deref() == Some("plain-agent"))
        .expect("B's refused call is audited");
    assert_eq!(refused.outcome.as_deref(), Some("denied"), "{refused:?}");
}

/// The ext-apps SDK's host side, headless in Node (tests/peers/apps_host.mjs): its `AppBridge`
/// over the official TypeScript client 2.x (Streamable HTTP) sees the extension, reads the
/// view, and forwards its `App`'s call to an app-only tool, audited as the app's.
#[tokio::test]
async fn the_ext_apps_host_bridge_reads_a_view_and_forwards_the_apps_call() {
    let dir = tempfile::tempdir().unwrap();
    let pdf = dir.path().join("tiny.pdf");
    tiny_pdf(&pdf);
    let pdf_arg = pdf.display().to_string();
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![
            app_server("basic", "server-basic-vanillajs", &[]),
            app_server("pdf", "server-pdf", &[&pdf_arg]),
        ]
    });
    let a = tg
        .gateway
        .register(
            RegistrationSpec::new("bridged")
                .grant("basic.get-time")
                .grant("pdf.read_pdf_bytes"),
        )
        .await
        .unwrap();
    let host = repo_root().join("tests/peers/apps_host.mjs");
    let args = json!({"url": pdf_arg, "offset": 0, "byteCount": 32}).to_string();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new("node")
            .arg(&host)
            .args([&a.mcp_url(), a.token(), "pdf.read_pdf_bytes", &args])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the host finishes")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "apps_host.mjs failed: {stderr}");
    let line = String::from_utf8_lossy(&out.stdout);
    let r: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(r["extensions"][UI]["mimeTypes"], json!([MIME]), "{r}");
    assert_eq!(
        r["views"],
        json!([{"name": "basic.get-time", "uri": TIME_VIEW}]),
        "{r}"
    );
    assert_eq!(r["read"]["mimeType"], MIME, "{r}");
    assert!(r["read"]["length"].as_u64().unwrap() > 1000, "{r}");
    assert_eq!(r["call"]["isError"], false, "{r}");
    assert_eq!(r["call"]["structuredContent"]["offset"], 0, "{r}");

    let calls = tg.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let c = &calls[0];
    assert_eq!(c.tool.as_deref(), Some("pdf.read_pdf_bytes"));
    assert_eq!(c.agent_id.as_deref(), Some("bridged"));
    assert_eq!(c.transport.as_deref(), Some("streamable_http"), "{c:?}");
    assert_eq!(c.outcome.as_deref(), Some("ok"));
    assert_eq!(c.rare().initiator.as_deref(), Some("app"));
}
