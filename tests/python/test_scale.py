"""1,000 sequential registrations in one process, each with its own Python tool: each lists
only its own tool, calls it, is released and then answers 404. The SDK client (both
transports) checks the 1st, the 500th and the 1000th; plain JSON-RPC over HTTP checks all."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

import gatehouse
from conftest import TRANSPORTS, session, text_of

COUNT = 1000


def tool_for(i: int) -> gatehouse.Tool:
    @gatehouse.tool(name=f"whoami_{i}")
    def whoami(ctx: gatehouse.CallContext) -> str:
        return f"{i}:{ctx.agent_id}"

    return whoami


class Rpc:
    """Streamable HTTP by hand, on one keep-alive connection per registration."""

    def __init__(self, conn: http.client.HTTPConnection, reg: Any) -> None:
        self.conn, self.reg, self.sid, self.n = conn, reg, None, 0
        self.path = urlsplit(reg.mcp_url).path

    def post(self, method: str, params: Any = None, notify: bool = False) -> tuple[int, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            self.n += 1
            msg["id"] = self.n
        headers = {
            "Authorization": f"Bearer {self.reg.token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
        self.conn.request("POST", self.path, json.dumps(msg), headers)
        resp = self.conn.getresponse()
        body = resp.read().decode()
        self.sid = resp.getheader("Mcp-Session-Id") or self.sid
        if not body.strip():
            return resp.status, None
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
            return resp.status, json.loads(data[-1])
        return resp.status, json.loads(body)


def test_1000_sequential_registrations(tmp_path: Path) -> None:
    gw = gatehouse.Gateway(audit_path=tmp_path / "audit.jsonl")
    t0 = time.monotonic()
    for i in range(1, COUNT + 1):
        with gw.register(f"agent-{i}", tools=[tool_for(i)]) as reg:
            u = urlsplit(reg.mcp_url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            rpc = Rpc(conn, reg)
            status, init = rpc.post("initialize", {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "scale", "version": "1"},
            })
            assert status == 200 and "result" in init, (i, status, init)
            assert rpc.post("notifications/initialized", notify=True)[0] == 202
            _, listed = rpc.post("tools/list")
            assert [t["name"] for t in listed["result"]["tools"]] == [f"whoami_{i}"], i
            _, called = rpc.post("tools/call", {"name": f"whoami_{i}", "arguments": {}})
            assert called["result"]["content"][0]["text"] == f"{i}:agent-{i}", (i, called)
            if i in (1, COUNT // 2, COUNT):
                for transport in TRANSPORTS:

                    async def sdk() -> None:
                        async with session(transport, reg) as s:
                            names = [t.name for t in (await s.list_tools()).tools]
                            assert names == [f"whoami_{i}"]
                            assert text_of(await s.call_tool(f"whoami_{i}", {})) == f"{i}:agent-{i}"

                    anyio.run(sdk)
        conn.close()
        rpc = Rpc(http.client.HTTPConnection(u.hostname, u.port, timeout=10), reg)
        status, _ = rpc.post("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "scale", "version": "1"},
        })
        assert status == 404, (i, status)
        rpc.conn.close()
    elapsed = time.monotonic() - t0
    assert gw.server_starts == 1
    gw.close()
    print(f"{COUNT} registrations in {elapsed:.1f}s")
