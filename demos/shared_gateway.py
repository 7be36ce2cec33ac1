#!/usr/bin/env python3
"""Seven (or --count N) sequential agent executions in one Python process, sharing one
embedded gatehouse. Each has its own Python tool, is reached by the official MCP Python SDK's
`sse_client` (the client of the harness that failed with a server per execution), lists only
its own tool, calls it, is released, and its path then answers 404. Before the agent connects,
the seed's health probe is one call (`reg.probe_async()`: an MCP round trip with the
registration's token, its tools against its grant, within 5 s); after the release the probe
says `released`.

    python demos/shared_gateway.py [--count 1000] [--quiet]

Prints `gw N: OK` per execution; exits 1 if any is not OK. Needs `pip install ./bindings/python`
and the `mcp` SDK (tests/peers/.venv has both after `bash tests/run.sh`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

import gatehouse
from mcp import ClientSession
from mcp.client.sse import sse_client

PER_EXECUTION_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 5.0


def tool_for(i: int) -> gatehouse.Tool:
    @gatehouse.tool(name=f"whoami_{i}", description="Says which execution it belongs to")
    def whoami(text: str, ctx: gatehouse.CallContext) -> str:
        return f"gw {i} ({ctx.agent_id}) says {text}"

    return whoami


def status_of(url: str, token: str) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def one(gw: gatehouse.Gateway, i: int) -> str:
    async with gw.register_async(f"demo-agent-{i}", tools=[tool_for(i)], label=f"run-{i}") as reg:
        # The seed's probe: "connect and list tools within N seconds", as one call.
        p = await reg.probe_async(timeout=PROBE_TIMEOUT_S, check=False)
        if not (p["ok"] and p["tools"]["equal"]):
            return f"PROBE {p['failure'] or p['tools']}"
        headers = {"Authorization": f"Bearer {reg.token}"}
        async with sse_client(reg.sse_url, headers=headers, timeout=10.0) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                names = [t.name for t in (await s.list_tools()).tools]
                if names != [f"whoami_{i}"]:
                    return f"WRONG TOOLS {names}"
                r = await s.call_tool(f"whoami_{i}", {"text": "hello"})
                text = "".join(getattr(b, "text", "") for b in r.content)
                if r.is_error or text != f"gw {i} (demo-agent-{i}) says hello":
                    return f"BAD CALL {text!r}"
        sse_url, token = reg.sse_url, reg.token
    code = await asyncio.to_thread(status_of, sse_url, token)
    if code != 404:
        return f"NOT RELEASED({code})"
    p = await reg.probe_async(timeout=PROBE_TIMEOUT_S, check=False)
    reason = (p["failure"] or {}).get("reason")
    return "OK" if reason == "released" else f"PROBE AFTER RELEASE {reason}"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=7)
    ap.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    args = ap.parse_args()
    audit = os.path.join(tempfile.mkdtemp(prefix="gatehouse-demo-"), "audit.jsonl")
    gw = gatehouse.Gateway(audit_path=audit)
    ok = 0
    t0 = time.monotonic()
    for i in range(1, args.count + 1):
        try:
            verdict = await asyncio.wait_for(one(gw, i), PER_EXECUTION_TIMEOUT_S)
        except asyncio.TimeoutError:
            verdict = f"TIMEOUT({PER_EXECUTION_TIMEOUT_S:.0f}s)"
        except Exception as e:  # report and go on: every execution gets a verdict
            verdict = f"ERROR({type(e).__name__}: {e})"
        ok += verdict == "OK"
        if not args.quiet or verdict != "OK":
            print(f"gw {i}: {verdict}", flush=True)
    starts = gw.server_starts
    gw.close()
    elapsed = time.monotonic() - t0
    print(f"{ok}/{args.count} OK in {elapsed:.1f}s (one embedded server, started {starts}x)")
    return 0 if ok == args.count else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
