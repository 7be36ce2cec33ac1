"""The embedded gateway: ``Gateway``, ``Registration``, and the event loop coroutine tools use.

The HTTP server is lazy and reference counted: the first registration starts it, the last
release stops it (after ``linger_ms``). ``gw.serving`` tells whether it is up.

Fork safety: a forked child never serves its parent's socket. ``os.register_at_fork`` marks
every gateway of the parent as stopped in the child (calls raise ``GatewayStopped``) and closes
the child's copies of the parent's listening and accepted sockets, so the parent's clients see
the parent's listener alone (and a refused connection once it stops, never a hang on a backlog
nobody accepts). The child may create its own ``Gateway``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import json
import os
import socket
import stat
import threading
import weakref
from typing import Any, Iterable, Mapping

from . import _cli, _native
from ._errors import ProbeFailed
from ._roots import roots_list
from ._tools import Tool

_live: "weakref.WeakSet[Gateway]" = weakref.WeakSet()
_ports: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
_ports_lock = threading.Lock()


def _port_for(loop: asyncio.AbstractEventLoop) -> Any:
    """The `_native.LoopPort` of ``loop``: the gateway's threads queue coroutine tool calls on it
    and wake the loop through a socket it watches (``add_reader``), one wake per batch. Made on
    the loop's own thread (or before it runs); kept as long as the loop lives."""
    with _ports_lock:
        port = _ports.get(loop)
        if port is not None and port.pid == os.getpid():
            return port
        port = _native.LoopPort()
        try:
            # An empty context: tasks never see the registering code's context variables.
            contextvars.Context().run(loop.add_reader, port.fileno(), port.drain)
        except NotImplementedError as e:
            raise RuntimeError(
                f"coroutine tools need an event loop with add_reader (asyncio's selector loop, "
                f"uvloop); {type(loop).__name__} has none: use loop=\"gateway\" or a sync tool"
            ) from e
        _ports[loop] = port
        return port


class _LoopThread:
    """The gateway's own event loop, on a daemon thread, for coroutine tools of sync callers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        _port_for(self.loop)  # before the loop runs: add_reader from this thread is safe
        self._thread = threading.Thread(
            target=self._run, name="gatehouse-loop", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


class Registration:
    """One agent execution's registration: hand ``sse_url``/``mcp_url`` and ``token`` to the
    agent. A context manager (sync and async) that releases on exit; like the Rust guard, it is
    also released when garbage-collected unreleased."""

    def __init__(self, gateway: "Gateway", native: Any) -> None:
        self._gateway = gateway
        self._native = native

    id = property(lambda self: self._native.id, doc="The registration id (path segment).")
    token = property(lambda self: self._native.token, doc="Bearer token; never logged.")
    agent_id = property(lambda self: self._native.agent_id)
    label = property(lambda self: self._native.label)
    tools = property(lambda self: list(self._native.tools), doc="Tool names, list order.")
    base_url = property(lambda self: self._native.base_url)
    sse_url = property(lambda self: self._native.sse_url, doc="Legacy HTTP+SSE endpoint.")
    mcp_url = property(lambda self: self._native.mcp_url, doc="Streamable HTTP endpoint.")
    expires_at = property(lambda self: self._native.expires_at)
    released = property(lambda self: self._native.released)

    def release(self) -> None:
        """Releases now: in-flight calls are cancelled, streams end, paths answer 404."""
        self._native.release()

    async def release_async(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._native.release)

    def probe(self, timeout: float = 5.0, *, check: bool = True) -> dict[str, Any]:
        """Probes this registration as its agent would reach it: the MCP round trip over the
        real socket with its token (initialize, tools/list), its tools against its grant, each
        upstream its tools come from pinged; all within ``timeout`` seconds. Returns the probe
        (``ok``, ``reachable``, ``latency_ms``, ``tools``, ``upstreams``, ``upstreams_down``,
        ``failure``: the JSON shape of every API's probe); raises ``gatehouse.ProbeFailed``
        with the reason (refused, released, fenced, upstream_down, timeout) unless
        ``check=False``."""
        p = json.loads(self._native.probe(float(timeout)))
        if check and not p["ok"]:
            raise ProbeFailed(p)
        return p

    async def probe_async(self, timeout: float = 5.0, *, check: bool = True) -> dict[str, Any]:
        """:meth:`probe` without blocking the event loop (in the default executor)."""
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.probe(timeout, check=check)
        )

    def renew(self, ttl_s: int | None = None) -> str | None:
        """Extends the lease by ``ttl_s`` (default: its own); returns the new expiry."""
        return self._gateway._native.renew(self.id, ttl_s)

    def child(
        self,
        agent_id: str,
        tools: Iterable[str],
        *,
        label: str | None = None,
        ttl_s: int | None = None,
        limits: Mapping[str, Any] | None = None,
    ) -> "Registration":
        """A child registration for a sub-agent: ``tools`` must name tools of this registration
        (globs match among them); its TTL and limits are at most this one's, its calls count
        against this one's budget too, and releasing this one releases it first."""
        spec = self._gateway._spec(
            agent_id=agent_id,
            tools=list(tools),
            label=label,
            ttl_s=ttl_s,
            limits=limits,
            get_loop=self._gateway._own_loop,
        )
        spec["parent"] = self.id
        return self._gateway._register(spec)

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> "Registration":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release_async()

    def __repr__(self) -> str:
        return f"<gatehouse.Registration {self.id} agent_id={self.agent_id!r}>"


class _Registering:
    """What ``register_async`` returns: awaitable, and an async context manager."""

    def __init__(self, gateway: "Gateway", args: dict[str, Any]) -> None:
        self._gateway = gateway
        self._args = args
        self._reg: Registration | None = None

    async def _go(self) -> Registration:
        loop = asyncio.get_running_loop()
        gw = self._gateway
        if self._args.pop("loop", None) == "gateway":
            get_loop = gw._own_loop
        else:
            get_loop = lambda: loop  # noqa: E731 - coroutine tools run on the caller's loop
        spec = gw._spec(get_loop=get_loop, **self._args)
        self._reg = await loop.run_in_executor(None, lambda: gw._register(spec))
        return self._reg

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._go().__await__()

    async def __aenter__(self) -> Registration:
        return await self._go()

    async def __aexit__(self, *exc: object) -> None:
        if self._reg is not None:
            await self._reg.release_async()


class Gateway:
    """The embedded gateway. Binds nothing until the first registration.

    ``config`` is the path of a gatehouse TOML file (default: built-in defaults, an ephemeral
    loopback port). Keyword arguments override it. ``gatehouse_exe`` is the binary that
    ``command = "@self"`` upstreams run (default: ``$GATEHOUSE_SELF_EXE``, then this
    installation's ``gatehouse`` command, then ``gatehouse`` on ``PATH``).
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        config_toml: str | None = None,
        listen: str | None = None,
        audit_path: str | os.PathLike[str] | None = None,
        linger_ms: int | None = None,
        public_url: str | None = None,
        gatehouse_exe: str | None = None,
        worker_threads: int = 2,
        tool_threads: int = 64,
    ) -> None:
        exe = gatehouse_exe or _cli.self_exe()
        self._native = _native.NativeGateway(
            os.fspath(config) if config is not None else None,
            config_toml,
            listen,
            os.fspath(audit_path) if audit_path is not None else None,
            linger_ms,
            public_url,
            exe,
            worker_threads,
            tool_threads,
        )
        self._lock = threading.Lock()
        self._loop_thread: _LoopThread | None = None
        self._fork_port: tuple[str, int] | None = None
        _live.add(self)

    # ---- state

    @property
    def serving(self) -> bool:
        """Whether the data listener is up (False before the first registration, and once
        the last one is released and ``linger_ms`` has passed)."""
        return bool(self._native.serving)

    @property
    def local_addr(self) -> str | None:
        return self._native.local_addr

    @property
    def server_starts(self) -> int:
        return int(self._native.server_starts)

    @property
    def closed(self) -> bool:
        return bool(self._native.closed)

    # ---- registrations

    def add_tool(self, tool: Any) -> None:
        """Adds a tool to the gateway's catalog; registrations grant it by name or glob.
        Its coroutines (if any) run on the gateway's own loop thread."""
        self._native.add_tool(self._native_tool(tool, self._own_loop))

    def register(
        self,
        agent_id: str,
        tools: Iterable[Any] = (),
        *,
        label: str | None = None,
        ttl_s: int | None = None,
        limits: Mapping[str, Any] | None = None,
        roots: Iterable[Any] | None = None,
        upstream_credentials: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Registration:
        """Registers one agent execution. ``tools``: ``@gatehouse.tool`` functions (or plain
        callables), grants such as ``"helpdesk.*"``, catalog tool names. Use as a context
        manager; coroutine tools run on the gateway's own loop thread.

        ``upstream_credentials``: ``{"<upstream>": {"bearer": "…"} | {"headers": {…}}}`` for
        HTTP upstreams the grant names (issue 47): sent on this registration's upstream
        requests only, on a connection of its own; never logged or shown.

        ``roots``: the MCP roots of this execution, as ``{"uri": "file:///...", "name": ...}``
        mappings (``name`` optional), ``(uri, name)`` pairs or bare URI strings (at most 64,
        ``file://`` only). When set, a ``roots/list`` from an upstream connection this
        registration owns is answered from them instead of asking the agent's client."""
        spec = self._spec(
            agent_id=agent_id,
            tools=tools,
            label=label,
            ttl_s=ttl_s,
            limits=limits,
            roots=roots,
            get_loop=self._own_loop,
            upstream_credentials=upstream_credentials,
        )
        return self._register(spec)

    def register_async(
        self,
        agent_id: str,
        tools: Iterable[Any] = (),
        *,
        label: str | None = None,
        ttl_s: int | None = None,
        limits: Mapping[str, Any] | None = None,
        roots: Iterable[Any] | None = None,
        loop: str = "caller",
        upstream_credentials: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> _Registering:
        """``async with gw.register_async(...) as reg`` (or ``reg = await ...``). Coroutine
        tools run on the caller's running loop (``loop="caller"``) or on the gateway's own
        loop thread (``loop="gateway"``). ``roots`` and ``upstream_credentials`` as for
        :meth:`register`."""
        if loop not in ("caller", "gateway"):
            raise ValueError('loop must be "caller" or "gateway"')
        return _Registering(
            self,
            dict(
                agent_id=agent_id,
                tools=tools,
                label=label,
                ttl_s=ttl_s,
                limits=limits,
                roots=roots,
                loop=loop,
                upstream_credentials=upstream_credentials,
            ),
        )

    def renew(self, registration_id: str, ttl_s: int | None = None) -> str | None:
        return self._native.renew(registration_id, ttl_s)

    def close(self) -> None:
        """Releases every registration, stops the server, flushes the audit. Idempotent."""
        self._native.close()
        with self._lock:
            lt, self._loop_thread = self._loop_thread, None
        if lt is not None:
            lt.stop()

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("serving on " + str(self.local_addr)) if self.serving else "idle"
        return f"<gatehouse.Gateway {state}>"

    # ---- internals

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop_thread is None:
                self._loop_thread = _LoopThread()
            return self._loop_thread.loop

    def _native_tool(self, t: Any, get_loop: Any) -> Any:
        if isinstance(t, _native.NativeTool):
            return t
        if not isinstance(t, Tool):
            t = Tool(t)
        if t.is_async:
            loop = get_loop()
            return t.native(self._native, loop, _port_for(loop))
        return t.native(self._native)

    def _spec(
        self,
        *,
        agent_id: str,
        tools: Iterable[Any],
        label: str | None,
        ttl_s: int | None,
        limits: Mapping[str, Any] | None,
        get_loop: Any,
        roots: Iterable[Any] | None = None,
        upstream_credentials: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        if isinstance(tools, (str, Tool)) or callable(tools):
            tools = [tools]
        grants: list[str] = []
        natives: list[Any] = []
        for t in tools:
            if isinstance(t, str):
                grants.append(t)
            else:
                natives.append(self._native_tool(t, get_loop))
        return dict(
            agent_id=agent_id,
            grants=grants,
            tools=natives,
            label=label,
            ttl_s=ttl_s,
            limits_json=json.dumps(dict(limits)) if limits is not None else None,
            roots_json=json.dumps(roots_list(roots)) if roots is not None else None,
            # Issue 47: {"<upstream>": {"bearer": …} | {"headers": {…}}}, HTTP upstreams only.
            credentials_json=json.dumps({k: dict(v) for k, v in upstream_credentials.items()})
            if upstream_credentials
            else None,
        )

    def _register(self, spec: dict[str, Any]) -> Registration:
        native = self._native.register(**spec)
        addr = self._native.local_addr
        if addr:
            host, _, port = addr.rpartition(":")
            self._fork_port = (host.strip("[]"), int(port))
        return Registration(self, native)

    def _after_fork_in_child(self) -> None:
        with self._lock:
            self._loop_thread = None  # the thread is the parent's
        if self._fork_port is not None:
            _close_inherited_sockets(*self._fork_port)


def _close_inherited_sockets(host: str, port: int) -> None:
    """Closes this process's copies of sockets bound to ``host:port`` (the parent's listener
    and the connections it accepted)."""
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 4096))
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=fd)
            try:
                name = s.getsockname()
            finally:
                s.detach()
            if isinstance(name, tuple) and name[1] == port and name[0] in (host, "0.0.0.0", "::"):
                os.close(fd)
        except OSError:
            continue


def _in_child() -> None:
    for gw in list(_live):
        gw._after_fork_in_child()


def _close_all() -> None:
    for gw in list(_live):
        try:
            gw.close()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
atexit.register(_close_all)
