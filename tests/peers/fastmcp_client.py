"""A client built on fastmcp 4.x (tests/peers/.venv-fastmcp).

    .venv-fastmcp/bin/python fastmcp_client.py --url URL --token T [--call TOOL [--args JSON]] \
        [--progress] [--sampling-reply TEXT] [--timeout S]

fastmcp picks the transport from the URL (/sse: legacy SSE; otherwise Streamable HTTP, where it
first probes `server/discover` and settles on 2026-07-28, stateless, if the server answers).
Prints one JSON line {"tools", "call", "progress": [[progress, total, message], ...],
"logs": [data, ...], "protocol_version"} and exits 0; on failure exits 1 with
"fastmcp_client: error: ..." on stderr.

    .venv-fastmcp/bin/python fastmcp_client.py --batch JSON

runs several cells in this one interpreter (see run_cell) and prints a JSON list, one
{"ok": {...}} or {"error": "..."} per cell, each with "requests": every HTTP request the
client made during the cell, as [method, path] (recorded at httpx2.AsyncClient.send).
"""

import argparse
import asyncio
import json
import sys
import os
import threading

import httpx2
from fastmcp import Client
from fastmcp.client.auth import BearerAuth


async def run(args):
    logs = []
    progress = []

    async def on_log(msg):
        logs.append(msg.data)

    async def on_progress(p, total, message):
        progress.append([p, total, message])

    extra = {}
    if args.sampling_reply is not None:
        # Answers sampling requests (on 2026-07-28 they come as MRTR inputRequests).
        async def on_sampling(messages, params, context):
            return args.sampling_reply

        extra["sampling_handler"] = on_sampling
    client = Client(args.url, auth=BearerAuth(args.token), log_handler=on_log, **extra)
    async with client:
        tools = [t.name for t in await client.list_tools()]
        call = None
        if args.call:
            r = await client.call_tool(
                args.call,
                json.loads(args.args),
                progress_handler=on_progress if args.progress else None,
                raise_on_error=False,
            )
            call = {
                "content": [c.model_dump(mode="json", exclude_none=True) for c in r.content],
                "isError": bool(r.is_error),
            }
        version = None
        for attr in ("protocol_version", "negotiated_version"):
            v = getattr(client, attr, None)
            if isinstance(v, str):
                version = v
        return {"tools": tools, "call": call, "progress": progress, "logs": logs,
                "protocol_version": version}


REQUESTS = []


def record_http():
    """fastmcp's transports send through httpx2.AsyncClient.send: keep [method, path]."""
    orig = httpx2.AsyncClient.send

    async def send(self, request, *a, **kw):
        REQUESTS.append([request.method, request.url.path])
        return await orig(self, request, *a, **kw)

    httpx2.AsyncClient.send = send


def describe(exc):
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(f"{type(e).__name__}: {describe(e)}" for e in exc.exceptions)
    return str(exc) or repr(exc)


async def run_cell(cell):
    """--batch: one Client on cell["url"] (the transport follows from the URL); lists tools,
    then runs cell["steps"] ({"name", "tool", "args", "sleep_before"}), each recorded as
    {"ok": {"call", "asked_before"}} or {"error"}. Handlers only when the cell gives their
    answers: "sampling" (text), "elicit" (accepted content), "roots" (URIs)."""
    asked, logs = [], []
    extra = {}

    async def on_log(msg):
        logs.append(msg.data)

    if cell.get("sampling") is not None:
        async def on_sampling(messages, params, context):
            asked.append("sampling")
            return cell["sampling"]
        extra["sampling_handler"] = on_sampling
    if cell.get("elicit") is not None:
        async def on_elicit(message, response_type, params, context):
            asked.append("elicitation")
            return cell["elicit"]
        extra["elicitation_handler"] = on_elicit
    if cell.get("roots") is not None:
        async def on_roots(context):
            asked.append("roots")
            return list(cell["roots"])
        extra["roots"] = on_roots
    client = Client(cell["url"], auth=BearerAuth(cell["token"]), log_handler=on_log, **extra)
    async with client:
        out = {"tools": [t.name for t in await client.list_tools()], "steps": {}}
        for step in cell.get("steps", []):
            if step.get("sleep_before"):
                await asyncio.sleep(float(step["sleep_before"]))
            before = list(asked)
            try:
                r = await asyncio.wait_for(
                    client.call_tool(step["tool"], step.get("args", {}), raise_on_error=False),
                    step.get("timeout", 20))
                out["steps"][step["name"]] = {"ok": {"call": {
                    "content": [c.model_dump(mode="json", exclude_none=True) for c in r.content],
                    "isError": bool(r.is_error)}, "asked_before": before}}
            except Exception as e:  # noqa: BLE001 - a failed step does not stop the next
                out["steps"][step["name"]] = {"error": f"{type(e).__name__}: {describe(e)}"}
        for attr in ("protocol_version", "negotiated_version"):
            v = getattr(client, attr, None)
            if isinstance(v, str):
                out["protocol_version"] = v
        out["asked"] = asked
        out["logs"] = logs
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
    if len(sys.argv) == 3 and sys.argv[1] == "--batch":
        cells = json.loads(sys.argv[2])
        t = threading.Timer(sum(float(c.get("timeout", 30)) for c in cells) + 10, lambda: os._exit(1))
        t.daemon = True
        t.start()
        record_http()
        print(json.dumps(asyncio.run(run_batch(cells))), flush=True)
        return
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--call")
    p.add_argument("--args", default="{}")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--sampling-reply", help="declare sampling and answer every request with this text")
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()

    def watchdog():
        print("fastmcp_client: error: hard timeout", file=sys.stderr, flush=True)
        import os
        os._exit(1)

    t = threading.Timer(args.timeout + 5, watchdog)
    t.daemon = True
    t.start()
    try:
        out = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    except BaseException as e:  # noqa: BLE001 - report any failure as exit 1
        print(f"fastmcp_client: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
