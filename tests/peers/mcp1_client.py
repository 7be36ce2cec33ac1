"""A client built on the official Python SDK 1.x (mcp<2, tests/peers/.venv-mcp1).

    .venv-mcp1/bin/python mcp1_client.py --transport {sse,streamable} --url URL --token T \
        [--call TOOL [--args JSON]] [--progress] [--timeout S]

Prints one JSON line: {"transport", "protocol_version", "tools", "call", "progress": [[progress,
total, message], ...], "logs": [data, ...]} and exits 0; on failure exits 1 with
"mcp1_client: error: ..." on stderr. Logs are those received during the session, in order.
"""

import argparse
import asyncio
import json
import sys
import threading

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


def main():
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
