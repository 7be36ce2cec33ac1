"""gatehouse: a shared MCP gateway, embedded in a Python harness.

    import gatehouse
    gw = gatehouse.Gateway()                      # binds nothing yet

    @gatehouse.tool(description="Look a case up")
    def lookup(case_id: str, ctx: gatehouse.CallContext) -> str:
        return f"{ctx.agent_id} looked up {case_id}"

    with gw.register("agent-7", tools=[lookup], label="run-42", ttl_s=600) as reg:
        ...  # hand reg.sse_url / reg.mcp_url and reg.token to the agent

``gatehouse.AdminClient()`` is the client of a ``gatehouse serve`` daemon.
"""

from __future__ import annotations

from . import _native
from ._admin import AdminClient, AdminRegistration
from ._errors import (
    AdminError,
    AuditError,
    BadConfig,
    BindError,
    GatehouseError,
    GatewayStopped,
    InvalidTool,
    ProbeFailed,
    RegistrationError,
    UnknownGrant,
)
from ._gateway import Gateway, Registration
from ._tools import CallContext, Tool, tool

LOG_LEVELS: tuple[str, ...] = tuple(_native.LOG_LEVELS)


def echo_tool(name: str = "rust_echo") -> _native.NativeTool:
    """The built-in Rust in-process tool (echoes ``text``): a baseline for benchmarks."""
    return _native.echo_tool(name)


__all__ = [
    "AdminClient",
    "AdminError",
    "AdminRegistration",
    "AuditError",
    "BadConfig",
    "BindError",
    "CallContext",
    "GatehouseError",
    "Gateway",
    "GatewayStopped",
    "InvalidTool",
    "LOG_LEVELS",
    "ProbeFailed",
    "Registration",
    "RegistrationError",
    "Tool",
    "UnknownGrant",
    "echo_tool",
    "tool",
]
