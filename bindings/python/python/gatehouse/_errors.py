"""Exceptions a harness can catch. Every message says what to fix."""

from __future__ import annotations


class GatehouseError(Exception):
    """Base class of every gatehouse error."""


class BadConfig(GatehouseError, ValueError):
    """The configuration (file, TOML text or a keyword argument) is invalid or unreadable."""


class RegistrationError(GatehouseError, ValueError):
    """A registration request is invalid (empty agent_id, bad limits, unknown id, ...)."""


class UnknownGrant(RegistrationError):
    """A grant in ``tools=[...]`` matches no tool (or is not a valid name or glob)."""


class InvalidTool(GatehouseError, TypeError):
    """A ``@gatehouse.tool`` definition cannot be turned into an MCP tool."""


class GatewayStopped(GatehouseError, RuntimeError):
    """The gateway was closed, or this process is a fork of the one that created it."""


class BindError(GatehouseError, OSError):
    """The data listener's address cannot be bound."""


class AuditError(GatehouseError):
    """The audit trail cannot be written; tool calls are refused until it can."""


class AdminError(GatehouseError):
    """The daemon's admin API refused a request or cannot be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProbeFailed(GatehouseError):
    """A registration's probe failed: ``reason`` is ``refused`` (401), ``released`` (404),
    ``fenced`` (503), ``upstream_down`` (``probe["upstreams_down"]`` names them), ``timeout``,
    ``unreachable`` or ``protocol``; ``probe`` is everything it saw (the shared JSON shape)."""

    def __init__(self, probe: dict) -> None:  # type: ignore[type-arg]
        f = probe.get("failure") or {}
        self.probe = probe
        self.reason: str = f.get("reason", "protocol")
        self.status: int | None = f.get("status")
        status = f" (HTTP {self.status})" if self.status else ""
        super().__init__(
            f"probe of {probe.get('id')}: {self.reason}{status}: {f.get('message', 'failed')}"
        )
