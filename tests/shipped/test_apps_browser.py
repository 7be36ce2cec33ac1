"""MCP Apps in a real browser (issue 52 item 1, docs/apps.md): Debian's chromium, driven by
Playwright (its own browser download unused), renders the view of the SDK's example app server
`@modelcontextprotocol/server-basic-vanillajs` (tests/peers, a stdio upstream of the shipped
binary) fetched through a registration, and the view's own button makes the app-initiated
`get-time` call, which lands in the audit log attributed to the registration's agent; and
`server-pdf`'s viewer, whose own calls to its app-only tools are audited `initiator: "app"`.

The host is this test: a page (served with its `/rpc` by a small HTTP server of the test on
127.0.0.1:0, a thread per request) that lists the registration's tools, reads the tool's `ui://`
view, renders it in a sandboxed iframe and speaks the host's side of the extension over
postMessage (`ui/initialize`, tool input and result, `tools/call`); `/rpc` is answered by
stateless 2026-07-28 requests to the gateway, as a host's backend would. The upstream is configured with
`bare_names = true`: a view calls its own server's names (`get-time`; docs/apps.md "Names").

A missing chromium, Playwright or example server fails the test; nothing skips. A screenshot of
the rendered view goes to target/apps/ (git-ignored).
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

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
MIME = "text/html;profile=mcp-app"
# A one-page PDF (header, catalog, pages, page, xref, trailer).
TINY_PDF = (
    b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
    b"2 0 obj\n<< /Type /Pages /Kids [3 0 R] /Count 1 >>\nendobj\n"
    b"3 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>\nendobj\n"
    b"xref\n0 4\n0000000000 65535 f \n0000000009 00000 n \n0000000058 00000 n \n"
    b"0000000115 00000 n \ntrailer\n<< /Size 4 /Root 1 0 R >>\nstartxref\n186\n%%EOF\n"
)

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
window.hostRequests = [];
const frame = document.getElementById("view");
function reply(msg) { frame.contentWindow.postMessage(msg, "*"); }
window.addEventListener("message", async (e) => {
  if (e.source !== frame.contentWindow) return;
  const m = e.data;
  if (!m || m.jsonrpc !== "2.0" || !m.method) return;
  if (m.method === "ui/notifications/initialized" && window.shown) {
    // The model's call this view shows: its input, then its result.
    reply({jsonrpc: "2.0", method: "ui/notifications/tool-input", params: {arguments: window.shown.args}});
    reply({jsonrpc: "2.0", method: "ui/notifications/tool-result", params: window.shown.result});
    return;
  }
  if (m.id === undefined) return;  // the view's other notifications (size-changed, logs)
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
  window.hostRequests.push(m.method);
  if (m.method === "ui/update-model-context" || m.method === "ui/message") {
    reply({jsonrpc: "2.0", id: m.id, result: {}});
    return;
  }
  if (m.method === "ui/request-display-mode") {
    reply({jsonrpc: "2.0", id: m.id, result: {mode: "inline"}});
    return;
  }
  reply({jsonrpc: "2.0", id: m.id, error: {code: -32601, message: "not supported by this host: " + m.method}});
});
(async () => {
  const caps = await rpc("server/discover");
  window.extension = caps.result.capabilities.extensions["io.modelcontextprotocol/ui"];
  const tools = (await rpc("tools/list")).result.tools;
  // ?tool=NAME&args=JSON: the host first makes that call (as the model would) and shows its
  // view with its result; else the first tool with a view, shown without one.
  const q = new URLSearchParams(location.search);
  const tool = q.get("tool") ? tools.find((t) => t.name === q.get("tool"))
                             : tools.find((t) => t._meta && t._meta.ui && t._meta.ui.resourceUri);
  if (q.get("tool")) {
    const args = JSON.parse(q.get("args") || "{}");
    const r = await rpc("tools/call", {name: tool.name, arguments: args});
    window.shown = {args, result: r.result};
  }
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


def browse(mcp_url: str, token: str, query: str, interact: Callable[[Any], None]) -> None:
    """Opens the host page (`query` after `?`) in chromium and runs `interact(page)`; the page's
    `/rpc` goes to the gateway. Fails on a missing browser or Playwright, or a page error."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (tests/peers/setup.sh)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:  # a missing peer fails, never skips
        pytest.fail(f"Playwright is missing from the venv ({e}): run tests/peers/setup.sh")
    counter = iter(range(1, 1_000_000))
    lock = threading.Lock()

    class Backend(http.server.BaseHTTPRequestHandler):
        """The host's server: its page, and `/rpc` answered by the gateway (a thread each, as a
        view's long polls need)."""

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            if self.path.split("?")[0] == "/":
                self._send(200, "text/html; charset=utf-8", HOST_PAGE.encode())
            else:
                self._send(404, "text/plain", b"")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/rpc":
                self._send(404, "text/plain", b"")
                return
            asked = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            with lock:
                n = next(counter)
            answer = stateless(mcp_url, token, n, asked["method"], asked.get("params") or {})
            self._send(200, "application/json", json.dumps(answer).encode())

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser went away during a view's long poll

        def log_message(self, *args: Any) -> None:
            pass

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    backend.daemon_threads = True
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{backend.server_address[1]}"
    errors: list[str] = []
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = b.new_context(viewport={"width": 1000, "height": 900}).new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(host + "/" + (f"?{query}" if query else ""))
                page.wait_for_function(
                    "document.getElementById('status').textContent === 'view initialized'", timeout=30_000
                )
                interact(page)
            finally:
                b.close()
    finally:
        backend.shutdown()
        backend.server_close()
    assert not errors, errors


def serve(tmp_path: Path, daemons, package: str, args: str, agent: str) -> tuple[Path, dict[str, Any]]:
    """The shipped binary serving one example app server (`bare_names`), and a registration
    granted all its tools."""
    server = PEERS / "node_modules" / "@modelcontextprotocol" / package / "dist" / "index.js"
    if not server.exists():
        pytest.fail(f"{server} is missing: run tests/peers/setup.sh")
    write_config(tmp_path, f"""
[[upstreams]]
id = "app"
command = "node"
args = ["{server}", "--stdio"{args}]
bare_names = true
""")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    status, reg = d.admin("POST", "/v1/registrations", {"agent_id": agent, "tools": ["app.*"]})
    assert status == 201, (status, reg)
    return tmp_path / "audit.jsonl", reg


def calls_in(audit: Path) -> list[dict[str, Any]]:
    records = [json.loads(l) for l in audit.read_text().splitlines() if l.strip()]
    return [r for r in records if r["event"] == "governed_mcp_call"]


def shot(page: Any, name: str) -> None:
    shots = ROOT / "target" / "apps"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / name), full_page=True)


def test_a_views_button_makes_a_call_through_the_gateway_that_is_audited(tmp_path: Path, daemons) -> None:
    audit, reg = serve(tmp_path, daemons, "server-basic-vanillajs", "", "browser-agent")

    def interact(page: Any) -> None:
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
        shot(page, "basic-view.png")
        assert page.evaluate("window.viewCalls") == ["get-time"]

    browse(reg["mcp_url"], reg["token"], "", interact)
    # The view's call, in the audit log: the registration's agent, the tool, ok.
    calls = calls_in(audit)
    assert len(calls) == 1, calls
    c = calls[0]
    assert c["tool"] == "get-time" and c["agent_id"] == "browser-agent", c
    assert c["registration_id"] == reg["id"] and c["outcome"] == "ok", c
    assert c["transport"] == "stateless", c
    assert "initiator" not in c, "get-time is visible to the model too: no mark (docs/apps.md)"


def test_the_pdf_views_own_calls_are_audited_as_the_apps(tmp_path: Path, daemons) -> None:
    """server-pdf's viewer, shown with the result of the host's `display_pdf` call, fetches the
    document itself through `read_pdf_bytes`, a tool only the app sees: those calls are audited
    with `initiator: "app"`, the host's own call without."""
    pdf = tmp_path / "tiny.pdf"
    pdf.write_bytes(TINY_PDF)
    audit, reg = serve(tmp_path, daemons, "server-pdf", f', "{pdf}"', "pdf-agent")
    query = urllib.parse.urlencode({"tool": "display_pdf", "args": json.dumps({"url": str(pdf)})})

    def interact(page: Any) -> None:
        assert page.evaluate("window.view.uri") == "ui://pdf-viewer/mcp-app.html"
        page.wait_for_function("window.viewCalls.includes('read_pdf_bytes')", timeout=30_000)
        time.sleep(1)
        shot(page, "pdf-view.png")

    browse(reg["mcp_url"], reg["token"], query, interact)
    calls = calls_in(audit)
    model = [c for c in calls if c["tool"] == "display_pdf"]
    assert len(model) == 1 and "initiator" not in model[0], model
    reads = [c for c in calls if c["tool"] == "read_pdf_bytes"]
    assert reads, calls
    for c in reads:
        assert c["initiator"] == "app" and c["agent_id"] == "pdf-agent" and c["outcome"] == "ok", c
