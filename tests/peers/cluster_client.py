#!/usr/bin/env python3
"""A long-running MCP client (official Python SDK, Streamable HTTP with initialize) for
tests/cluster.rs: it keeps calling one tool of one registration through a proxy, and when its
session breaks (the node holding it died: the proxy's other node answers 404, or the connection
fails) it initializes a new session and goes on, as the MCP spec asks of a client.

Usage:
    cluster_client.py --url URL --token TOKEN [--seconds S] [--interval-ms MS] [--tool NAME]

Prints one JSON line per event, flushed:
    {"event":"session","session":SID}                         a session opened
    {"event":"call","n":N,"ok":bool,"session":SID,"ms":F,"error":str|null}
    {"event":"broken","session":SID,"error":str}              the session broke; opening another
    {"event":"done","calls":N}
Every call and every initialize is bounded (5 s), so nothing hangs, and the loop ends after
--seconds. Exit 0 unless the script itself failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

STEP_SECONDS = 5.0


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def run(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        sid: dict[str, str | None] = {"v": None}

        async def on_response(response: httpx2.Response) -> None:
            v = response.headers.get("mcp-session-id")
            if v:
                sid["v"] = v

        try:
            async with httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {args.token}"},
                timeout=httpx2.Timeout(STEP_SECONDS),
                event_hooks={"response": [on_response]},
            ) as http:
                async with streamable_http_client(args.url, http_client=http, terminate_on_close=False) as (
                    read,
                    write,
                ):
                    async with ClientSession(read, write) as session:
                        with anyio.fail_after(STEP_SECONDS):
                            await session.initialize()
                        emit(event="session", session=sid["v"])
                        while time.monotonic() < deadline:
                            n += 1
                            t = time.monotonic()
                            try:
                                with anyio.fail_after(STEP_SECONDS):
                                    r = await session.call_tool(args.tool, {"text": str(n)})
                            except Exception as e:  # noqa: BLE001
                                emit(event="call", n=n, ok=False, session=sid["v"],
                                     ms=(time.monotonic() - t) * 1000, error=repr(e)[:300])
                                raise
                            emit(event="call", n=n, ok=not r.is_error, session=sid["v"],
                                 ms=(time.monotonic() - t) * 1000,
                                 error=None if not r.is_error else str(r.content)[:300])
                            await anyio.sleep(args.interval_ms / 1000)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001  (a broken session; ExceptionGroup included)
            emit(event="broken", session=sid["v"], error=repr(e)[:300])
            await anyio.sleep(0.05)
    emit(event="done", calls=n)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--tool", default="demo.echo")
    args = p.parse_args()
    try:
        anyio.run(run, args)
    except Exception as e:  # noqa: BLE001
        print(f"cluster_client: error: {e!r}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
