"""MCP tasks (2025-11-25) through the official Python SDK 1.x client (mcp<2,
tests/peers/.venv-mcp1): `session.experimental`.

    .venv-mcp1/bin/python tasks_client.py --batch JSON

Each cell {"transport": "sse"|"streamable", "url", "token", "tool", "args", "ttl"?,
"probe"?: [task ids]} runs in this one interpreter: initialize, call_tool_as_task, list_tasks,
poll_task until terminal (the statuses seen), get_task_result; then tasks/get of every id in
"probe" (another registration's, an unknown one: the error each gets). Prints a JSON list, one
{"ok": {...}} or {"error": "..."} per cell.
"""

import asyncio
import json
import sys

import mcp.types as types
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client


def describe(exc):
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


async def run_cell(cell):
    headers = {"Authorization": f"Bearer {cell['token']}"}

    async def session(read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out = {"protocol_version": str(init.protocolVersion),
                   "server_tasks": init.capabilities.model_dump(mode="json", exclude_none=True).get("tasks")}
            created = await s.experimental.call_tool_as_task(
                cell["tool"], cell.get("args", {}), ttl=cell.get("ttl", 60000))
            task_id = created.task.taskId
            out["created"] = created.model_dump(mode="json", exclude_none=True)
            out["listed"] = [t.taskId for t in (await s.experimental.list_tasks()).tasks]
            seen = []
            async for status in s.experimental.poll_task(task_id):
                if not seen or seen[-1] != status.status:
                    seen.append(status.status)
            out["statuses"] = seen
            result = await s.experimental.get_task_result(task_id, types.CallToolResult)
            out["result"] = result.model_dump(mode="json", exclude_none=True)
            out["final"] = (await s.experimental.get_task(task_id)).model_dump(mode="json", exclude_none=True)
            probes = {}
            for pid in cell.get("probe", []):
                try:
                    await s.experimental.get_task(pid)
                    probes[pid] = "answered"
                except Exception as e:  # noqa: BLE001 - the error is the answer
                    err = getattr(e, "error", None)
                    probes[pid] = {"code": getattr(err, "code", None), "message": getattr(err, "message", str(e))}
            out["probes"] = probes
            return out

    if cell["transport"] == "sse":
        async with sse_client(cell["url"], headers=headers) as (r, w):
            return await session(r, w)
    async with streamablehttp_client(cell["url"], headers=headers) as (r, w, _):
        return await session(r, w)


async def run_batch(cells):
    out = []
    for cell in cells:
        try:
            out.append({"ok": await asyncio.wait_for(run_cell(cell), cell.get("timeout", 60))})
        except BaseException as e:  # noqa: BLE001 - reported per cell
            out.append({"error": describe(e)})
    return out


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "--batch":
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(json.dumps(asyncio.run(run_batch(json.loads(sys.argv[2])))))


if __name__ == "__main__":
    main()
