"""A 2026-07-28 tasks (SEP-2663) client on fastmcp 4 + fastmcp-tasks (tests/peers/.venv-fastmcp-tasks).

    .venv-fastmcp-tasks/bin/python tasks2026_client.py --batch JSON

JSON is a list of cells {"url", "token", "tool", "args", "mode": "task"|"plain",
"cancel_after"?: seconds, "timeout"?: seconds (default 30)}. Each cell is one fastmcp
`Client(url, auth=BearerAuth(token))` (Streamable HTTP; it probes `server/discover` and settles
on 2026-07-28; importing fastmcp_tasks registers the tasks extension on every Client, so every
request's `_meta` clientCapabilities declare `io.modelcontextprotocol/tasks`).

mode "task": `fastmcp_tasks.call_tool_task(client, tool, args, raise_on_error=False)` returns a
`ToolTask` (the server's `resultType: "task"` answer); the cell then polls `ToolTask.status()`
(`tasks/get`) every 0.1 s until a terminal status, and takes the parsed result with
`ToolTask.result()`. With "cancel_after", it polls that many seconds, calls `ToolTask.cancel()`
(`tasks/cancel`), then `ToolTask.wait()` for a terminal status, then `result()`.
    {"ok": {"task_id", "created": {"status", "pollIntervalMs", "ttlMs"},
            "statuses": [status, ...] (every tasks/get answer, consecutive repeats collapsed),
            "cancel": "ok" | "<error>" | absent, "final": {"status", "statusMessage", "error"},
            "result": {"text", "isError", "structuredContent"} | null, "result_error": "..." | absent,
            "protocol_version"}}
mode "plain": `client.call_tool(tool, args, raise_on_error=False)` (a tool the server tasks is
driven to completion transparently by fastmcp_tasks' result claim).
    {"ok": {"result": {...} | null, "error": "..." | absent, "cancelled": bool, "protocol_version"}}
    With "cancel_after", the call's asyncio task is cancelled after that many seconds.
A cell that fails outright is {"error": "..."}. Every cell also has "requests": each HTTP request
the client made during it, as [method, path, Mcp-Method header or null, Mcp-Name header or null]
(recorded at httpx2.AsyncClient.send). Prints one JSON list; exit 0 whenever it was printed.
"""

import asyncio
import json
import os
import sys
import threading

import httpx2
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp_tasks import call_tool_task

TERMINAL = {"completed", "failed", "cancelled"}
REQUESTS = []


def record_http():
    """fastmcp's transports send through httpx2.AsyncClient.send: keep method, path, headers."""
    orig = httpx2.AsyncClient.send

    async def send(self, request, *a, **kw):
        h = request.headers
        REQUESTS.append([request.method, request.url.path, h.get("mcp-method"), h.get("mcp-name")])
        return await orig(self, request, *a, **kw)

    httpx2.AsyncClient.send = send


def describe(exc):
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(f"{type(e).__name__}: {describe(e)}" for e in exc.exceptions)
    return str(exc) or repr(exc)


def result_json(r):
    text = "".join(getattr(c, "text", "") for c in r.content)
    return {"text": text, "isError": bool(r.is_error),
            "structuredContent": getattr(r, "structured_content", None)}


async def run_task(client, cell, out):
    task = await call_tool_task(client, cell["tool"], cell.get("args", {}), raise_on_error=False)
    c = task.create_result
    out["task_id"] = task.task_id
    out["created"] = {"status": c.status, "pollIntervalMs": c.poll_interval_ms, "ttlMs": c.ttl_ms}
    statuses = out["statuses"] = []

    def saw(s):
        if not statuses or statuses[-1] != s:
            statuses.append(s)

    loop = asyncio.get_running_loop()
    cancel_at = None if cell.get("cancel_after") is None else loop.time() + float(cell["cancel_after"])
    while True:
        cur = await task.status()
        saw(cur.status)
        if cur.status in TERMINAL:
            break
        if cancel_at is not None and loop.time() >= cancel_at:
            try:
                await task.cancel()
                out["cancel"] = "ok"
            except Exception as e:  # noqa: BLE001 - what the client saw is the result
                out["cancel"] = f"{type(e).__name__}: {describe(e)}"
            cancel_at = None
            cur = await task.wait(timeout=10)
            saw(cur.status)
            break
        await asyncio.sleep(0.1)
    out["final"] = {"status": cur.status, "statusMessage": cur.status_message, "error": cur.error}
    try:
        out["result"] = result_json(await task.result())
    except Exception as e:  # noqa: BLE001
        out["result"] = None
        out["result_error"] = f"{type(e).__name__}: {describe(e)}"


async def run_plain(client, cell, out):
    call = asyncio.ensure_future(
        client.call_tool(cell["tool"], cell.get("args", {}), raise_on_error=False))
    out["cancelled"] = False
    out["result"] = None
    try:
        if cell.get("cancel_after") is not None:
            done, _ = await asyncio.wait({call}, timeout=float(cell["cancel_after"]))
            if not done:
                call.cancel()
                out["cancelled"] = True
                await asyncio.sleep(0.5)  # let the cancellation reach the wire
                return
        out["result"] = result_json(await call)
    except Exception as e:  # noqa: BLE001 - a JSON-RPC error is this cell's outcome
        out["error"] = f"{type(e).__name__}: {describe(e)}"


async def run_cell(cell):
    out = {}
    async with Client(cell["url"], auth=BearerAuth(cell["token"])) as client:
        if cell.get("mode", "task") == "task":
            await run_task(client, cell, out)
        else:
            await run_plain(client, cell, out)
        for attr in ("protocol_version", "negotiated_version"):
            v = getattr(client, attr, None)
            if isinstance(v, str):
                out["protocol_version"] = v
    return out


async def run_batch(cells):
    results = []
    for cell in cells:
        REQUESTS.clear()
        try:
            out = {"ok": await asyncio.wait_for(run_cell(cell), cell.get("timeout", 30))}
        except BaseException as e:  # noqa: BLE001 - each cell's failure is its result
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            out = {"error": f"{type(e).__name__}: {describe(e)}"}
        out["requests"] = list(REQUESTS)
        results.append(out)
    return results


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "--batch":
        sys.exit("usage: tasks2026_client.py --batch JSON")
    cells = json.loads(sys.argv[2])
    t = threading.Timer(sum(float(c.get("timeout", 30)) for c in cells) + 10, lambda: os._exit(1))
    t.daemon = True
    t.start()
    record_http()
    print(json.dumps(asyncio.run(run_batch(cells))), flush=True)


if __name__ == "__main__":
    main()
