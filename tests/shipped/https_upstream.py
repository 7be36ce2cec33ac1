#!/usr/bin/env python3
"""An MCP upstream on the official Python SDK 2.x (`MCPServer`) for the shipped-binary suite
(tests/shipped, issue 46): Streamable HTTP over TLS served by uvicorn, or stdio.

Usage:
    https_upstream.py --cert CERT --key KEY [--client-ca CA]   HTTPS on 127.0.0.1 (ephemeral
        port), path /mcp; prints {"listening": PORT} on stdout once it accepts. --client-ca:
        mTLS, a client certificate signed by CA is required (ssl.CERT_REQUIRED).
    https_upstream.py --plain                                  the same over plain HTTP.
    https_upstream.py --stdio                                  the same tools on stdio.

Tools: `echo` (answers "echo: <text>") and `whoami` (answers the transport it was reached on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import sys
import warnings

warnings.filterwarnings("ignore")

from mcp.server.mcpserver import MCPServer  # noqa: E402

mcp = MCPServer("shipped-upstream", version="1.0.0")
TRANSPORT = {"name": "stdio"}


@mcp.tool(description="Echoes its text")
def echo(text: str) -> str:
    return f"echo: {text}"


@mcp.tool(description="The transport this upstream was reached on")
def whoami() -> str:
    return TRANSPORT["name"]


async def serve_https(args: argparse.Namespace) -> None:
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    TRANSPORT["name"] = "http" if args.plain else "mtls" if args.client_ca else "https"
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    kw = {}
    if not args.plain:
        kw = {"ssl_certfile": args.cert, "ssl_keyfile": args.key}
    if args.client_ca:
        kw.update(ssl_ca_certs=args.client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    config = uvicorn.Config(app, log_level="warning", **kw)
    server = uvicorn.Server(config)
    port = sock.getsockname()[1]

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        sys.stdout.write(json.dumps({"listening": port}) + "\n")
        sys.stdout.flush()

    asyncio.get_running_loop().create_task(announce())
    await server.serve(sockets=[sock])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stdio", action="store_true")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--client-ca")
    args = p.parse_args()
    if args.stdio:
        mcp.run("stdio")
    else:
        asyncio.run(serve_https(args))


if __name__ == "__main__":
    main()
