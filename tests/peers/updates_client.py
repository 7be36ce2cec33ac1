#!/usr/bin/env python3
"""Resource updates and out-of-call logs from server-everything through gatehouse, on the official
Python SDK 2.x or 1.x (issue 18 items 2, 3 and 5 with real clients and a real upstream).

Usage: updates_client.py --transport {sse,streamable,listen} --url URL --token TOKEN --uri URI
                         [--prefix everything.] [--seconds 20]

sse / streamable (handshake era): initialize, `resources/subscribe` URI, call
`<prefix>toggle-simulated-logging` and `<prefix>toggle-subscriber-updates` (server-everything
then sends, every 5 s and outside any call, a log and `notifications/resources/updated` for
each subscribed URI); count both until each was seen once or SECONDS pass.
listen (2026-07-28, stateless): `mcp.Client` in mode 2026-07-28 calls the toggle, then
`client.listen(resource_subscriptions=[URI])`; count the update events (logs never go on a
listen stream).
Prints one JSON object: {"transport", "protocol_version", "honored", "updated": n,
"updated_uris": [...], "logs": n, "first_update_s": s|null}. Exit 1 on an error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import anyio  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

try:  # the SDK 2.x: its own httpx fork and types package, and the high-level Client
    import httpx2  # noqa: E402
    import mcp_types as types  # noqa: E402
    from mcp import Client  # noqa: E402
except ImportError:  # the SDK 1.x (tests/peers/.venv-mcp1): sse and streamable only
    import httpx as httpx2  # noqa: E402
    import mcp.types as types  # noqa: E402
    Client = None


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", required=True, choices=["sse", "streamable", "listen"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--uri", required=True)
    ap.add_argument("--prefix", default="everything.")
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    headers = {"Authorization": f"Bearer {a.token}"}
    out = {"transport": a.transport, "honored": None, "updated": 0, "updated_uris": [], "logs": 0,
           "first_update_s": None}
    t0 = time.monotonic()
    done = anyio.Event()

    def on_update(uri: str) -> None:
        out["updated"] += 1
        out["updated_uris"].append(uri)
        if out["first_update_s"] is None:
            out["first_update_s"] = round(time.monotonic() - t0, 2)
        if a.transport == "listen" or out["logs"]:
            done.set()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        out["logs"] += 1
        if out["updated"]:
            done.set()

    async def on_message(msg) -> None:  # noqa: ANN001
        root = getattr(msg, "root", msg)
        if isinstance(root, types.ResourceUpdatedNotification):
            on_update(str(root.params.uri))

    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        if a.transport == "listen":
            async with Client(streamable_http_client(a.url, http_client=http), mode="2026-07-28") as client:
                out["protocol_version"] = client.protocol_version
                await client.call_tool(f"{a.prefix}toggle-subscriber-updates", {})
                async with client.listen(resource_subscriptions=[a.uri]) as sub:
                    out["honored"] = sub.honored.model_dump(mode="json", by_alias=True, exclude_none=True)
                    with anyio.move_on_after(a.seconds):
                        async for ev in sub:
                            uri = getattr(ev, "uri", None)
                            on_update(str(uri) if uri is not None else repr(ev))
                            break
        else:
            transport = (sse_client(a.url.replace("/mcp", "/sse"), headers=headers) if a.transport == "sse"
                         else streamable_http_client(a.url, http_client=http))
            async with transport as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write, logging_callback=on_log, message_handler=on_message) as s:
                    init = await s.initialize()
                    out["protocol_version"] = getattr(init, "protocol_version", None) or init.protocolVersion
                    await s.subscribe_resource(a.uri)
                    await s.call_tool(f"{a.prefix}toggle-simulated-logging", {})
                    await s.call_tool(f"{a.prefix}toggle-subscriber-updates", {})
                    with anyio.move_on_after(a.seconds):
                        await done.wait()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as e:  # noqa: BLE001
        print(f"updates_client: error: {e!r}", file=sys.stderr, flush=True)
        sys.exit(1)
