"""How Python tools are run: sync tools on the gateway's own tool threads (persistent thread
states, at most `tool_threads`, gone after `close`), coroutine tools through their loop's port
(many calls at once, results, errors and a tool's own CancelledError reported), driven by the
official MCP Python SDK."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import anyio
import pytest

import gatehouse
from conftest import session, text_of

pytestmark = pytest.mark.anyio


def tool_threads() -> int:
    """This process's threads named like the gateway's sync-tool threads."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "gatehouse-py":
                    n += 1
        except OSError:
            continue
    return n


async def test_sync_tools_on_bounded_persistent_threads(audit_path: Path) -> None:
    gw = gatehouse.Gateway(audit_path=audit_path, linger_ms=0, tool_threads=2)
    local = threading.local()
    counts: list[int] = []
    gate = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    @gatehouse.tool
    def count() -> str:
        # A threading.local lives in the thread state: it survives between calls only if the
        # thread keeps its thread state (it did not when each call made a fresh one).
        local.n = getattr(local, "n", 0) + 1
        counts.append(local.n)
        return str(threading.get_ident())

    @gatehouse.tool
    def hold(i: int) -> str:
        with lock:
            started.append(i)
        gate.wait(20)
        return f"held {i}"

    try:
        with gw.register("agent-threads", tools=[count, hold]) as reg:
            async with session("streamable", reg) as s:
                idents = {text_of(await s.call_tool("count", {})) for _ in range(30)}
                assert len(idents) <= 2, idents
                assert max(counts) >= 15, counts  # one thread state served many calls
                assert 1 <= tool_threads() <= 2

                results: list[str] = []

                async def call(i: int) -> None:
                    results.append(text_of(await s.call_tool("hold", {"i": i})))

                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(call, i)
                    await anyio.sleep(0.8)
                    # tool_threads=2: two run, the third waits for a thread (no third thread).
                    assert len(started) == 2, started
                    assert tool_threads() == 2
                    gate.set()
                assert sorted(results) == ["held 0", "held 1", "held 2"]
                assert tool_threads() <= 2
    finally:
        gate.set()
        gw.close()
    deadline = time.monotonic() + 5
    while tool_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tool_threads() == 0, "the tool threads outlived Gateway.close()"


async def test_many_async_calls_at_once_through_the_loop_port(gw: gatehouse.Gateway) -> None:
    loops = set()

    @gatehouse.tool
    async def double(n: int) -> dict:
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0.01 * (n % 5))
        return {"n": n * 2}

    @gatehouse.tool
    async def fails(n: int) -> str:
        await asyncio.sleep(0)
        raise ValueError(f"no {n}")

    @gatehouse.tool
    async def cancels_itself() -> str:
        await asyncio.sleep(0)
        raise asyncio.CancelledError()

    mine = id(asyncio.get_running_loop())
    async with gw.register_async("agent-port", tools=[double, fails, cancels_itself]) as reg:
        async with session("streamable", reg) as s:
            results = await asyncio.gather(*(s.call_tool("double", {"n": i}) for i in range(100)))
            assert [r.structured_content["n"] for r in results] == [i * 2 for i in range(100)]
            errors = await asyncio.gather(*(s.call_tool("fails", {"n": i}) for i in range(20)))
            assert all(r.is_error for r in errors)
            assert sorted(text_of(r) for r in errors) == sorted(f"no {i}" for i in range(20))
            bad = await s.call_tool("double", {"n": "x"})
            assert bad.is_error and "expected integer" in text_of(bad)
            # A task that ends by its own CancelledError answers at once (no hang).
            with anyio.fail_after(5):
                r = await s.call_tool("cancels_itself", {})
            assert r.is_error and "cancelled" in text_of(r)
    assert loops == {mine}
