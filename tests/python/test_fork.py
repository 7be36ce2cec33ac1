"""Fork detection: a forked child never serves its parent's socket; the parent keeps serving,
and once the parent's server stops its port refuses connections (no child holds it open)."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import anyio

import gatehouse
from conftest import INIT, http_status, listening_sockets, session, text_of


def sockets_on_port(port: int) -> int:
    n = 0
    for fd in (int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=fd)
            try:
                name = s.getsockname()
            finally:
                s.detach()
            if isinstance(name, tuple) and name[1] == port:
                n += 1
        except OSError:
            continue
    return n


@gatehouse.tool
def hello(ctx: gatehouse.CallContext) -> str:
    return f"hello {ctx.agent_id} from {os.getpid()}"


def test_forked_child_never_serves_the_parents_socket(tmp_path: Path) -> None:
    gw = gatehouse.Gateway(audit_path=tmp_path / "parent.jsonl", linger_ms=0)
    reg = gw.register("agent-parent", tools=[hello])
    host, port_s = gw.local_addr.rsplit(":", 1)
    port = int(port_s)

    async def call() -> str:
        async with session("sse", reg) as s:  # keeps an accepted connection open across fork
            return text_of(await s.call_tool("hello", {}))

    assert text_of_pid(anyio.run(call)) == os.getpid()
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            os.close(go_w)
            out: dict = {"serving": gw.serving, "sockets_on_port": sockets_on_port(port)}
            for name, op in (
                ("register", lambda: gw.register("agent-child", tools=[hello])),
                ("release", reg.release),
            ):
                try:
                    op()
                    out[name] = "no error"
                except gatehouse.GatewayStopped as e:
                    out[name] = str(e)
            child_gw = gatehouse.Gateway(audit_path=tmp_path / "child.jsonl", linger_ms=0)
            with child_gw.register("agent-child", tools=[hello]) as creg:
                out["child_own_port"] = child_gw.local_addr != gw_addr(host, port)
                out["child_status"] = http_status("POST", creg.mcp_url, creg.token, INIT)
            child_gw.close()
            os.write(w, json.dumps(out).encode())
            os.close(w)
            os.read(go_r, 1)  # stay alive until the parent has checked its port
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    os.close(go_r)
    raw = b""
    while chunk := os.read(r, 65536):
        raw += chunk
    os.close(r)
    child = json.loads(raw)
    assert child["serving"] is False
    assert child["sockets_on_port"] == 0, "the child kept the parent's sockets"
    assert "is a fork of it" in child["register"] and "Create a new gatehouse.Gateway" in child["register"]
    assert "is a fork of it" in child["release"]
    assert child["child_own_port"] is True and child["child_status"] == 200
    # The parent still serves its registration, the child is alive.
    assert text_of_pid(anyio.run(call)) == os.getpid()
    reg.release()
    deadline = time.monotonic() + 5
    # `serving` turns False when the stop is signalled; the listener's task drops the socket a
    # moment later (as test_embedded's lazy-server test waits for both).
    while (gw.serving or listening_sockets()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gw.serving and listening_sockets() == []
    t0 = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=3).close()
        refused = False
    except ConnectionRefusedError:
        refused = True
    assert refused, "the port still accepts connections after the parent's server stopped"
    assert time.monotonic() - t0 < 1
    os.write(go_w, b"x")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    gw.close()


def gw_addr(host: str, port: int) -> str:
    return f"{host}:{port}"


def text_of_pid(text: str) -> int:
    return int(text.rsplit(" ", 1)[1])
