"""A client built on fastmcp 4.x (tests/peers/.venv-fastmcp).

    .venv-fastmcp/bin/python fastmcp_client.py --url URL --token T [--call TOOL [--args JSON]] \
        [--progress] [--sampling-reply TEXT] [--timeout S]

fastmcp picks the transport from the URL (/sse: legacy SSE; otherwise Streamable HTTP, where it
first probes `server/discover` and settles on 2026-07-28, stateless, if the server answers).
Prints one JSON line {"tools", "call", "progress": [[progress, total, message], ...],
"logs": [data, ...], "protocol_version"} and exits 0; on failure exits 1 with
"fastmcp_client: error: ..." on stderr.
"""

import argparse
import asyncio
import json
import sys
import threading

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


def main():
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
