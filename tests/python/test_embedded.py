"""The embedded gateway from Python, driven by the official MCP Python SDK over legacy SSE and
Streamable HTTP: isolation, release, attribution, Python tools (sync, async, raising, slow),
context, cancellation, lazy server, upstream grants, typed errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Literal, Optional

import anyio
import pytest
from mcp.shared.exceptions import MCPError

import gatehouse
from conftest import (
    INIT,
    TRANSPORTS,
    Recorder,
    audit_records,
    gatehouse_bin,
    http_status,
    listening_sockets,
    session,
    text_of,
)

pytestmark = pytest.mark.anyio


def whoami(tag: str) -> gatehouse.Tool:
    @gatehouse.tool(name=f"whoami_{tag}", description="Says who it belongs to")
    def f(ctx: gatehouse.CallContext) -> str:
        return f"{tag}:{ctx.agent_id}"

    return f


# ---------------------------------------------------------------- isolation, release, audit


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_isolation_between_registrations(gw: gatehouse.Gateway, transport: str) -> None:
    a = gw.register("agent-a", tools=[whoami("a")])
    b = gw.register("agent-b", tools=[whoami("b")])
    try:
        # A's token on B's paths: 401 on both transports.
        assert http_status("GET", b.sse_url, a.token) == 401
        assert http_status("POST", b.mcp_url, a.token, INIT) == 401
        assert http_status("POST", b.mcp_url, None, INIT) == 401
        async with session(transport, b) as s:
            names = [t.name for t in (await s.list_tools()).tools]
            assert names == ["whoami_b"]
            with pytest.raises(MCPError, match="Unknown tool"):
                await s.call_tool("whoami_a", {})
            assert text_of(await s.call_tool("whoami_b", {})) == "b:agent-b"
    finally:
        a.release()
        b.release()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_release_then_404(gw: gatehouse.Gateway, transport: str) -> None:
    keep = gw.register("agent-keep", tools=[whoami("k")])  # keeps the server up
    reg = gw.register("agent-r", tools=[whoami("r")])
    async with session(transport, reg) as s:
        assert text_of(await s.call_tool("whoami_r", {})) == "r:agent-r"
    reg.release()
    assert reg.released
    assert http_status("GET", reg.sse_url, reg.token) == 404
    assert http_status("POST", reg.mcp_url, reg.token, INIT) == 404
    reg.release()  # idempotent
    keep.release()


async def test_two_agents_interleaved_audit_attribution(audit_path: Path) -> None:
    gw = gatehouse.Gateway(audit_path=audit_path, linger_ms=0)
    a = gw.register("agent-a", tools=[whoami("a")], label="run-a")
    b = gw.register("agent-b", tools=[whoami("b")], label="run-b")
    async with session("sse", a) as sa, session("streamable", b) as sb:
        for _ in range(5):
            assert text_of(await sa.call_tool("whoami_a", {})) == "a:agent-a"
            assert text_of(await sb.call_tool("whoami_b", {})) == "b:agent-b"
    a.release()
    b.release()
    gw.close()  # flushes the audit
    calls = [r for r in audit_records(audit_path) if r.get("event") == "governed_mcp_call"]
    assert len(calls) == 10
    for r in calls:
        if r["registration_id"] == a.id:
            assert (r["agent_id"], r["label"], r["tool"]) == ("agent-a", "run-a", "whoami_a")
        else:
            assert r["registration_id"] == b.id
            assert (r["agent_id"], r["label"], r["tool"]) == ("agent-b", "run-b", "whoami_b")
    # `gatehouse audit` reads the same file.
    out = subprocess.run(
        [gatehouse_bin(), "audit", "--file", str(audit_path), "--agent-id", "agent-b", "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    rows = [r for r in rows if r.get("event") == "governed_mcp_call"]
    assert len(rows) == 5 and all(r["agent_id"] == "agent-b" for r in rows)
    verify = subprocess.run(
        [gatehouse_bin(), "audit", "verify", str(audit_path)], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


# ---------------------------------------------------------------- tools: results, errors, schema


@gatehouse.tool(description="Returns each kind of result")
def kinds(kind: Literal["text", "dict", "blocks", "none"], ctx: gatehouse.CallContext) -> Any:
    if kind == "text":
        return "plain"
    if kind == "dict":
        return {"agent": ctx.agent_id, "n": 3}
    if kind == "blocks":
        return [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    return None


@gatehouse.tool
def boom(secret: str = "x") -> str:
    """Raises."""
    raise ValueError(f"case not found: {secret}")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_results_errors_and_argument_checks(
    gw: gatehouse.Gateway, transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert kinds.input_schema == {
        "type": "object",
        "properties": {"kind": {"enum": ["text", "dict", "blocks", "none"]}},
        "required": ["kind"],
        "additionalProperties": False,
    }
    assert boom.description == "Raises."
    with gw.register("agent-k", tools=[kinds, boom]) as reg, caplog.at_level("ERROR"):
        async with session(transport, reg) as s:
            listed = {t.name: t for t in (await s.list_tools()).tools}
            assert listed["kinds"].input_schema["required"] == ["kind"]
            assert text_of(await s.call_tool("kinds", {"kind": "text"})) == "plain"
            r = await s.call_tool("kinds", {"kind": "dict"})
            assert r.structured_content == {"agent": "agent-k", "n": 3}
            assert json.loads(text_of(r)) == {"agent": "agent-k", "n": 3}
            r = await s.call_tool("kinds", {"kind": "blocks"})
            assert [b.text for b in r.content] == ["one", "two"]
            r = await s.call_tool("kinds", {"kind": "none"})
            assert r.content == [] and not r.is_error
            # Arguments are checked against the schema before the function runs.
            for bad in ({}, {"kind": "other"}, {"kind": 3}, {"kind": "text", "extra": 1}):
                r = await s.call_tool("kinds", bad)
                assert r.is_error and "Invalid arguments for tool kinds" in text_of(r), bad
            # A raising tool: isError with the message; the traceback goes to the log only.
            r = await s.call_tool("boom", {"secret": "C-9"})
            assert r.is_error
            assert text_of(r) == "case not found: C-9"
            assert "Traceback" not in text_of(r)
    logged = [rec for rec in caplog.records if rec.name == "gatehouse.tools"]
    assert logged and logged[0].exc_info is not None
    assert "case not found: C-9" in caplog.text and "Traceback" in caplog.text


async def test_explicit_input_schema_and_type_hints(gw: gatehouse.Gateway) -> None:
    @gatehouse.tool(
        name="add",
        input_schema={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0}},
            "required": ["a", "b"],
        },
    )
    def add(a: int, b: int) -> str:
        return str(a + b)

    @gatehouse.tool
    def hints(xs: list[int], tag: Optional[str] = None, flag: bool = False) -> dict:
        return {"sum": sum(xs), "tag": tag, "flag": flag}

    assert hints.input_schema["properties"]["xs"] == {"type": "array", "items": {"type": "integer"}}
    assert hints.input_schema["required"] == ["xs"]
    with pytest.raises(gatehouse.InvalidTool):
        gatehouse.tool(input_schema={"type": "string"})(lambda: None)
    with gw.register("agent-s", tools=[add, hints]) as reg:
        async with session("streamable", reg) as s:
            assert text_of(await s.call_tool("add", {"a": 2, "b": 3})) == "5"
            assert (await s.call_tool("add", {"a": 2, "b": -1})).is_error
            r = await s.call_tool("hints", {"xs": [1, 2], "tag": "t"})
            assert r.structured_content == {"sum": 3, "tag": "t", "flag": False}
            assert (await s.call_tool("hints", {"xs": [1, "2"]})).is_error


# ---------------------------------------------------------------- ctx, progress, logs


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_context_progress_and_log(gw: gatehouse.Gateway, transport: str) -> None:
    seen: dict[str, Any] = {}

    @gatehouse.tool
    def work(steps: int, ctx: gatehouse.CallContext) -> str:
        seen.update(
            agent_id=ctx.agent_id,
            registration_id=ctx.registration_id,
            label=ctx.label,
            session_id=ctx.session_id,
            wants=ctx.wants_progress,
        )
        ctx.log("info", "starting")
        for i in range(steps):
            ctx.report_progress(i + 1, steps, f"step {i + 1}")
        with pytest.raises(ValueError):
            ctx.log("loud", "x")
        return "done"

    @gatehouse.tool
    async def awork(ctx: gatehouse.CallContext) -> str:
        ctx.log("warning", "async says")
        ctx.report_progress(1, 1, "all")
        return ctx.agent_id

    rec = Recorder()
    with gw.register("agent-c", tools=[work, awork], label="run-c") as reg:
        async with session(transport, reg, rec) as s:
            r = await s.call_tool("work", {"steps": 3}, progress_callback=rec.on_progress)
            assert text_of(r) == "done"
            r = await s.call_tool("awork", {}, progress_callback=rec.on_progress)
            assert text_of(r) == "agent-c"
            await anyio.sleep(0.1)
    assert seen["agent_id"] == "agent-c"
    assert seen["registration_id"] == reg.id
    assert seen["label"] == "run-c"
    assert isinstance(seen["session_id"], str) and seen["session_id"]
    assert seen["wants"] is True
    assert rec.progress == [
        (1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3"), (1.0, 1.0, "all")
    ]
    assert ("info", "starting") in rec.logs and ("warning", "async says") in rec.logs


# ---------------------------------------------------------------- async tools, loops


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_async_tool_on_callers_loop_and_gateway_loop(
    gw: gatehouse.Gateway, transport: str
) -> None:
    loops: list[Any] = []

    @gatehouse.tool
    async def where(n: int) -> dict:
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0.01)
        return {"n": n * 2}

    mine = asyncio.get_running_loop()
    async with gw.register_async("agent-async", tools=[where]) as reg:
        async with session(transport, reg) as s:
            results = await asyncio.gather(*(s.call_tool("where", {"n": i}) for i in range(8)))
            assert [r.structured_content["n"] for r in results] == [i * 2 for i in range(8)]
    assert loops and all(lp is mine for lp in loops)
    loops.clear()
    reg2 = await gw.register_async("agent-own", tools=[where], loop="gateway")
    async with reg2:
        async with session(transport, reg2) as s:
            assert (await s.call_tool("where", {"n": 1})).structured_content == {"n": 2}
    assert loops and loops[0] is not mine


async def test_slow_tool_does_not_delay_another_registration(gw: gatehouse.Gateway) -> None:
    """A slow sync tool (sleeping, or waiting on Rust with the GIL released) and a slow async
    tool never delay another registration's Python tool calls."""

    @gatehouse.tool
    def slow_sleep() -> str:
        time.sleep(3)
        return "slept"

    @gatehouse.tool
    def slow_wait(ctx: gatehouse.CallContext) -> str:
        ctx.wait_cancelled(3)  # a Rust wait: the GIL must be released
        return "waited"

    @gatehouse.tool
    async def slow_async() -> str:
        await asyncio.sleep(3)
        return "awaited"

    @gatehouse.tool
    def fast(i: int) -> str:
        return f"fast {i}"

    slow_reg = gw.register("agent-slow", tools=[slow_sleep, slow_wait, slow_async])
    fast_reg = gw.register("agent-fast", tools=[fast])
    async with session("sse", slow_reg) as ss, session("streamable", fast_reg) as fs:
        async with anyio.create_task_group() as tg:
            for name in ("slow_sleep", "slow_wait", "slow_async"):
                tg.start_soon(ss.call_tool, name, {})
            await anyio.sleep(0.3)  # the slow calls are running
            t0 = time.monotonic()
            for i in range(20):
                assert text_of(await fs.call_tool("fast", {"i": i})) == f"fast {i}"
            fast_elapsed = time.monotonic() - t0
    slow_reg.release()
    fast_reg.release()
    assert fast_elapsed < 1.5, f"20 fast calls took {fast_elapsed:.2f}s beside slow ones"


def test_gil_released_while_rust_waits(gw: gatehouse.Gateway) -> None:
    """While a tool waits on Rust for a second (`ctx.wait_cancelled`) and the main thread waits
    on Rust for registrations and releases, a pure-Python thread keeps running: the longest gap
    between two of its iterations stays far below the wait (it would be the whole second if the
    wait held the GIL)."""
    stop = threading.Event()
    gaps: list[float] = []

    def spin() -> None:
        last = time.monotonic()
        worst = 0.0
        while not stop.is_set():
            now = time.monotonic()
            worst = max(worst, now - last)
            last = now
        gaps.append(worst)

    @gatehouse.tool
    def waiter(ctx: gatehouse.CallContext) -> str:
        return f"cancelled={ctx.wait_cancelled(1.0)}"

    async def call() -> str:
        with gw.register("agent-w", tools=[waiter]) as reg:
            async with session("streamable", reg) as s:
                return text_of(await s.call_tool("waiter", {}))

    t = threading.Thread(target=spin)
    t.start()
    try:
        t0 = time.monotonic()
        assert anyio.run(call) == "cancelled=False"
        for _ in range(50):
            gw.register("agent-gil", tools=[whoami("g")]).release()
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    assert elapsed >= 1.0
    assert gaps[0] < 0.3, f"a Python thread was starved for {gaps[0]:.2f}s"


# ---------------------------------------------------------------- cancellation


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_release_cancels_async_task_and_sets_ctx_cancelled(
    gw: gatehouse.Gateway, transport: str
) -> None:
    started = threading.Event()
    async_cancelled = threading.Event()
    sync_saw_cancel = threading.Event()
    sync_started = threading.Event()

    @gatehouse.tool
    async def hang() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            async_cancelled.set()
            raise
        return "never"

    @gatehouse.tool
    def poll(ctx: gatehouse.CallContext) -> str:
        sync_started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ctx.cancelled:
                sync_saw_cancel.set()
                return "stopped"
            time.sleep(0.01)
        return "never"

    reg = gw.register("agent-cancel", tools=[hang, poll])
    async with session(transport, reg) as s:
        async with anyio.create_task_group() as tg:

            async def call(name: str) -> None:
                try:
                    await s.call_tool(name, {}, read_timeout_seconds=10)
                except Exception:
                    pass  # the stream ends on release

            tg.start_soon(call, "hang")
            tg.start_soon(call, "poll")
            await anyio.to_thread.run_sync(started.wait, 10)
            await anyio.to_thread.run_sync(sync_started.wait, 10)
            await anyio.to_thread.run_sync(reg.release)
            assert await anyio.to_thread.run_sync(async_cancelled.wait, 5)
            assert await anyio.to_thread.run_sync(sync_saw_cancel.wait, 5)
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_client_cancel_cancels_async_task(gw: gatehouse.Gateway, transport: str) -> None:
    started = threading.Event()
    cancelled = threading.Event()
    flag = threading.Event()

    @gatehouse.tool
    async def hang() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    @gatehouse.tool
    def poll(ctx: gatehouse.CallContext) -> str:
        if ctx.wait_cancelled(30):
            flag.set()
        return "x"

    with gw.register("agent-cc", tools=[hang, poll]) as reg:
        async with session(transport, reg) as s:
            with anyio.move_on_after(0.5):  # the SDK sends notifications/cancelled
                await s.call_tool("hang", {})
            assert started.is_set()
            assert await anyio.to_thread.run_sync(cancelled.wait, 5)
            with anyio.move_on_after(0.5):
                await s.call_tool("poll", {})
            assert await anyio.to_thread.run_sync(flag.wait, 5)
            # The session still works after the cancellations.
            await s.list_tools()


# ---------------------------------------------------------------- lazy server


def test_no_socket_before_first_registration_and_after_last(audit_path: Path) -> None:
    gw = gatehouse.Gateway(audit_path=audit_path, linger_ms=0)
    try:
        assert not gw.serving and gw.local_addr is None
        assert listening_sockets() == []
        a = gw.register("agent-1", tools=[whoami("1")])
        b = gw.register("agent-2", tools=[whoami("2")])
        assert gw.serving and len(listening_sockets()) == 1
        host, port = gw.local_addr.rsplit(":", 1)
        assert listening_sockets() == [(host, int(port))]
        a.release()
        assert gw.serving  # b still holds it
        b.release()
        deadline = time.monotonic() + 5
        while (gw.serving or listening_sockets()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not gw.serving and listening_sockets() == []
        import socket

        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2)
        assert gw.server_starts == 1
        with gw.register("agent-3", tools=[whoami("3")]):
            assert gw.serving and gw.server_starts == 2
    finally:
        gw.close()
    assert listening_sockets() == []


# ---------------------------------------------------------------- upstream grants


def test_upstream_tools_by_grant(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f"""
listen = "127.0.0.1:0"
linger_ms = 0
[audit]
path = "{tmp_path / 'audit.jsonl'}"
[[upstreams]]
id = "helpdesk"
command = "@self"
args = ["demo-upstream"]
sharing = "leased"
"""
    )
    with gatehouse.Gateway(cfg, gatehouse_exe=gatehouse_bin()) as gw:
        with gw.register("agent-up", tools=["helpdesk.*", whoami("u")], label="run-up") as reg:
            assert "helpdesk.open_case" in reg.tools and "whoami_u" in reg.tools

            async def go() -> None:
                async with session("streamable", reg) as s:
                    names = [t.name for t in (await s.list_tools()).tools]
                    assert names == sorted(reg.tools)
                    r = await s.call_tool("helpdesk.open_case", {"title": "printer"})
                    assert not r.is_error, text_of(r)

            anyio.run(go)
        with pytest.raises(gatehouse.UnknownGrant, match="nosuch"):
            gw.register("agent-up", tools=["nosuch.*"])
        with pytest.raises(gatehouse.UnknownGrant, match="helpdesk"):
            gw.register("agent-up", tools=["helpdesk.no_such_tool"])
    calls = [
        r for r in audit_records(tmp_path / "audit.jsonl") if r.get("event") == "governed_mcp_call"
    ]
    assert calls and calls[0]["agent_id"] == "agent-up" and calls[0]["upstream"] == "helpdesk"


# ---------------------------------------------------------------- typed errors


def test_typed_errors_say_what_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(gatehouse.BadConfig, match="unknown field"):
        gatehouse.Gateway(config_toml='listen = "127.0.0.1:0"\nlisen = 1\n')
    with pytest.raises(gatehouse.BadConfig, match="cannot read"):
        gatehouse.Gateway(tmp_path / "missing.toml")
    with pytest.raises(gatehouse.BadConfig, match="listen"):
        gatehouse.Gateway(listen="not an address")
    cfg = tmp_path / "self.toml"
    cfg.write_text('[[upstreams]]\nid = "h"\ncommand = "@self"\n')
    import os

    env_path = os.environ.pop("PATH", "")
    env_self = os.environ.pop("GATEHOUSE_SELF_EXE", None)
    # Nor the installed package's own `gatehouse` command (test_wheel.py uses that one).
    from gatehouse import _cli

    monkeypatch.setattr(_cli.sysconfig, "get_path", lambda *a, **k: str(tmp_path))
    try:
        with pytest.raises(gatehouse.BadConfig, match="GATEHOUSE_SELF_EXE"):
            gatehouse.Gateway(cfg)
    finally:
        os.environ["PATH"] = env_path
        if env_self is not None:
            os.environ["GATEHOUSE_SELF_EXE"] = env_self
    gw = gatehouse.Gateway(audit_path=tmp_path / "a.jsonl", linger_ms=0)
    with pytest.raises(gatehouse.UnknownGrant, match="pass a @gatehouse.tool|Pass a @gatehouse.tool"):
        gw.register("agent-e", tools=["lookup"])
    with pytest.raises(gatehouse.UnknownGrant, match="bad grant"):
        gw.register("agent-e", tools=["a*b"])
    with pytest.raises(gatehouse.RegistrationError, match="agent_id"):
        gw.register("  ", tools=[whoami("e")])
    with pytest.raises(gatehouse.RegistrationError, match="limits"):
        gw.register("agent-e", tools=[whoami("e")], limits={"max_callz": 1})
    assert isinstance(gatehouse.UnknownGrant("x"), ValueError)
    gw.close()
    with pytest.raises(gatehouse.GatewayStopped, match="create a new gatehouse.Gateway"):
        gw.register("agent-e", tools=[whoami("e")])
    other = gatehouse.Gateway(listen="127.0.0.1:0", audit_path=tmp_path / "b.jsonl")
    with other.register("agent-port", tools=[whoami("p")]):
        taken = other.local_addr
        clash = gatehouse.Gateway(listen=taken, audit_path=tmp_path / "c.jsonl")
        with pytest.raises(gatehouse.BindError, match="listen="):
            clash.register("agent-clash", tools=[whoami("c")])
        clash.close()
    other.close()


async def test_limits_and_ttl(gw: gatehouse.Gateway) -> None:
    with gw.register("agent-l", tools=[whoami("l")], limits={"max_calls": 2}, ttl_s=60) as reg:
        assert reg.expires_at is not None
        assert reg.renew(120) is not None
        async with session("streamable", reg) as s:
            assert not (await s.call_tool("whoami_l", {})).is_error
            assert not (await s.call_tool("whoami_l", {})).is_error
            r = await s.call_tool("whoami_l", {})
            assert r.is_error and "max_calls" in text_of(r)
