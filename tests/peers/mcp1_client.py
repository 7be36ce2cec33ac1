"""A client built on the official Python SDK 1.x (mcp<2, tests/peers/.venv-mcp1).

    .venv-mcp1/bin/python mcp1_client.py --transport {sse,streamable} --url URL --token T \
        [--call TOOL [--args JSON]] [--progress] [--timeout S]

Prints one JSON line: {"transport", "protocol_version", "tools", "call", "progress": [[progress,
total, message], ...], "logs": [data, ...]} and exits 0; on failure exits 1 with
"mcp1_client: error: ..." on stderr. Logs are those received during the session, in order.

    .venv-mcp1/bin/python mcp1_client.py --batch JSON

runs several cells in this one interpreter (see run_cell) and prints a JSON list, one
{"ok": {...}} or {"error": "..."} per cell, each with "requests": every HTTP request the
client made during the cell, as [method, path] (recorded at httpx.AsyncClient.send).
"""

import argparse
import asyncio
import json
import os
import sys
import threading

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client


async def run(args):
    headers = {"Authorization": f"Bearer {args.token}"}
    logs = []
    progress = []

    async def on_log(params):
        logs.append(params.data)

    async def on_progress(p, total, message):
        progress.append([p, total, message])

    async def session(read, write):
        async with ClientSession(read, write, logging_callback=on_log) as s:
            init = await s.initialize()
            tools = [t.name for t in (await s.list_tools()).tools]
            call = None
            if args.call:
                r = await s.call_tool(
                    args.call,
                    json.loads(args.args),
                    progress_callback=on_progress if args.progress else None,
                )
                call = r.model_dump(mode="json", exclude_none=True)
            return {
                "transport": args.transport,
                "protocol_version": str(init.protocolVersion),
                "tools": tools,
                "call": call,
                "progress": progress,
                "logs": logs,
            }

    if args.transport == "sse":
        async with sse_client(args.url, headers=headers) as (r, w):
            return await session(r, w)
    async with streamablehttp_client(args.url, headers=headers) as (r, w, _):
        return await session(r, w)


REQUESTS = []


def record_http():
    """Every HTTP request the SDK sends goes through httpx.AsyncClient.send: keep [method, path]."""
    orig = httpx.AsyncClient.send

    async def send(self, request, *a, **kw):
        REQUESTS.append([request.method, request.url.path])
        return await orig(self, request, *a, **kw)

    httpx.AsyncClient.send = send


def describe(exc):
    """Flatten exception groups so the real cause shows."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(f"{type(e).__name__}: {describe(e)}" for e in exc.exceptions)
    return str(exc) or repr(exc)


async def run_cell(cell):
    """--batch: one session over cell["transport"] (sse | streamable) at cell["url"]; lists
    tools, then runs cell["steps"] ({"name", "tool", "args", "sleep_before"}) in order, each
    recorded as {"ok": {"call", "asked_before"}} or {"error"}. Callbacks are declared only when
    the cell gives their answers: "sampling" (text), "elicit" (accepted content), "roots" (URIs).
    out["asked"]: the server -> client requests answered, in order."""
    headers = {"Authorization": f"Bearer {cell['token']}"}
    asked, logs = [], []
    kw = {}

    async def on_log(params):
        logs.append(params.data)

    kw["logging_callback"] = on_log
    if cell.get("sampling") is not None:
        async def on_sampling(context, params):
            asked.append("sampling")
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=cell["sampling"]),
                model="gatehouse-test-model", stopReason="endTurn")
        kw["sampling_callback"] = on_sampling
    if cell.get("elicit") is not None:
        async def on_elicit(context, params):
            asked.append("elicitation")
            return types.ElicitResult(action="accept", content=cell["elicit"])
        kw["elicitation_callback"] = on_elicit
    if cell.get("roots") is not None:
        async def on_roots(context):
            asked.append("roots")
            return types.ListRootsResult(roots=[types.Root(uri=u, name=f"root {i}") for i, u in enumerate(cell["roots"])])
        kw["list_roots_callback"] = on_roots

    async def session(read, write):
        async with ClientSession(read, write, **kw) as s:
            init = await s.initialize()
            out = {"transport": cell["transport"], "protocol_version": str(init.protocolVersion),
                   "tools": [t.name for t in (await s.list_tools()).tools], "steps": {}}
            for step in cell.get("steps", []):
                if step.get("sleep_before"):
                    await asyncio.sleep(float(step["sleep_before"]))
                before = list(asked)
                try:
                    r = await asyncio.wait_for(s.call_tool(step["tool"], step.get("args", {})), step.get("timeout", 20))
                    out["steps"][step["name"]] = {"ok": {"call": r.model_dump(mode="json", exclude_none=True),
                                                         "asked_before": before}}
                except Exception as e:  # noqa: BLE001 - a failed step does not stop the next
                    out["steps"][step["name"]] = {"error": f"{type(e).__name__}: {describe(e)}"}
            out["asked"] = asked
            out["logs"] = logs
            return out

    if cell["transport"] == "sse":
        async with sse_client(cell["url"], headers=headers) as (r, w):
            return await session(r, w)
    async with streamablehttp_client(cell["url"], headers=headers) as (r, w, _):
        return await session(r, w)


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
    if len(sys.argv) == 3 and sys.argv[1] == "--batch":
        cells = json.loads(sys.argv[2])
        t = threading.Timer(sum(float(c.get("timeout", 30)) for c in cells) + 10, lambda: os._exit(1))
        t.daemon = True
        t.start()
        record_http()
        print(json.dumps(asyncio.run(run_batch(cells))), flush=True)
        return
    p = argparse.ArgumentParser()
    p.add_argument("--transport", choices=["sse", "streamable"], required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--call")
    p.add_argument("--args", default="{}")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()

    def watchdog():
        print("mcp1_client: error: hard timeout", file=sys.stderr, flush=True)
        import os
        os._exit(1)

    t = threading.Timer(args.timeout + 5, watchdog)
    t.daemon = True
    t.start()
    try:
        out = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    except BaseException as e:  # noqa: BLE001 - report any failure as exit 1
        print(f"mcp1_client: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
