"""The operator console (issue 29) in a real headless browser: Debian's chromium, driven by
Playwright (its own browser download unused), against a real `gatehouse serve` carrying real
MCP traffic from the official Python SDK.

A missing chromium or Playwright fails these tests; nothing skips. Screenshots of the page
under load go to target/console/ (git-ignored); docs/console.png is one of them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import anyio
import pytest

import gatehouse
from conftest import ROOT, Daemon, http_status, session, text_of

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
SHOTS = ROOT / "target" / "console"
HELPDESK = (
    "record_arguments = true\n"
    '[[upstreams]]\nid = "helpdesk"\ncommand = "@self"\nargs = ["demo-upstream"]\nsharing = "leased"\n'
)
XSS_SCRIPT = "<script>window.__xss = 1</script>"
XSS_IMG = '<img src=x onerror="window.__xss = 2; alert(2)">'
XSS = XSS_SCRIPT + XSS_IMG


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, upstreams=HELPDESK)
    yield d
    d.stop()


def admin_token(d: Daemon) -> str:
    return d.token_file.read_text().strip()


class Browser:
    """One page in headless chromium, with every dialog and console error it raised."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("dialog", self._dialog)
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def login(self, d: Daemon, token: str | None = None) -> None:
        self.page.goto(d.admin_url + "/ui")
        self.page.fill("#token", token or admin_token(d))
        self.page.click("#login-button")

    def shot(self, name: str, full_page: bool = True) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / name
        self.page.screenshot(path=str(path), full_page=full_page)
        return path


@contextmanager
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run tests/peers/setup.sh (Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:  # a missing peer fails, never skips
        pytest.fail(f"Playwright is missing from the venv ({e}): run tests/peers/setup.sh")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            ctx = b.new_context(viewport={"width": 1360, "height": 1000})
            yield Browser(ctx.new_page())
        finally:
            b.close()


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def call_tools(reg: Any, n: int, title: str = "printer") -> list[str]:
    """`n` helpdesk calls through the official SDK (Streamable HTTP)."""

    async def run() -> list[str]:
        out = []
        async with session("streamable", reg) as s:
            for i in range(n):
                r = await s.call_tool("helpdesk.open_case", {"title": f"{title} {i}"})
                assert not r.is_error, text_of(r)
                out.append(text_of(r))
        return out

    return off_thread(run)


def off_thread(fn: Any) -> Any:
    """`anyio.run(fn)` on another thread: Playwright's sync API runs its own event loop in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result(timeout=120)


def traffic(regs: list[Any], seconds: float) -> int:
    """Calls from three agents at different rates for `seconds`, a tool error among them
    (`add_note` without its text); returns the calls made."""

    async def run() -> int:
        n = 0
        async with session("streamable", regs[0]) as a, session("streamable", regs[1]) as b, session(
            "streamable", regs[2]
        ) as c:
            await a.call_tool("helpdesk.open_case", {"title": "load"})
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for _ in range(3):
                    assert not (await a.call_tool("helpdesk.list_notes", {})).is_error
                assert not (await b.call_tool("helpdesk.open_case", {"title": "load"})).is_error
                assert (await c.call_tool("helpdesk.add_note", {})).is_error
                n += 5
                await anyio.sleep(0.02)
        return n + 1

    return anyio.run(run)


def wait_until(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_the_console_is_on_the_admin_listener_only_with_strict_headers(daemon: Daemon) -> None:
    d = daemon
    token = admin_token(d)
    for path, kind in [
        ("/ui", "text/html"),
        ("/ui/console.js", "text/javascript"),
        ("/ui/console.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
        ("/ui/nope", "text/plain"),
    ]:
        status, h, body = get(d.admin_url + path)
        assert status == (404 if path == "/ui/nope" else 200), path
        assert h["content-type"].startswith(kind), (path, h)
        csp = h["content-security-policy"]
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        ]:
            assert directive in csp, (path, csp)
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert h["x-frame-options"] == "DENY"
        assert h["x-content-type-options"] == "nosniff"
        assert h["cache-control"] == "no-store"
        assert h["referrer-policy"] == "no-referrer"
    # The page is public (it is the login); its data is not.
    assert get(d.admin_url + "/v1/console/stats")[0] == 401
    assert get(d.admin_url + "/v1/audit")[0] == 401
    assert get(d.admin_url + "/v1/console/stats", "wrong")[0] == 401
    # Bad query values: 400 saying what to fix.
    for q, field in [("limit=0", "limit"), ("max_bytes=1", "max_bytes"), ("outcome=fine", "outcome"), ("colour=red", "colour")]:
        status, _, body = get(d.admin_url + "/v1/audit?" + q, token)
        assert status == 400, q
        assert json.loads(body)["error"].startswith(field + ":"), body
    # Never on the data listener.
    admin = gatehouse.AdminClient(d.admin_url, token)
    with admin.register("agent-h", ["helpdesk.*"]) as reg:
        call_tools(reg, 1)
        # The console's answers never carry a token.
        for path in ["/v1/console/stats", "/v1/audit?limit=1000"]:
            status, _, body = get(d.admin_url + path, token)
            assert status == 200, path
            assert reg.token.encode() not in body and token.encode() not in body, path
        stats = json.loads(get(d.admin_url + "/v1/console/stats", token)[2])
        row = stats["registrations"][0]
        assert row["id"] == reg.id and "token" not in row
        assert stats["series"]["window_s"] == 900 and stats["series"]["agents"][0]["key"] == "agent-h"
        data = reg.mcp_url.split("/gw/")[0]
        for path in ["/ui", "/ui/console.js", "/v1/console/stats", "/v1/audit"]:
            assert get(data + path)[0] == 404, path
            assert get(data + path, token)[0] == 404, path


def test_without_a_token_the_page_shows_only_the_login(daemon: Daemon) -> None:
    d = daemon
    admin = gatehouse.AdminClient(d.admin_url, admin_token(d))
    with admin.register("agent-secret", ["helpdesk.*"], label="run-hidden") as reg, browser() as b:
        call_tools(reg, 2)
        b.page.goto(d.admin_url + "/ui")
        b.page.wait_for_selector("#login-form")
        assert b.page.is_visible("#login") and b.page.is_hidden("#console")
        assert b.page.is_visible("#token")
        text = b.page.inner_text("body")
        for secret in [reg.id, "agent-secret", "run-hidden", "helpdesk.open_case"]:
            assert secret not in text and secret not in b.page.content()
        # No data request was made without a token.
        assert not [u for u in b.requests if "/v1/" in u], b.requests
        # A wrong token is refused, shows why, and the page still holds no data.
        b.login(d, "not-the-token")
        b.page.wait_for_selector("#login-error:not(.hidden)")
        assert "refused" in b.page.inner_text("#login-error")
        assert b.page.is_hidden("#console")
        assert reg.id not in b.page.content()
        assert b.page.evaluate("sessionStorage.length") == 0
        b.shot("login.png")
        assert b.dialogs == []
        # The one console error is the browser's note of the refused (401) request.
        assert all("401" in e for e in b.errors), b.errors


def test_the_page_lists_registrations_plots_calls_and_releases(daemon: Daemon) -> None:
    d = daemon
    token = admin_token(d)
    admin = gatehouse.AdminClient(d.admin_url, token)
    regs = [
        admin.register(f"agent-{n}", ["helpdesk.*"], label=f"run-{n}", ttl_s=600)
        for n in ("alpha", "bravo", "charlie")
    ]
    try:
        with browser() as b:
            b.login(d)
            b.page.wait_for_selector("#console:not(.hidden)")
            # The page lists every registration made, with its agent and label.
            for r in regs:
                row = b.page.wait_for_selector(f'#registrations tr[data-id="{r.id}"]')
                assert row is not None
                cells = row.inner_text()
                assert r.agent_id in cells and f"run-{r.agent_id[6:]}" in cells
            assert token not in b.page.content()
            assert all(r.token not in b.page.content() for r in regs)
            # A child registration (issue 39) is shown right under its parent, indented.
            kid = regs[0].child("agent-alpha-sub", ["helpdesk.list_notes"])
            row = b.page.wait_for_selector(f'#registrations tr[data-parent="{regs[0].id}"]')
            assert row.get_attribute("data-id") == kid.id and row.get_attribute("data-depth") == "1"
            ids = [tr.get_attribute("data-id") for tr in b.page.query_selector_all("#registrations tbody tr")]
            assert ids.index(kid.id) == ids.index(regs[0].id) + 1, ids
            assert kid.release()
            b.page.wait_for_selector(f'#registrations tr[data-id="{kid.id}"]', state="detached")
            assert b.page.evaluate("sessionStorage.getItem('gatehouse.admin_token')") == token
            total = lambda sel: int(b.page.get_attribute(sel, "data-total") or "0")  # noqa: E731
            blank = b.page.evaluate("document.getElementById('plot-agents-calls').toDataURL()")
            before = total("#plot-agents-calls")
            # Real traffic: the plots move (screenshots taken under it).
            with ThreadPoolExecutor(1) as pool:
                load = pool.submit(traffic, regs, 8.0)
                wait_until(lambda: total("#plot-agents-calls") >= before + 15, "the agents' plot to count 15 calls")
                time.sleep(5)
                shot = b.shot("console-under-load.png", full_page=False)
                b.shot("console-under-load-full.png")
                made = load.result(timeout=60)
            wait_until(lambda: total("#plot-agents-calls") >= made, f"the agents' plot to count {made} calls")
            assert total("#plot-agents-errors") > 0  # the tool errors are counted too
            wait_until(lambda: total("#plot-upstreams-calls") >= 15, "the upstreams' plot to count the calls")
            drawn = b.page.evaluate("document.getElementById('plot-agents-calls').toDataURL()")
            assert drawn != blank
            legend = b.page.inner_text("#legend-agents")
            assert all(r.agent_id in legend for r in regs), legend
            tools = wait_until(lambda: b.page.query_selector('#tools tr[data-tool="helpdesk.open_case"]'), "the tool's latency row")
            assert "helpdesk.open_case" in tools.inner_text()
            wait_until(lambda: b.page.query_selector('#upstreams tr[data-upstream="helpdesk"]'), "the upstream's row")
            # The audit tail, verified, and filtered from the page.
            wait_until(lambda: "chain verified" in b.page.inner_text("#verify"), "the chain to verify")
            b.page.fill("#f-agent", "agent-bravo")
            b.page.select_option("#f-outcome", "ok")
            b.page.click("#audit-filters button")
            wait_until(
                lambda: (rows := b.page.query_selector_all("#audit tbody tr"))
                and all(row.query_selector(".agent").inner_text() == "agent-bravo" for row in rows),
                "the audit tail filtered to agent-bravo",
            )
            rows = b.page.query_selector_all("#audit tbody tr")
            assert rows and all(row.query_selector(".outcome").inner_text() == "ok" for row in rows)
            b.shot("console-filtered.png")
            # GATEHOUSE_CONSOLE_SCREENSHOT=docs/console.png refreshes the README's picture.
            docs = os.environ.get("GATEHOUSE_CONSOLE_SCREENSHOT")
            if docs:
                shutil.copyfile(shot, docs)
            # Release one registration from the page, with its confirmation.
            gone = regs[1]
            assert http_status("POST", gone.mcp_url, gone.token, {"jsonrpc": "2.0", "id": 1, "method": "ping"}) != 404
            b.page.click(f'#registrations tr[data-id="{gone.id}"] button[data-action="release"]')
            # Nothing happens before the confirmation; cancel leaves it alone.
            b.page.click(f'#registrations tr[data-id="{gone.id}"] button[data-action="cancel-release"]')
            assert gone.id in [r["id"] for r in admin.list()]
            b.page.click(f'#registrations tr[data-id="{gone.id}"] button[data-action="release"]')
            b.page.click(f'#registrations tr[data-id="{gone.id}"] button[data-action="confirm-release"]')
            b.page.wait_for_selector(f'#registrations tr[data-id="{gone.id}"]', state="detached")
            assert sorted(r["id"] for r in admin.list()) == sorted([regs[0].id, regs[2].id])
            for url in (gone.mcp_url, gone.sse_url):
                assert http_status("GET", url, gone.token) == 404, url
            assert http_status("POST", gone.mcp_url, gone.token, {"jsonrpc": "2.0", "id": 1, "method": "ping"}) == 404
            # Those refusals are plotted beside the call rates (issue 41), by reason.
            wait_until(lambda: "released" in b.page.inner_text("#legend-refusals"), "the refusals' legend to name released")
            wait_until(lambda: total("#plot-refusals") >= 3, "the refusals' plot to count the three 404s")
            # The page keeps serving the others.
            time.sleep(2.5)
            assert b.page.query_selector(f'#registrations tr[data-id="{regs[0].id}"]') is not None
            assert b.dialogs == [], b.dialogs
            assert b.errors == [], b.errors  # no CSP violation, no script error
    finally:
        for r in regs:
            r.release()


def test_xss_payloads_in_a_label_an_agent_a_tool_name_and_an_argument_render_as_text(daemon: Daemon) -> None:
    d = daemon
    admin = gatehouse.AdminClient(d.admin_url, admin_token(d))
    secret = "argument-value-never-shown-" + XSS
    with admin.register("agent-" + XSS_IMG, ["helpdesk.*"], label="label-" + XSS) as reg, browser() as b:

        async def traffic() -> None:
            async with session("streamable", reg) as s:
                r = await s.call_tool("helpdesk.open_case", {"title": secret})
                assert not r.is_error
                from mcp.shared.exceptions import MCPError

                with pytest.raises(MCPError, match="Unknown tool"):  # not granted: audited, denied
                    await s.call_tool(XSS_IMG, {"x": secret})

        off_thread(traffic)
        # The audit holds the argument (record_arguments = true); the API never returns it.
        status, _, body = get(d.admin_url + "/v1/audit?limit=1000", admin_token(d))
        assert status == 200 and b"argument-value-never-shown" not in body
        assert json.loads(body)["verify"]["state"] == "ok"
        b.login(d)
        row = b.page.wait_for_selector(f'#registrations tr[data-id="{reg.id}"]')
        assert row.query_selector(".label").inner_text() == "label-" + XSS
        assert row.query_selector(".agent").inner_text() == "agent-" + XSS_IMG
        wait_until(lambda: b.page.query_selector_all("#audit tbody tr"), "the audit tail")
        wait_until(
            lambda: XSS_IMG in [c.inner_text() for c in b.page.query_selector_all("#audit td.tool")],
            "the denied tool name in the audit tail, as text",
        )
        # The latency table counts a tool name no grant matched as `_unknown`: a client
        # cannot fill its rows with names of its own.
        wait_until(
            lambda: "_unknown" in [c.inner_text() for c in b.page.query_selector_all("#tools td")],
            "the refused call under _unknown in the latency table",
        )
        assert XSS_IMG not in b.page.inner_text("#tools")
        time.sleep(2.5)  # a few more polls render the same data again
        assert b.page.evaluate("typeof window.__xss") == "undefined"
        assert b.dialogs == [], b.dialogs
        # No element came from the payloads: one script (ours), no <img> but the logo.
        assert b.page.evaluate("document.scripts.length") == 1
        assert b.page.evaluate("[...document.images].map(i => i.getAttribute('src'))") == ["/ui/favicon.svg"]
        assert "argument-value-never-shown" not in b.page.content()
        b.shot("xss-as-text.png")
        assert b.errors == [], b.errors


def test_the_console_lists_pending_approvals_and_its_buttons_decide_them(daemon: Daemon) -> None:
    """Issue 49: two calls held for approval are listed (agent, tool, arguments as text); the
    Approve button runs one, the Deny button refuses the other, each an operator's decision."""
    d = daemon
    admin = gatehouse.AdminClient(d.admin_url, admin_token(d))
    rule = [{"id": "cases_need_ok", "when": "tool.name == 'helpdesk.open_case'", "effect": "approve",
             "approver": "harness", "timeout_s": 60}]
    with admin.register("approver-" + XSS_IMG, ["helpdesk.*"], policy=rule) as reg, browser() as b:

        async def two_calls() -> dict[str, Any]:
            out: dict[str, Any] = {}
            async with session("streamable", reg) as s1, session("streamable", reg) as s2:

                async def one(s: Any, title: str) -> None:
                    out[title] = await s.call_tool("helpdesk.open_case", {"title": title})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, s1, "approve me")
                    tg.start_soon(one, s2, "deny me " + XSS)
            return out

        with ThreadPoolExecutor(1) as pool:
            calls = pool.submit(anyio.run, two_calls)
            b.login(d)

            def rows() -> Any:
                r = b.page.query_selector_all("#approvals tbody tr")
                return r if len(r) == 2 else None

            wait_until(rows, "two pending approvals in the console")

            def row_with(text: str) -> Any:
                for r in b.page.query_selector_all("#approvals tbody tr"):
                    if text in r.query_selector(".arguments").inner_text():
                        return r
                pytest.fail(f"no pending approval shows {text!r}")

            yes, no = row_with("approve me"), row_with("deny me")
            assert yes.query_selector(".tool").inner_text() == "helpdesk.open_case"
            assert yes.query_selector(".agent").inner_text() == "approver-" + XSS_IMG
            assert XSS_SCRIPT in no.query_selector(".arguments").inner_text()  # as text
            b.shot("approvals.png")
            yes.query_selector('button[data-action="approve"]').click()
            no.query_selector('button[data-action="deny"]').click()
            out = calls.result(timeout=60)
        assert not out["approve me"].is_error, text_of(out["approve me"])
        denied = out["deny me " + XSS]
        assert denied.is_error and "denied by admin" in text_of(denied), text_of(denied)
        wait_until(lambda: not b.page.query_selector_all("#approvals tbody tr"), "the list emptied")
        assert b.page.evaluate("typeof window.__xss") == "undefined"
        assert b.dialogs == [], b.dialogs
        assert b.errors == [], b.errors
    status, _, body = get(d.admin_url + "/v1/audit?event=approval_decided&limit=10", admin_token(d))
    assert status == 200
    decided = json.loads(body)["records"]
    assert sorted(r.get("decision") for r in decided) == ["approve", "deny"], decided
    assert all(r.get("decided_by") == "admin" for r in decided), decided
