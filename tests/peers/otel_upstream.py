#!/usr/bin/env python3
"""An MCP upstream on the official Python SDK 2.x (`MCPServer`), stdio (default) or Streamable
HTTP (`--http PORT`, path /mcp), that exports its own spans
(the SDK's OpenTelemetry middleware: a SERVER span per request, parented on the request's
`_meta.traceparent`) over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, with the OpenTelemetry
Python SDK. Tools: `echo` (text; its structured content is the request's `_meta` as the
upstream received it, and over HTTP the trace headers and whether an Authorization header came)
and `fail` (an `isError` result); a resource `memo://greeting` and a prompt `greet`.
"""

from __future__ import annotations

import json
import sys
import warnings

warnings.filterwarnings("ignore")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402

provider = TracerProvider(resource=Resource.create({"service.name": "otel-upstream"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

import mcp_types as types  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402

mcp = MCPServer("otel-upstream", version="1.0.0")


@mcp.tool(description="Echoes its text; the result's text is the request's _meta as received")
def echo(text: str, ctx: Context) -> types.CallToolResult:
    params = ctx.request_context.params or {}
    meta = dict(params.get("_meta") or {})
    headers = {}
    req = ctx.request_context.request
    if req is not None and hasattr(req, "headers"):
        for k, v in req.headers.items():
            if k.lower() in ("traceparent", "tracestate", "baggage", "authorization"):
                headers[k.lower()] = v
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps({"text": text, "meta": meta, "headers": headers}))]
    )


@mcp.tool(description="Always an isError result")
def fail() -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="it failed")], isError=True)


@mcp.resource("memo://greeting", description="A fixed greeting")
def greeting() -> str:
    return "hello from the traced upstream"


@mcp.prompt(description="A greeting prompt")
def greet(who: str = "world") -> str:
    return f"Greet {who}."


if __name__ == "__main__":
    try:
        if len(sys.argv) == 3 and sys.argv[1] == "--http":
            mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), streamable_http_path="/mcp")
        else:
            mcp.run("stdio")
    finally:
        provider.shutdown()
