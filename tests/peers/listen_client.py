#!/usr/bin/env python3
"""A 2026-07-28 `subscriptions/listen` client on the official Python SDK 2.x (`mcp.Client.listen`).

Usage: listen_client.py --url URL --token TOKEN [--uri URI ...] [--events N]

Connects statelessly (mode 2026-07-28), listens with tools_list_changed=True and the given
resource subscriptions, prints one JSON line {"acked": <honored filter>} once acknowledged, then
one line {"event": <type>, "data": ...} per event. After N events it exits 0; when the stream
ends it prints {"ended": "graceful"} (the server's `complete` result) or {"ended": "lost"}.
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

warnings.filterwarnings("ignore")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.client.subscriptions import SubscriptionLost  # noqa: E402


def out(v):
    print(json.dumps(v, default=str), flush=True)


def dump(x):
    try:
        return x.model_dump(mode="json", by_alias=True, exclude_none=True)
    except AttributeError:
        return str(x)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--uri", action="append", default=[])
    ap.add_argument("--events", type=int, default=1)
    a = ap.parse_args()
    headers = {"Authorization": f"Bearer {a.token}"}
    with anyio.fail_after(60):
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
            async with Client(streamable_http_client(a.url, http_client=http), mode="2026-07-28") as client:
                async with client.listen(tools_list_changed=True, resource_subscriptions=a.uri) as sub:
                    out({"acked": dump(sub.honored), "protocol_version": client.protocol_version})
                    seen = 0
                    try:
                        async for ev in sub:
                            out({"event": type(ev).__name__, "data": dump(ev)})
                            seen += 1
                            if seen >= a.events:
                                return
                    except SubscriptionLost:
                        out({"ended": "lost"})
                        return
                    out({"ended": "graceful"})


if __name__ == "__main__":
    try:
        anyio.run(main)
    except Exception as e:  # noqa: BLE001
        print(f"listen_client: error: {e!r}", file=sys.stderr, flush=True)
        sys.exit(1)
