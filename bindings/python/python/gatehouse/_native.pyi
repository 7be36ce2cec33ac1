"""Type stubs of the Rust extension `gatehouse._native` (PyO3). Use the `gatehouse` API."""

from typing import Any, Callable

LOG_LEVELS: list[str]

class NativeGateway:
    def __init__(
        self,
        config_path: str | None = None,
        config_toml: str | None = None,
        listen: str | None = None,
        audit_path: str | None = None,
        linger_ms: int | None = None,
        public_url: str | None = None,
        self_exe: str | None = None,
        worker_threads: int = 2,
        tool_threads: int = 64,
    ) -> None: ...
    @property
    def serving(self) -> bool: ...
    @property
    def local_addr(self) -> str | None: ...
    @property
    def server_starts(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def add_tool(self, tool: NativeTool) -> None: ...
    def register(
        self,
        agent_id: str,
        grants: list[str],
        tools: list[NativeTool],
        label: str | None = None,
        ttl_s: int | None = None,
        limits_json: str | None = None,
        roots_json: str | None = None,
        parent: str | None = None,
        credentials_json: str | None = None,
    ) -> NativeRegistration: ...
    def renew(self, id: str, ttl_s: int | None = None) -> str | None: ...
    def close(self) -> None: ...

class NativeRegistration:
    id: str
    token: str
    agent_id: str
    label: str | None
    tools: list[str]
    base_url: str
    sse_url: str
    mcp_url: str
    @property
    def released(self) -> bool: ...
    @property
    def expires_at(self) -> str | None: ...
    def release(self) -> None: ...

class NativeTool:
    def __init__(
        self,
        name: str,
        description: str,
        input_schema_json: str,
        invoker: Callable[..., Any],
        annotations_json: str | None = None,
        gateway: NativeGateway | None = None,
        port: LoopPort | None = None,
        wants_ctx: bool = True,
    ) -> None:
        """Sync (`gateway=`): `invoker(arguments, ctx)` on a tool thread returns `str` (the one
        text block) or `bytes` (the CallToolResult's JSON). Async (`port=`): `invoker(arguments,
        ctx, done)` on the loop returns that at once, or the task, which reports via `done`."""
    @property
    def name(self) -> str: ...
    @property
    def descriptor_json(self) -> str: ...

class CallContext:
    """What a tool knows about the call it serves."""

    agent_id: str
    registration_id: str
    label: str | None
    session_id: str | None
    wants_progress: bool
    @property
    def cancelled(self) -> bool:
        """True once the call is cancelled (client cancel, release, timeout)."""
    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Sleeps (GIL released) until cancelled or `timeout` seconds pass."""
    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Sends notifications/progress, if the caller asked for progress."""
    def log(self, level: str, message: str) -> None:
        """Sends notifications/message; level is one of gatehouse.LOG_LEVELS."""

class LoopPort:
    """One event loop's way in: the loop watches `fileno()` (add_reader) and calls `drain()`."""

    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    @property
    def pid(self) -> int: ...
    def drain(self) -> None: ...

class Done:
    def __call__(self, result: str | bytes) -> None: ...
    def cancelled(self) -> None: ...

def echo_tool(name: str = "rust_echo") -> NativeTool: ...
def main(argv: list[str]) -> int: ...
