#!/usr/bin/env python3
"""A traced MCP client on the official Python SDK 2.x: inside a root span of its own
("agent run") it calls one tool of gatehouse over Streamable HTTP; the SDK writes the
`traceparent` of its CLIENT span (`MCP send tools/call …`) into the request's `_meta`. Spans go
to `OTEL_EXPORTER_OTLP_ENDPOINT` over OTLP/HTTP (the OpenTelemetry Python SDK).

Usage: otel_client.py --url URL --token TOKEN --tool NAME [--args JSON] [--unsampled]
                      [--header-traceparent VALUE] [--calls N] [--prompt NAME]
                      [--resource URI]...
--unsampled: the root span is not sampled (sampler ALWAYS_OFF): flags 00 on the wire.
--header-traceparent: also sends this `traceparent` HTTP header on every request.
--prompt: also gets this prompt; --resource: also reads this resource (each in the same root
span, after the tool calls).
Prints one JSON object: {"trace_id", "root_span_id", "results": [{"text", "isError"}],
"prompt": text of its first message, "resources": [text or {"error": message}]}.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

warnings.filterwarnings("ignore")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON  # noqa: E402


async def run(args) -> dict:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {args.token}"}
    if args.header_traceparent:
        headers["traceparent"] = args.header_traceparent
    tracer = trace.get_tracer("otel-client")
    out = {"results": []}
    with tracer.start_as_current_span("agent run") as root:
        sc = root.get_span_context()
        out["trace_id"] = format(sc.trace_id, "032x")
        out["root_span_id"] = format(sc.span_id, "016x")
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
            async with streamable_http_client(args.url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for _ in range(args.calls):
                        r = await session.call_tool(args.tool, json.loads(args.args))
                        text = "".join(c.text for c in r.content if getattr(c, "type", "") == "text")
                        out["results"].append({"text": text, "isError": bool(r.is_error)})
                    if args.prompt:
                        p = await session.get_prompt(args.prompt, {"who": "gatehouse"})
                        out["prompt"] = getattr(p.messages[0].content, "text", "")
                    out["resources"] = []
                    for uri in args.resource:
                        try:
                            r = await session.read_resource(uri)
                            out["resources"].append("".join(getattr(c, "text", "") for c in r.contents))
                        except Exception as e:  # noqa: BLE001
                            out["resources"].append({"error": str(e)})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--tool", required=True)
    p.add_argument("--args", default="{}")
    p.add_argument("--unsampled", action="store_true")
    p.add_argument("--header-traceparent")
    p.add_argument("--calls", type=int, default=1)
    p.add_argument("--prompt")
    p.add_argument("--resource", action="append", default=[])
    args = p.parse_args()
    provider = TracerProvider(
        sampler=ALWAYS_OFF if args.unsampled else ALWAYS_ON,
        resource=Resource.create({"service.name": "otel-client"}),
    )
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    out = anyio.run(run, args)
    provider.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        print(f"otel_client: error: {e!r}", file=sys.stderr, flush=True)
        sys.exit(1)
