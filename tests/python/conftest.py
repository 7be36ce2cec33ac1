"""Fixtures of the Python package's tests: embedded gateways on 127.0.0.1:0, the official MCP
Python SDK as the client (legacy SSE and Streamable HTTP), and a real `gatehouse serve`.

The gatehouse binary is the one cargo built: $GATEHOUSE_BIN, else target/debug/gatehouse, else
target/release/gatehouse. A missing binary or SDK fails the test; nothing skips.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

import gatehouse

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ["sse", "streamable"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def gatehouse_bin() -> str:
    env = os.environ.get("GATEHOUSE_BIN")
    candidates = [Path(env)] if env else [
        ROOT / "target" / "debug" / "gatehouse",
        ROOT / "target" / "release" / "gatehouse",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    pytest.fail(f"the gatehouse binary is missing ({candidates}); run `cargo build` first")


@pytest.fixture
def audit_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


@pytest.fixture
def gw(audit_path: Path):
    g = gatehouse.Gateway(audit_path=audit_path, linger_ms=0)
    yield g
    g.close()


def audit_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def listening_sockets() -> list[tuple[str, int]]:
    """The TCP sockets this process holds that are listening."""
    out = []
    for fd in (int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=fd)
            try:
                if s.type == socket.SOCK_STREAM and s.getsockopt(
                    socket.SOL_SOCKET, socket.SO_ACCEPTCONN
                ):
                    out.append(s.getsockname()[:2])
            finally:
                s.detach()
        except OSError:
            continue
    return out


def http_status(method: str, url: str, token: str | None, body: Any = None) -> int:
    """One plain HTTP request (no client library) and its status."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json, text/event-stream")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


class Recorder:
    def __init__(self) -> None:
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.logs: list[tuple[str, Any]] = []

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))

    async def on_log(self, params: Any) -> None:
        self.logs.append((params.level, params.data))


@asynccontextmanager
async def session(transport: str, reg: Any, rec: Recorder | None = None) -> AsyncIterator[Any]:
    """An initialized `mcp.ClientSession` on `reg` over `transport` ("sse" or "streamable")."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {reg.token}"}
    kw: dict[str, Any] = {}
    if rec is not None:
        kw["logging_callback"] = rec.on_log
    async with AsyncExitStack() as stack:
        if transport == "sse":
            read, write = await stack.enter_async_context(
                sse_client(reg.sse_url, headers=headers, timeout=30.0)
            )
        else:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
            )
            read, write = await stack.enter_async_context(
                streamable_http_client(reg.mcp_url, http_client=http)
            )
        s = await stack.enter_async_context(ClientSession(read, write, **kw))
        await s.initialize()
        yield s


def text_of(result: Any) -> str:
    return "".join(getattr(b, "text", "") for b in result.content)


class Daemon:
    """A real `gatehouse serve` on ephemeral ports, stopped at teardown."""

    def __init__(self, tmp: Path, upstreams: str = "") -> None:
        self.config = tmp / "daemon.toml"
        self.token_file = tmp / "admin.token"
        self.config.write_text(
            f"""
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token_file = "{self.token_file}"
[audit]
path = "{tmp / 'daemon-audit.jsonl'}"
{upstreams}"""
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEHOUSE_")}
        self.proc = subprocess.Popen(
            [gatehouse_bin(), "serve", "--config", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.admin_url = ""
        deadline = time.monotonic() + 30
        assert self.proc.stderr is not None
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"admin listener on (http://\S+)", line)
            if m:
                self.admin_url = m.group(1)
            if "gatehouse: ready" in line:
                break
        if not self.admin_url:
            self.stop()
            pytest.fail("gatehouse serve did not start: " + "".join(lines))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(tmp_path)
    yield d
    d.stop()


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
