#!/usr/bin/env python3
"""The design gatehouse replaces: one Python process that starts its own uvicorn server and
the MCP SDK's `SseServerTransport` for every agent execution, sequentially, and reaches each
with the SDK's `sse_client`. Run it in its own venv with the versions the failure was
measured with (mcp 1.30.0, uvicorn 0.54.0, starlette 1.10.0, sse-starlette 3.4.11):

    bash demos/baseline-venv.sh --run [--count 7] [--gap 2]

Prints `gw N: OK`, `gw N: EMPTY(200)` (the SSE response ended right after its 200 headers,
without the `endpoint` event: the SDK client would wait until its timeout) or
`gw N: TIMEOUT`; exits 1 if any is not OK (the expected outcome: this is the failing design).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import anyio
import httpx
import mcp.types as types
import uvicorn
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

PROBE_TIMEOUT_S = 5.0


VERBOSE = False


def app_for(i: int) -> Starlette:
    server: Server = Server(f"execution-{i}")

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [types.Tool(name=f"whoami_{i}", description="Says which execution it is",
                           inputSchema={"type": "object", "properties": {}})]

    @server.call_tool()
    async def call_tool(name: str, arguments: dict) -> list[types.TextContent]:
        return [types.TextContent(type="text", text=f"gw {i} says hello")]

    sse = SseServerTransport("/messages/")

    async def handle_sse(request: Request) -> Response:
        async with sse.connect_sse(request.scope, request.receive, request._send) as (r, w):
            await server.run(r, w, server.create_initialization_options())
        return Response()

    return Starlette(routes=[
        Route("/sse", endpoint=handle_sse, methods=["GET"]),
        Mount("/messages/", app=sse.handle_post_message),
    ])


async def probe(url: str) -> str | None:
    """None if the stream's first event is `endpoint`; else the verdict. A stream that ends
    (cleanly or cut) after its headers and before any event is EMPTY(<status>)."""
    status = None
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
            async with http.stream("GET", url) as resp:
                status = resp.status_code
                with anyio.fail_after(PROBE_TIMEOUT_S):
                    async for line in resp.aiter_lines():
                        if line.startswith("event:") and "endpoint" in line:
                            return None
                return f"EMPTY({status})"
    except TimeoutError:
        return "TIMEOUT"
    except httpx.HTTPError as e:
        return f"EMPTY({status})" if status is not None else f"ERROR({type(e).__name__})"


async def one(i: int) -> str:
    config = uvicorn.Config(app_for(i), host="127.0.0.1", port=0, log_level="error" if VERBOSE else "critical")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                return "SERVER FAILED"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/sse"
        verdict = await probe(url)
        if verdict is not None:
            return verdict
        try:
            with anyio.fail_after(15):
                async with sse_client(url, timeout=5, sse_read_timeout=10) as (r, w):
                    async with ClientSession(r, w) as s:
                        await s.initialize()
                        names = [t.name for t in (await s.list_tools()).tools]
                        if names != [f"whoami_{i}"]:
                            return f"WRONG TOOLS {names}"
                        res = await s.call_tool(f"whoami_{i}", {})
                        text = "".join(getattr(b, "text", "") for b in res.content)
                        return "OK" if text == f"gw {i} says hello" else f"BAD CALL {text!r}"
        except TimeoutError:
            return "TIMEOUT"
    finally:
        server.should_exit = True
        await task


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between executions")
    ap.add_argument("--verbose", action="store_true", help="show uvicorn's errors (stderr)")
    args = ap.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    logging.basicConfig(level=logging.WARNING if VERBOSE else logging.CRITICAL)
    ok = 0
    for i in range(1, args.count + 1):
        if i > 1 and args.gap:
            await asyncio.sleep(args.gap)
        try:
            verdict = await one(i)
        except Exception as e:
            while isinstance(e, BaseExceptionGroup) and e.exceptions:
                e = e.exceptions[0]
            verdict = f"ERROR({type(e).__name__}: {e})"
        ok += verdict == "OK"
        print(f"gw {i}: {verdict}", flush=True)
    print(f"{ok}/{args.count} OK (a new uvicorn + SseServerTransport per execution)")
    return 0 if ok == args.count else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
