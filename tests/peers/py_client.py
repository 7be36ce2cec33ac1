#!/usr/bin/env python3
"""An MCP client built on the official Python SDK (mcp 2.x), driven by gatehouse's tests.

Usage:
    py_client.py --transport {sse,streamable,client} --url URL --token TOKEN
                 [--call TOOL [--args JSON]] [--progress] [--cancel-after SECONDS]
                 [--mode {auto,legacy,2026-07-28}] [--timeout SECONDS]

Transports:
    sse         mcp.client.sse.sse_client (legacy HTTP+SSE, 2024-11-05) + ClientSession.initialize()
    streamable  mcp.client.streamable_http.streamable_http_client + ClientSession.initialize()
                (handshake-era Streamable HTTP)
    client      the high-level mcp.Client over streamable_http_client; --mode auto (default) probes
                `server/discover` (2026-07-28, stateless) and falls back to `initialize`.

Every HTTP request carries `Authorization: Bearer TOKEN`.

It connects, lists tools, optionally calls one tool, and prints ONE JSON object on stdout:
    {"transport":..., "protocol_version":..., "server_name":..., "tools":[names],
     "call": {"content":[...], "isError":bool, "structuredContent":...} | null,
     "progress": [{"progress":..,"total":..,"message":..}, ...],
     "logs": [{"level":..,"logger":..,"data":..}, ...],
     "cancelled": bool}
Exit 0 on success; 1 with the error on stderr otherwise (nothing on stdout). A hard overall
timeout (default 30 s) makes sure it never hangs a test.

--cancel-after S cancels the running call after S seconds by cancelling the task that awaits it.
The SDK then sends `notifications/cancelled` {requestId, reason: "caller cancelled"} on the
handshake-era transports, or aborts the request's POST (closes the response stream) on a
2026-07-28 connection. "call" is then null and "cancelled" true; if the call finishes first,
"cancelled" is false and "call" holds its result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
import warnings
from contextlib import AsyncExitStack
from typing import Any

warnings.filterwarnings("ignore")  # the SDK flags logging/sampling as deprecated for 2026-07-28

import anyio  # noqa: E402
import httpx2  # noqa: E402  (mcp 2.x ships its own fork of httpx under this name)
import mcp_types as types  # noqa: E402
from mcp import Client, ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

CLIENT_INFO = types.Implementation(name="gatehouse-py-client", version="1.0.0")
CANCEL_FLUSH_SECONDS = 0.5  # let the courtesy notifications/cancelled reach the wire before closing


def fail(message: str) -> None:
    print(f"py_client: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def start_watchdog(seconds: float) -> None:
    """Last-resort timeout that fires even if the event loop is wedged."""
    timer = threading.Timer(seconds, fail, args=(f"hard timeout after {seconds:.0f}s",))
    timer.daemon = True
    timer.start()


class Recorder:
    def __init__(self, roots: list[str] | None = None, elicit: dict[str, Any] | None = None) -> None:
        self.progress: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []
        # Server -> client requests answered, in order ("sampling", "elicitation", "roots").
        self.asked: list[str] = []
        self.roots = roots
        self.elicit = elicit if elicit is not None else {"username": "testuser", "email": "test@example.com"}

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append({"progress": progress, "total": total, "message": message})

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append({"level": params.level, "logger": params.logger, "data": params.data})

    async def on_sampling(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="This is a test response from the client"),
            model="gatehouse-test-model",
            stop_reason="endTurn",
        )

    async def on_elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append("elicitation")
        return types.ElicitResult(action="accept", content=self.elicit)

    async def on_list_roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri=u, name=f"root {i}") for i, u in enumerate(self.roots or [])])


def dump_call_result(result: types.CallToolResult) -> dict[str, Any]:
    return {
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content],
        "isError": bool(result.is_error),
        "structuredContent": result.structured_content,
    }


async def list_all_tools(lister: Any) -> list[str]:
    names: list[str] = []
    cursor: str | None = None
    for _ in range(100):
        if cursor is None:
            page = await lister()
        else:
            page = await lister(params=types.PaginatedRequestParams(cursor=cursor))
        names.extend(tool.name for tool in page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return names


def make_callbacks(rec: Recorder) -> dict[str, Any]:
    callbacks: dict[str, Any] = dict(
        sampling_callback=rec.on_sampling,
        elicitation_callback=rec.on_elicitation,
        logging_callback=rec.on_log,
        client_info=CLIENT_INFO,
    )
    if rec.roots is not None:  # declares `roots` only then
        callbacks["list_roots_callback"] = rec.on_list_roots
    return callbacks


async def open_session(
    stack: AsyncExitStack, transport: str, url: str, token: str, mode: str, rec: Recorder, out: dict[str, Any]
) -> Any:
    """Connect, handshake (or discover) and list tools; fills out[protocol_version, server_name, tools]."""
    headers = {"Authorization": f"Bearer {token}"}
    callbacks = make_callbacks(rec)
    if transport == "client":
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
        )
        client = Client(
            streamable_http_client(url, http_client=http),
            mode=mode,
            log_level="debug",  # opt in to notifications/message on 2026-07-28 connections
            **callbacks,
        )
        client = await stack.enter_async_context(client)
        out["protocol_version"] = client.protocol_version
        out["server_name"] = client.server_info.name if client.server_info else None
        out["tools"] = await list_all_tools(client.session.list_tools)
        return client
    if transport == "sse":
        read, write = await stack.enter_async_context(sse_client(url, headers=headers, timeout=30.0))
    else:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
        )
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
    session = await stack.enter_async_context(ClientSession(read, write, **callbacks))
    init = await session.initialize()
    out["protocol_version"] = init.protocol_version
    out["server_name"] = init.server_info.name
    out["tools"] = await list_all_tools(session.list_tools)
    return session


async def call_tool(
    session: Any, rec: Recorder, tool: str, call_args: Any, progress: bool, cancel_after: float | None
) -> dict[str, Any]:
    """One tools/call; returns {"call": result | None, "cancelled": bool}."""
    if not isinstance(call_args, dict):
        raise ValueError("tool arguments must be a JSON object")
    progress_cb = rec.on_progress if progress else None
    out: dict[str, Any] = {"call": None, "cancelled": False}
    if cancel_after is not None:
        with anyio.move_on_after(cancel_after) as scope:
            result = await session.call_tool(tool, call_args, progress_callback=progress_cb)
        if scope.cancelled_caught:
            out["cancelled"] = True
            await anyio.sleep(CANCEL_FLUSH_SECONDS)
        else:
            out["call"] = dump_call_result(result)
    else:
        result = await session.call_tool(tool, call_args, progress_callback=progress_cb)
        out["call"] = dump_call_result(result)
    await anyio.sleep(0.05)  # let trailing notifications (logs, progress) be dispatched
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rec = Recorder()
    out: dict[str, Any] = {"transport": args.transport}
    async with AsyncExitStack() as stack:
        session = await open_session(stack, args.transport, args.url, args.token, args.mode, rec, out)
        out["call"] = None
        out["cancelled"] = False
        if args.call:
            call_args = json.loads(args.args) if args.args else {}
            out.update(await call_tool(session, rec, args.call, call_args, args.progress, args.cancel_after))
        out["progress"] = rec.progress
        out["logs"] = rec.logs
    return out


async def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """--batch: one connection, then each step in `cell["steps"]` in order, each step's outcome
    recorded separately ({"ok": ...} or {"error": ...}); a failed step does not stop the next.
    `cell["roots"]` (a list of URIs) adds a list_roots_callback (the client declares `roots`);
    `cell["elicit"]` is the content an accepted elicitation answers; out["asked"] lists the
    server -> client requests the callbacks answered, and each step's "asked_before" those
    answered before it started (after its optional "sleep_before" seconds)."""
    rec = Recorder(cell.get("roots"), cell.get("elicit"))
    out: dict[str, Any] = {"transport": cell["transport"], "steps": {}}
    async with AsyncExitStack() as stack:
        session = await open_session(
            stack, cell["transport"], cell["url"], cell["token"], cell.get("mode", "auto"), rec, out
        )
        for step in cell.get("steps", []):
            rec.progress = []
            if step.get("sleep_before"):
                await anyio.sleep(float(step["sleep_before"]))
            asked_before = list(rec.asked)
            try:
                with anyio.fail_after(step.get("timeout", 20)):
                    r = await call_tool(
                        session,
                        rec,
                        step["tool"],
                        step.get("args", {}),
                        bool(step.get("progress")),
                        step.get("cancel_after"),
                    )
                r["progress"] = rec.progress
                r["asked_before"] = asked_before
                out["steps"][step["name"]] = {"ok": r}
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise
                out["steps"][step["name"]] = {"error": f"{type(exc).__name__}: {describe(exc)}"}
        out["logs"] = rec.logs
        out["asked"] = rec.asked
    return out


REQUESTS: list[list[str]] = []


def record_http() -> None:
    """--batch: every HTTP request the SDK sends goes through httpx2.AsyncClient.send; each
    cell's result gets "requests", its [method, path] list (which paths the client tried)."""
    orig = httpx2.AsyncClient.send

    async def send(self: Any, request: Any, *a: Any, **kw: Any) -> Any:
        REQUESTS.append([request.method, request.url.path])
        return await orig(self, request, *a, **kw)

    httpx2.AsyncClient.send = send  # type: ignore[method-assign]


async def run_batch(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs the cells one after another in this interpreter (saves its start-up per cell)."""
    results: list[dict[str, Any]] = []
    for cell in cells:
        REQUESTS.clear()
        try:
            with anyio.fail_after(cell.get("timeout", 30)):
                res: dict[str, Any] = {"ok": await run_cell(cell)}
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            res = {"error": f"{type(exc).__name__}: {describe(exc)}"}
        res["requests"] = list(REQUESTS)
        results.append(res)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=["sse", "streamable", "client"])
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--call", default=None, help="tool to call after tools/list")
    parser.add_argument("--args", default="{}", help="JSON object of tool arguments")
    parser.add_argument("--progress", action="store_true", help="ask for progress (progressToken) and record it")
    parser.add_argument("--cancel-after", type=float, default=None, help="cancel the call after SECONDS")
    parser.add_argument("--mode", default="auto", help="--transport client only: auto | legacy | 2026-07-28")
    parser.add_argument("--timeout", type=float, default=30.0, help="hard overall timeout in seconds")
    parser.add_argument("--batch", default=None, help="JSON list of cells (see run_cell); prints a JSON list")
    args = parser.parse_args()

    if args.batch is not None:
        cells = json.loads(args.batch)
        start_watchdog(sum(float(c.get("timeout", 30)) for c in cells) + 10)
        record_http()
        print(json.dumps(anyio.run(run_batch, cells)), flush=True)
        sys.exit(0)
    if not (args.transport and args.url and args.token is not None):
        parser.error("--transport, --url and --token are required (unless --batch)")
    start_watchdog(args.timeout + 5)

    async def guarded() -> dict[str, Any]:
        with anyio.fail_after(args.timeout):
            return await run(args)

    try:
        out = anyio.run(guarded)
    except TimeoutError:
        fail(f"timed out after {args.timeout:.0f}s")
    except BaseException as exc:  # noqa: BLE001 (report everything, including ExceptionGroups)
        detail = "".join(traceback.format_exception(exc)) if os.environ.get("PY_CLIENT_DEBUG") else ""
        fail(f"{type(exc).__name__}: {describe(exc)}\n{detail}".rstrip())
    print(json.dumps(out), flush=True)
    sys.exit(0)


def describe(exc: BaseException) -> str:
    """Flatten exception groups so the real cause shows up on stderr."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(f"{type(e).__name__}: {describe(e)}" for e in exc.exceptions)
    return str(exc) or repr(exc)


if __name__ == "__main__":
    main()
