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
