"""MCP Apps in a real browser (issue 52 item 1, docs/apps.md): Debian's chromium, driven by
Playwright (its own browser download unused), renders the view of the SDK's example app server
`@modelcontextprotocol/server-basic-vanillajs` (tests/peers, a stdio upstream of the shipped
binary) fetched through a registration, and the view's own button makes the app-initiated
`get-time` call, which lands in the audit log attributed to the registration's agent.

The host is this test: a page (served by Playwright's router at http://host.test/) that lists
the registration's tools, reads the tool's `ui://` view, renders it in a sandboxed iframe and
speaks the view's side of the extension over postMessage (`ui/initialize`, `tools/call`); its
`/rpc` is answered here by stateless 2026-07-28 requests to the gateway, as a host's backend
would. The upstream is configured with `bare_names = true`: the view calls `get-time`, its own
server's name (docs/apps.md "Names").

A missing chromium, Playwright or example server fails the test; nothing skips. A screenshot of
the rendered view goes to target/apps/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import PEERS, ROOT, daemon_env, write_config

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER = PEERS / "node_modules" / "@modelcontextprotocol" / "server-basic-vanillajs" / "dist" / "index.js"
HOST = "http://host.test"
MIME = "text/html;profile=mcp-app"

# The host page: lists tools, reads the view of the first tool that has one, renders it, and
# answers the view's requests (its tools/call through the gateway).
HOST_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>gatehouse apps host</title></head>
<body>
<h1>host</h1>
<div id="status">starting</div>
<iframe id="view" sandbox="allow-scripts" style="width: 900px; height: 700px; border: 1px solid #888"></iframe>
<script>
const status = (s) => { document.getElementById("status").textContent = s; };
async function rpc(method, params) {
  const r = await fetch("/rpc", {method: "POST", headers: {"content-type": "application/json"},
                                 body: JSON.stringify({method, params: params || {}})});
  return r.json();
}
window.viewCalls = [];
const frame = document.getElementById("view");
function reply(msg) { frame.contentWindow.postMessage(msg, "*"); }
window.addEventListener("message", async (e) => {
  if (e.source !== frame.contentWindow) return;
  const m = e.data;
  if (!m || m.jsonrpc !== "2.0" || !m.method) return;
  if (m.id === undefined) return;  // the view's notifications (initialized, size-changed, logs)
  if (m.method === "ui/initialize") {
    reply({jsonrpc: "2.0", id: m.id, result: {
      protocolVersion: m.params.protocolVersion,
      hostInfo: {name: "gatehouse-test-host", version: "0"},
      hostCapabilities: {serverTools: {}},
      hostContext: {theme: "light", displayMode: "inline"}}});
    status("view initialized");
    return;
  }
  if (m.method === "tools/call") {
    window.viewCalls.push(m.params.name);
    const r = await rpc("tools/call", m.params);
    reply(r.error ? {jsonrpc: "2.0", id: m.id, error: r.error}
                  : {jsonrpc: "2.0", id: m.id, result: r.result});
    return;
  }
  reply({jsonrpc: "2.0", id: m.id, error: {code: -32601, message: "not supported by this host"}});
});
(async () => {
  const caps = await rpc("server/discover");
  window.extension = caps.result.capabilities.extensions["io.modelcontextprotocol/ui"];
  const tools = (await rpc("tools/list")).result.tools;
  const tool = tools.find((t) => t._meta && t._meta.ui && t._meta.ui.resourceUri);
  const read = await rpc("resources/read", {uri: tool._meta.ui.resourceUri});
  const c = read.result.contents[0];
  window.view = {tool: tool.name, uri: c.uri, mimeType: c.mimeType};
  frame.srcdoc = c.text;
  status("view loaded");
})().catch((e) => status("failed: " + e));
</script>
</body></html>
"""


def stateless(mcp_url: str, token: str, n: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One 2026-07-28 request to the gateway (the `_meta` envelope and mirrored headers)."""
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": [MIME]}}
        },
    }
    body = json.dumps({"jsonrpc": "2.0", "id": n, "method": method, "params": params}).encode()
    req = urllib.request.Request(mcp_url, data=body, method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    req.add_header("MCP-Protocol-Version", "2026-07-28")
    req.add_header("Mcp-Method", method)
    name = params.get("name") or params.get("uri")
    if isinstance(name, str):
        req.add_header("Mcp-Name", name)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
    text = raw.decode()
    if text.lstrip().startswith("{"):
        return json.loads(text)
    # An SSE reply: the last `data:` line is the response.
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


def test_a_view_rendered_through_the_gateway_makes_an_audited_call(tmp_path: Path, daemons) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (tests/peers/setup.sh)")
    if not SERVER.exists():
        pytest.fail(f"{SERVER} is missing: run tests/peers/setup.sh")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:  # a missing peer fails, never skips
        pytest.fail(f"Playwright is missing from the venv ({e}): run tests/peers/setup.sh")
    write_config(tmp_path, f"""
[[upstreams]]
id = "basic"
command = "node"
args = ["{SERVER}", "--stdio"]
bare_names = true
""")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    status, reg = d.admin("POST", "/v1/registrations", {"agent_id": "browser-agent", "tools": ["basic.*"]})
    assert status == 201, (status, reg)
    mcp_url, token = reg["mcp_url"], reg["token"]
    counter = iter(range(1, 1_000_000))

    def route(r: Any) -> None:
        url = r.request.url
        if url.rstrip("/") == HOST:
            r.fulfill(status=200, content_type="text/html; charset=utf-8", body=HOST_PAGE)
        elif url == HOST + "/rpc":
            asked = json.loads(r.request.post_data or "{}")
            answer = stateless(mcp_url, token, next(counter), asked["method"], asked.get("params") or {})
            r.fulfill(status=200, content_type="application/json", body=json.dumps(answer))
        else:
            r.fulfill(status=404, body="")

    errors: list[str] = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = b.new_context(viewport={"width": 1000, "height": 900}).new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route(HOST + "/**", route)
            page.route(HOST, route)
            page.goto(HOST + "/")
            page.wait_for_function("document.getElementById('status').textContent === 'view initialized'",
                                   timeout=30_000)
            view = page.evaluate("window.view")
            assert view == {"tool": "get-time", "uri": "ui://get-time/mcp-app.html", "mimeType": MIME}, view
            assert page.evaluate("window.extension") == {"mimeTypes": [MIME]}
            frame = page.frame_locator("#view")
            frame.locator("#get-time-btn").click()
            page.wait_for_function("window.viewCalls.length === 1", timeout=30_000)
            shown = frame.locator("#server-time")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not shown.inner_text().startswith("20"):
                time.sleep(0.1)
            assert shown.inner_text().startswith("20"), shown.inner_text()
            shots = ROOT / "target" / "apps"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "basic-view.png"), full_page=True)
            assert page.evaluate("window.viewCalls") == ["get-time"]
        finally:
            b.close()
    assert not errors, errors

    # The view's call, in the audit log: the registration's agent, the tool, ok.
    records = [json.loads(l) for l in (tmp_path / "audit.jsonl").read_text().splitlines() if l.strip()]
    calls = [r for r in records if r["event"] == "governed_mcp_call"]
    assert len(calls) == 1, calls
    c = calls[0]
    assert c["tool"] == "get-time" and c["agent_id"] == "browser-agent", c
    assert c["registration_id"] == reg["id"] and c["outcome"] == "ok", c
    assert c["transport"] == "stateless", c
    assert "initiator" not in c, "get-time is visible to the model too: no mark (docs/apps.md)"
