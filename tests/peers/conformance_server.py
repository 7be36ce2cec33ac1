#!/usr/bin/env python3
"""An upstream MCP server for gatehouse's tests, written with the official Python SDK (mcp 2.x).

It implements every tool, resource and prompt that the official conformance suite
(@modelcontextprotocol/conformance 0.1.16, `conformance server`) calls, with the behaviour
its scenario sources describe, plus a few helpers for gatehouse's own tests
(`echo`, `test_long_operation`).

Usage:
    python conformance_server.py stdio
    python conformance_server.py streamable-http --port N [--host 127.0.0.1] [--path /mcp]
                                  [--json-response] [--stateless]
    python conformance_server.py sse --port N [--host 127.0.0.1]
    (all) [--event-log FILE]   append one JSON line per notable event (cancellations, ...)

stdout is the protocol channel in stdio mode: everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import logging
import math
import struct
import sys
import time
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.message import ServerMessageMetadata

# The SDK marks sampling/logging as deprecated for 2026-07-28; the suite still tests them.
warnings.filterwarnings("ignore")

SERVER_NAME = "gatehouse-conformance-server"

# 1x1 red pixel PNG.
RED_PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def _tiny_wav() -> str:
    """A 10 ms, 8 kHz, 16-bit mono sine beep as a base64 WAV file."""
    rate, n = 8000, 80
    samples = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n))
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + len(samples), b"WAVE", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16, b"data", len(samples),
    )
    return base64.b64encode(header + samples).decode()


TINY_WAV = _tiny_wav()

EVENT_LOG: str | None = None


def log_event(kind: str, **fields: Any) -> None:
    """Record a notable event on stderr and, with --event-log, as a JSON line in a file."""
    record = {"event": kind, "time": time.time(), **fields}
    print(f"conformance_server: {json.dumps(record)}", file=sys.stderr, flush=True)
    if EVENT_LOG:
        with open(EVENT_LOG, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


class InMemoryEventStore(EventStore):
    """Minimal event store so SSE streams are resumable (needed by `test_reconnection`)."""

    def __init__(self) -> None:
        self._events: list[tuple[str, str, types.JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = f"{stream_id}:{next(self._ids)}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        index = next((i for i, (eid, _, _) in enumerate(self._events) if eid == last_event_id), None)
        if index is None:
            return None
        stream_id = self._events[index][1]
        for eid, sid, message in self._events[index + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, eid))
        return stream_id


mcp = MCPServer(SERVER_NAME, version="1.0.0", instructions="Conformance test upstream for gatehouse")
LOG_LEVEL = {"level": "debug"}
SUBSCRIPTIONS: set[str] = set()


# ---------------------------------------------------------------- tools: content
@mcp.tool(description="Returns a simple text response")
def test_simple_text() -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="This is a simple text response for testing.")])


@mcp.tool(description="Returns a 1x1 red PNG image")
def test_image_content() -> types.CallToolResult:
    return types.CallToolResult(content=[types.ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png")])


@mcp.tool(description="Returns a tiny WAV audio clip")
def test_audio_content() -> types.CallToolResult:
    return types.CallToolResult(content=[types.AudioContent(type="audio", data=TINY_WAV, mime_type="audio/wav")])


@mcp.tool(description="Returns an embedded text resource")
def test_embedded_resource() -> types.CallToolResult:
    return types.CallToolResult(
        content=[
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
                ),
            )
        ]
    )


@mcp.tool(description="Returns text, image and resource content together")
def test_multiple_content_types() -> types.CallToolResult:
    return types.CallToolResult(
        content=[
            types.TextContent(type="text", text="Multiple content types test:"),
            types.ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri="test://mixed-content-resource",
                    mime_type="application/json",
                    text=json.dumps({"test": "data", "value": 123}, separators=(",", ":")),
                ),
            ),
        ]
    )


@mcp.tool(description="Always returns an error result (isError: true)")
def test_error_handling() -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text="This tool intentionally returns an error for testing")],
        is_error=True,
    )


# ---------------------------------------------------------------- tools: notifications
@mcp.tool(description="Sends three info log notifications while it runs")
async def test_tool_with_logging(ctx: Context) -> str:
    await ctx.info("Tool execution started")
    await anyio.sleep(0.05)
    await ctx.info("Tool processing data")
    await anyio.sleep(0.05)
    await ctx.info("Tool execution completed")
    return "Tool with logging executed successfully"


@mcp.tool(description="Reports progress 0/100, 50/100, 100/100")
async def test_tool_with_progress(ctx: Context) -> str:
    await ctx.report_progress(0, 100, "Starting")
    await anyio.sleep(0.05)
    await ctx.report_progress(50, 100, "Halfway")
    await anyio.sleep(0.05)
    await ctx.report_progress(100, 100, "Done")
    return "Tool with progress executed successfully"


@mcp.tool(description="Closes the SSE response stream mid-call so the client must resume (SEP-1699)")
async def test_reconnection(ctx: Context) -> str:
    await anyio.sleep(0.1)
    await ctx.close_sse_stream()
    await anyio.sleep(0.3)
    return "Reconnection test completed"


# ---------------------------------------------------------------- tools: server->client requests
# Handshake-era connections (stdio, SSE, sessionful Streamable HTTP) get a real server-to-client
# request (`sampling/createMessage`, `elicitation/create`). A 2026-07-28 (stateless) connection has no
# back-channel, so the same tool answers with an `InputRequiredResult` carrying the request, and
# finishes when the client retries with `inputResponses` (multi-round-trip requests, SEP-2322).
async def _ask(ctx: Context, key: str, request: types.CreateMessageRequest | types.ElicitRequest) -> Any:
    """Return the client's response, or an InputRequiredResult the tool must return as-is."""
    if ctx.session.can_send_request:
        result_type = types.CreateMessageResult if isinstance(request, types.CreateMessageRequest) else types.ElicitResult
        return await ctx.session.send_request(
            request, result_type, metadata=ServerMessageMetadata(related_request_id=ctx.request_context.request_id)
        )
    responses = ctx.input_responses or {}
    if key in responses:
        return responses[key]
    return types.InputRequiredResult(input_requests={key: request})


@mcp.tool(description="Asks the client for an LLM completion (sampling/createMessage)")
async def test_sampling(prompt: str, ctx: Context) -> str | types.InputRequiredResult:
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=100,
        )
    )
    result = await _ask(ctx, "sampling", request)
    if isinstance(result, types.InputRequiredResult):
        return result
    content = result.content
    text = content.text if isinstance(content, types.TextContent) else json.dumps(content.model_dump(mode="json"))
    return f"LLM response: {text}"


async def _elicit(ctx: Context, message: str, schema: dict[str, Any]) -> Any:
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))
    return await _ask(ctx, "elicitation", request)


@mcp.tool(description="Asks the user for input (elicitation/create)")
async def test_elicitation(message: str, ctx: Context) -> str | types.InputRequiredResult:
    result = await _elicit(
        ctx,
        message,
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    if isinstance(result, types.InputRequiredResult):
        return result
    return f"User response: action={result.action}, content={json.dumps(result.content)}"


@mcp.tool(description="Elicitation with default values for every primitive type (SEP-1034)")
async def test_elicitation_sep1034_defaults(ctx: Context) -> str | types.InputRequiredResult:
    result = await _elicit(
        ctx,
        "Please review and update the form fields with defaults",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verification status", "default": True},
            },
            "required": [],
        },
    )
    if isinstance(result, types.InputRequiredResult):
        return result
    return f"Elicitation completed: action={result.action}, content={json.dumps(result.content)}"


@mcp.tool(description="Elicitation with all five enum schema variants (SEP-1330)")
async def test_elicitation_sep1330_enums(ctx: Context) -> str | types.InputRequiredResult:
    result = await _elicit(
        ctx,
        "Please select options from the enum fields",
        {
            "type": "object",
            "properties": {
                "untitledSingle": {
                    "type": "string",
                    "description": "Select one option",
                    "enum": ["option1", "option2", "option3"],
                },
                "titledSingle": {
                    "type": "string",
                    "description": "Select one option with titles",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "description": "Select one option (legacy)",
                    "enum": ["opt1", "opt2", "opt3"],
                    "enumNames": ["Option One", "Option Two", "Option Three"],
                },
                "untitledMulti": {
                    "type": "array",
                    "description": "Select multiple options",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "description": "Select multiple options with titles",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"},
                        ]
                    },
                },
            },
            "required": [],
        },
    )
    if isinstance(result, types.InputRequiredResult):
        return result
    return f"Elicitation completed: action={result.action}, content={json.dumps(result.content)}"


# ---------------------------------------------------------------- tools: schema fidelity
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


@mcp.tool(name="json_schema_2020_12_tool", description="Tool with JSON Schema 2020-12 features")
def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> str:
    return f"JSON Schema 2020-12 tool called with name={name!r}, address={json.dumps(address)}"


# The SDK derives the schema from the signature; publish the exact 2020-12 schema instead.
mcp._tool_manager.get_tool("json_schema_2020_12_tool").parameters = JSON_SCHEMA_2020_12  # noqa: SLF001


# ---------------------------------------------------------------- tools: gatehouse helpers
@mcp.tool(description="Echoes the message back (structured output too)")
def echo(message: str) -> dict[str, str]:
    return {"echo": message}


@mcp.tool(description="Runs for `seconds`, reporting progress each `interval`; records cancellation in the event log")
async def test_long_operation(ctx: Context, seconds: float = 10.0, interval: float = 0.2) -> str:
    steps = max(1, int(seconds / interval))
    log_event("long_operation_started", request_id=ctx.request_id, seconds=seconds)
    try:
        for step in range(steps):
            await ctx.report_progress(step, steps, f"step {step}/{steps}")
            await anyio.sleep(interval)
        await ctx.report_progress(steps, steps, "done")
    except anyio.get_cancelled_exc_class():
        log_event("long_operation_cancelled", request_id=ctx.request_id)
        raise
    log_event("long_operation_completed", request_id=ctx.request_id)
    return f"Long operation completed after {steps} steps"


@mcp.tool(description="Returns the HTTP request headers this call arrived with (empty on stdio)")
def test_request_headers(ctx: Context) -> dict[str, Any]:
    headers = ctx.headers
    return {"headers": {k.lower(): v for k, v in headers.items()} if headers else {}}


# ---------------------------------------------------------------- resources
@mcp.resource("test://static-text", name="static-text", description="A static text resource", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


@mcp.resource("test://static-binary", name="static-binary", description="A static binary resource (PNG)", mime_type="image/png")
def static_binary() -> bytes:
    return base64.b64decode(RED_PIXEL_PNG)


@mcp.resource(
    "test://template/{id}/data", name="template-data", description="A templated resource", mime_type="application/json"
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"}, separators=(",", ":"))


@mcp.resource("test://watched-resource", name="watched-resource", description="A resource that can be subscribed to", mime_type="text/plain")
def watched_resource() -> str:
    return "Watched resource content"


# ---------------------------------------------------------------- prompts
@mcp.prompt(description="A simple prompt without arguments")
def test_simple_prompt() -> list[UserMessage]:
    return [UserMessage("This is a simple prompt for testing.")]


@mcp.prompt(description="A prompt with required arguments")
def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
    return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]


@mcp.prompt(description="A prompt with an embedded resource")
def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:  # noqa: N803 (name fixed by the suite)
    return [
        UserMessage(
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(
                    uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
                ),
            )
        ),
        UserMessage("Please process the embedded resource above."),
    ]


@mcp.prompt(description="A prompt with an image")
def test_prompt_with_image() -> list[UserMessage]:
    return [
        UserMessage(types.ImageContent(type="image", data=RED_PIXEL_PNG, mime_type="image/png")),
        UserMessage("Please analyze the image above."),
    ]


# ---------------------------------------------------------------- completion, logging, subscriptions
@mcp.completion()
async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> types.Completion:
    candidates = ["paris", "park", "party", "test", "testValue"]
    values = [c for c in candidates if c.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


async def _set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    LOG_LEVEL["level"] = params.level
    return types.EmptyResult()


async def _subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.add(str(params.uri))
    return types.EmptyResult()


async def _unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    SUBSCRIPTIONS.discard(str(params.uri))
    return types.EmptyResult()


_low = mcp._lowlevel_server  # noqa: SLF001 (MCPServer has no public hook for these)
_low.add_request_handler("logging/setLevel", types.SetLevelRequestParams, _set_level)
_low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, _subscribe)
_low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, _unsubscribe)


def main() -> None:
    global EVENT_LOG
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transport", choices=["stdio", "streamable-http", "sse"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--path", default=None, help="endpoint path (default /mcp, or /sse for sse)")
    parser.add_argument("--json-response", action="store_true", help="streamable-http: answer with JSON, not SSE")
    parser.add_argument("--stateless", action="store_true", help="streamable-http: no Mcp-Session-Id sessions")
    parser.add_argument("--event-log", default=None, help="append JSON lines of notable events to this file")
    args = parser.parse_args()
    EVENT_LOG = args.event_log
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    if args.transport == "stdio":
        mcp.run("stdio")
    elif args.transport == "sse":
        mcp.run("sse", host=args.host, port=args.port, sse_path=args.path or "/sse")
    else:
        mcp.run(
            "streamable-http",
            host=args.host,
            port=args.port,
            streamable_http_path=args.path or "/mcp",
            json_response=args.json_response,
            stateless_http=args.stateless,
            event_store=None if args.stateless else InMemoryEventStore(),
            retry_interval=200,
        )


if __name__ == "__main__":
    main()
