#!/usr/bin/env python3
"""Benchmark of the Python package (figures printed, nothing asserted).

    python bench/python_bench.py [--seconds 5] [--cycles 2000] [--rss-registrations 10000]
                                 [--rounds 1] [--clients 1,8] [--tools rust_echo,py_echo,...]

1. Registration cycles per second: register (one Python tool) + release, sequentially.
2. `tools/call` throughput through a Python sync tool, a Python async tool (the gateway's own
   loop thread) and the built-in Rust in-process tool, in the same gateway and run, at 1 and
   8 clients. Each client is its own process (plain HTTP/1.1 keep-alive, Streamable HTTP
   session), so clients never contend for the gateway process's GIL. Besides calls/s it prints
   the gateway process's CPU time per call (user+system of this process, which runs the
   server and the Python tools; the clients are other processes), the steadier figure on a
   shared machine.
3. RSS growth over 10,000 sequential registrations (register with a Python tool, one call
   over HTTP, release), after a 1,000-registration warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Conn:
    """One Streamable HTTP session by hand on a keep-alive connection."""

    def __init__(self, url: str, token: str) -> None:
        u = urlsplit(url)
        self.path = u.path
        self.c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.h = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        self.n = 0
        self.post("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        })
        self.post("notifications/initialized", notify=True)

    def post(self, method: str, params: Any = None, notify: bool = False) -> Any:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            self.n += 1
            msg["id"] = self.n
        self.c.request("POST", self.path, json.dumps(msg), self.h)
        r = self.c.getresponse()
        body = r.read()
        sid = r.getheader("Mcp-Session-Id")
        if sid:
            self.h["Mcp-Session-Id"] = sid
        if r.status not in (200, 202):
            raise RuntimeError(f"{method}: HTTP {r.status} {body[:200]!r}")
        if not body.strip():
            return None
        text = body.decode()
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            text = [ln[5:] for ln in text.splitlines() if ln.startswith("data:")][-1]
        return json.loads(text)


def client_main(url: str, token: str, tool: str, seconds: float, start_at: float) -> None:
    c = Conn(url, token)
    c.post("tools/call", {"name": tool, "arguments": {"text": "warm"}})
    while time.time() < start_at:
        time.sleep(0.001)
    n = 0
    end = start_at + seconds
    while time.time() < end:
        out = c.post("tools/call", {"name": tool, "arguments": {"text": "hi"}})
        if "result" not in out or out["result"].get("isError"):
            raise RuntimeError(f"bad call result: {out}")
        n += 1
    print(n, flush=True)


def run_clients(reg: Any, tool: str, clients: int, seconds: float) -> tuple[float, float]:
    """calls/s and gateway-process CPU µs per call."""
    start_at = time.time() + 1.5
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--client", reg.mcp_url, reg.token, tool, str(seconds), str(start_at)],
            stdout=subprocess.PIPE, text=True,
        )
        for _ in range(clients)
    ]
    while time.time() < start_at:
        time.sleep(0.001)
    c0 = cpu_s()
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 60)
        if p.returncode != 0:
            raise RuntimeError(f"client failed ({p.returncode})")
        total += int(out.strip())
    cpu = cpu_s() - c0
    return total / seconds, (cpu / total * 1e6) if total else float("nan")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        _, _, url, token, tool, seconds, start_at = sys.argv
        client_main(url, token, tool, float(seconds), float(start_at))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--rss-registrations", type=int, default=10_000)
    ap.add_argument("--clients", default="1,8", help="client counts of part 2, e.g. 8")
    ap.add_argument("--tools", default="rust_echo,py_echo,py_async_echo",
                    help="tools of part 2 (rust_echo, py_echo, py_async_echo)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat part 2 this many times (tools interleaved); print medians")
    ap.add_argument("--pause", action="store_true",
                    help="print the pid and wait for Enter before part 2 (to attach a profiler)")
    args = ap.parse_args()

    import gatehouse

    audit = os.path.join(tempfile.mkdtemp(prefix="gatehouse-bench-"), "audit.jsonl")
    gw = gatehouse.Gateway(audit_path=audit)
    print(f"gatehouse Python benchmark; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")

    @gatehouse.tool
    def py_echo(text: str) -> str:
        return text

    @gatehouse.tool
    async def py_async_echo(text: str) -> str:
        await asyncio.sleep(0)
        return text

    # 1. registration cycles
    keep = gw.register("bench-keep", tools=[py_echo])  # the server stays up throughout
    t0 = time.perf_counter()
    for i in range(args.cycles):
        gw.register(f"bench-{i}", tools=[py_echo]).release()
    dt = time.perf_counter() - t0
    print(f"\n1. registration cycles (register + release, one Python tool): "
          f"{args.cycles / dt:,.0f}/s ({dt / args.cycles * 1e6:,.0f} µs each, {args.cycles} cycles)")

    # 2. tools/call throughput
    reg = gw.register(
        "bench-calls", tools=[py_echo, py_async_echo, gatehouse.echo_tool("rust_echo")]
    )
    print(f"\n2. tools/call over Streamable HTTP, {args.seconds:.0f} s per line "
          "(client processes; gateway-process CPU per call)"
          + (f", median of {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    print(f"   {'tool':<26}{'clients':>8}{'calls/s':>12}{'CPU µs/call':>14}"
          f"{'calls/s vs Rust':>17}{'CPU vs Rust':>13}")
    labels = {
        "rust_echo": "Rust in-process",
        "py_echo": "Python sync (thread)",
        "py_async_echo": "Python async (loop)",
    }
    tools = [t for t in args.tools.split(",") if t]
    if args.pause:
        print(f"   pid {os.getpid()}: press Enter to start part 2", flush=True)
        sys.stdin.readline()
    for clients in (int(c) for c in args.clients.split(",") if c):
        # Rounds interleave the tools, so a change of the machine's load hits all of them;
        # with several rounds each line is the median round (by CPU per call).
        runs: dict[str, list[tuple[float, float]]] = {t: [] for t in tools}
        for _ in range(args.rounds):
            for tool in tools:
                runs[tool].append(run_clients(reg, tool, clients, args.seconds))
        med = {t: sorted(r, key=lambda x: x[1])[len(r) // 2] for t, r in runs.items()}
        for tool in tools:
            rate, cpu = med[tool]
            base = med.get("rust_echo")
            vs = (f"{base[0] / rate:>16.2f}x{cpu / base[1]:>12.2f}x" if base else "")
            spread = ""
            if args.rounds > 1:
                cpus = sorted(c for _, c in runs[tool])
                spread = f"   (CPU {cpus[0]:,.0f}..{cpus[-1]:,.0f} over {args.rounds} rounds)"
            print(f"   {labels[tool]:<26}{clients:>8}{rate:>12,.0f}{cpu:>14,.0f}{vs}{spread}",
                  flush=True)
    reg.release()

    # 3. RSS growth
    if args.rss_registrations <= 0:
        keep.release()
        gw.close()
        return 0

    def cycle(i: int) -> None:
        with gw.register(f"rss-{i}", tools=[py_echo]) as r:
            c = Conn(r.mcp_url, r.token)
            c.post("tools/call", {"name": "py_echo", "arguments": {"text": "x"}})
            c.c.close()

    for i in range(1000):
        cycle(i)
    r0 = rss_kib()
    t0 = time.perf_counter()
    for i in range(args.rss_registrations):
        cycle(i)
    dt = time.perf_counter() - t0
    r1 = rss_kib()
    print(f"\n3. RSS over {args.rss_registrations:,} sequential registrations (each: Python tool, "
          f"session, one call, release; after 1,000 warm-up): {r0 / 1024:.1f} MiB -> "
          f"{r1 / 1024:.1f} MiB, growth {(r1 - r0) / 1024:+.1f} MiB ({dt:.1f} s)")
    keep.release()
    gw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
