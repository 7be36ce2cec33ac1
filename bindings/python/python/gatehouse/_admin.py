"""``AdminClient``: the daemon's admin API from Python (pure Python, standard library only).

It finds the admin URL and token as the CLI verbs do (src/cli/admin_client.rs): ``url=`` /
``$GATEHOUSE_ADMIN_URL``, else ``http://<admin_listen>`` of the config (``config=`` /
``$GATEHOUSE_CONFIG`` / ``config/gatehouse.toml``, with ``$GATEHOUSE_ADMIN_LISTEN`` applied);
``token=`` / ``$GATEHOUSE_ADMIN_TOKEN``, else the config's ``admin_token_file`` (written by
``gatehouse serve``).
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping

from ._roots import roots_list
from ._errors import AdminError, BadConfig, RegistrationError, UnknownGrant
from . import _probe

DEFAULT_CONFIG_PATH = "config/gatehouse.toml"


def _env(name: str) -> str | None:
    v = os.environ.get(name)
    return v if v and v.strip() else None


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise AdminError(
            f"cannot read the config {path} ({e.strerror}): set GATEHOUSE_ADMIN_URL and "
            "GATEHOUSE_ADMIN_TOKEN, pass url= and token=, or point config= / GATEHOUSE_CONFIG "
            "at the daemon's config"
        ) from e
    text = raw.decode("utf-8", "replace")
    if path.lower().endswith(".json") or text.lstrip().startswith("{"):
        return {}  # an mcpServers file: the admin settings keep their defaults
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import re

        out: dict[str, Any] = {}
        for key in ("admin_listen", "admin_token_file"):
            m = re.search(rf'^\s*{key}\s*=\s*"([^"]*)"', text, re.M)
            if m:
                out[key] = m.group(1)
        return out
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadConfig(f"{path}: {e}") from e


class AdminRegistration:
    """A registration made through the daemon. While held (``with``), a background thread
    renews its TTL (every third of it); on exit it is released."""

    def __init__(
        self, client: "AdminClient", body: dict[str, Any], ttl_s: int | None, renew: bool
    ) -> None:
        self._client = client
        self.info = body
        self.id: str = body["id"]
        self.token: str = body["token"]
        self.agent_id: str = body.get("agent_id", "")
        self.tools: list[str] = list(body.get("tools", []))
        self.sse_url: str = body.get("sse_url", "")
        self.mcp_url: str = body.get("mcp_url", "")
        self.expires_at: str | None = body.get("expires_at")
        self.ttl_s = ttl_s
        self.renewals = 0
        self.renew_error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if renew and self.ttl_s:
            self._thread = threading.Thread(
                target=self._renew_loop, name=f"gatehouse-renew-{self.id[:8]}", daemon=True
            )
            self._thread.start()

    def _renew_loop(self) -> None:
        interval = max(float(self.ttl_s or 0) / 3.0, 0.2)
        while not self._stop.wait(interval):
            try:
                r = self._client.renew(self.id)
                self.expires_at = r.get("expires_at", self.expires_at)
                self.renewals += 1
            except AdminError as e:
                self.renew_error = e
                if e.status == 404:
                    return
            except Exception as e:  # keep renewing through transient failures
                self.renew_error = e

    def renew(self, ttl_s: int | None = None) -> dict[str, Any]:
        r = self._client.renew(self.id, ttl_s)
        self.expires_at = r.get("expires_at", self.expires_at)
        return r

    def child(
        self,
        agent_id: str,
        tools: Iterable[str],
        *,
        label: str | None = None,
        ttl_s: int | None = None,
        limits: Mapping[str, Any] | None = None,
        renew: bool = True,
        upstream_credentials: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> "AdminRegistration":
        """A child registration for a sub-agent: ``tools`` must name tools of this
        registration (globs match among them), its TTL and limits are at most this one's, its
        calls count against this one's budget too, and releasing this one releases it first.
        It uses this registration's upstream credentials unless given its own."""
        return self._client.register(
            agent_id, tools, label=label, ttl_s=ttl_s, limits=limits, renew=renew, parent=self.id,
            upstream_credentials=upstream_credentials,
        )

    def rotate_credentials(self, upstream_credentials: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Replaces this registration's upstream credentials (see
        :meth:`AdminClient.rotate_credentials`)."""
        return self._client.rotate_credentials(self.id, upstream_credentials)

    def probe(self, timeout: float = _probe.DEFAULT_TIMEOUT, *, check: bool = True) -> dict[str, Any]:
        """The MCP round trip with this registration's token, its tools against its grant, its
        upstreams pinged, within ``timeout`` seconds (see :meth:`AdminClient.probe`)."""
        return self._client.probe(
            self.id, self.token, mcp_url=self.mcp_url, timeout=timeout, check=check
        )

    def release(self) -> bool:
        """Stops renewing and releases (False if it was already gone)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        return self._client.release(self.id)

    def __enter__(self) -> "AdminRegistration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<gatehouse.AdminRegistration {self.id} agent_id={self.agent_id!r}>"


class AdminClient:
    """The daemon's admin API (``gatehouse serve``)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        url = url or _env("GATEHOUSE_ADMIN_URL")
        token = token or _env("GATEHOUSE_ADMIN_TOKEN")
        if url is None or token is None:
            path = os.fspath(config) if config is not None else (
                _env("GATEHOUSE_CONFIG") or DEFAULT_CONFIG_PATH
            )
            cfg = _read_config(path)
            if url is None:
                listen = _env("GATEHOUSE_ADMIN_LISTEN") or cfg.get("admin_listen", "127.0.0.1:8788")
                url = f"http://{listen}"
            if token is None:
                token_file = cfg.get("admin_token_file", "gatehouse-admin.token")
                try:
                    with open(token_file, encoding="utf-8") as f:
                        token = f.read().strip()
                except OSError as e:
                    raise AdminError(
                        f"no admin token: GATEHOUSE_ADMIN_TOKEN is unset and {token_file} cannot "
                        f"be read ({e.strerror}); `gatehouse serve` writes it at start, or set "
                        "GATEHOUSE_ADMIN_TOKEN / pass token="
                    ) from e
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<gatehouse.AdminClient {self.url}>"

    def _call(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise AdminError(
                f"cannot reach the admin API at {self.url} ({reason}): is `gatehouse serve` "
                "running? Set GATEHOUSE_ADMIN_URL or pass url= if it listens elsewhere"
            ) from e
        try:
            payload = json.loads(raw) if raw.strip() else None
        except ValueError:
            payload = None
        return status, payload

    @staticmethod
    def _message(status: int, payload: Any) -> str:
        if isinstance(payload, dict) and isinstance(payload.get("error"), str):
            return payload["error"]
        return f"HTTP {status}"

    def _fail(self, status: int, payload: Any, what: str) -> AdminError:
        msg = self._message(status, payload)
        if status == 401:
            return AdminError(
                f"{what}: the admin token was refused (401); use the daemon's token "
                "(GATEHOUSE_ADMIN_TOKEN or its admin_token_file)",
                status,
            )
        return AdminError(f"{what}: {msg}", status)

    def register(
        self,
        agent_id: str,
        tools: Iterable[str],
        *,
        label: str | None = None,
        ttl_s: int | None = None,
        limits: Mapping[str, Any] | None = None,
        renew: bool = True,
        roots: Iterable[Any] | None = None,
        parent: str | None = None,
        upstream_credentials: Mapping[str, Mapping[str, Any]] | None = None,
        policy: Iterable[Mapping[str, Any]] | None = None,
    ) -> AdminRegistration:
        """``POST /v1/registrations``. Use as a context manager: renews while held (if it has
        a ``ttl_s``), releases on exit. ``roots`` as for :meth:`gatehouse.Gateway.register`
        (sent as the body's ``"roots"``). ``parent``: the id of a live registration this one
        is a child of (a sub-agent; see :meth:`AdminRegistration.child`).
        ``upstream_credentials``: ``{"<upstream>": {"bearer": "…"} | {"headers": {…}}}`` for
        HTTP upstreams the grant names, sent on this registration's upstream requests only and
        never shown again (the reply says ``"set"``). ``policy``: its rules,
        ``[{"id", "when", "effect", "reason"?, "approver"?, "timeout_s"?}]`` (docs/policy.md)."""
        body: dict[str, Any] = {"agent_id": agent_id, "tools": list(tools)}
        if policy is not None:
            body["policy"] = [dict(r) for r in policy]
        if upstream_credentials is not None:
            body["upstream_credentials"] = {k: dict(v) for k, v in upstream_credentials.items()}
        if parent is not None:
            body["parent"] = parent
        if label is not None:
            body["label"] = label
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if limits is not None:
            body["limits"] = dict(limits)
        if roots is not None:
            body["roots"] = roots_list(roots)
        status, payload = self._call("POST", "/v1/registrations", body)
        if status == 400:
            msg = self._message(status, payload)
            cls = UnknownGrant if ("grant" in msg or "tool" in msg) else RegistrationError
            raise cls(f"the daemon refused the registration: {msg}")
        if status != 201 or not isinstance(payload, dict):
            raise self._fail(status, payload, "register")
        return AdminRegistration(self, payload, ttl_s, renew)

    def rotate_credentials(
        self, id: str, upstream_credentials: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Any]:
        """``PUT /v1/registrations/<id>/credentials``: replaces its upstream credentials (same
        URL and token; calls in flight finish, the next upstream request uses the new ones).
        Returns ``{"id", "upstream_credentials": {"<upstream>": "set"}}``."""
        body = {k: dict(v) for k, v in upstream_credentials.items()}
        status, payload = self._call("PUT", f"/v1/registrations/{urllib.parse.quote(id, safe='')}/credentials", body)
        if status == 400:
            raise RegistrationError(f"the daemon refused the credentials: {self._message(status, payload)}")
        if status != 200 or not isinstance(payload, dict):
            raise self._fail(status, payload, "rotate credentials")
        return payload

    def list(self) -> list[dict[str, Any]]:
        """``GET /v1/registrations`` (never tokens)."""
        status, payload = self._call("GET", "/v1/registrations")
        if status != 200 or not isinstance(payload, list):
            raise self._fail(status, payload, "list")
        return payload

    def renew(self, registration_id: str, ttl_s: int | None = None) -> dict[str, Any]:
        """Extends a lease; raises ``AdminError`` (status 404) if it is gone."""
        body = {"ttl_s": ttl_s} if ttl_s is not None else None
        rid = urllib.parse.quote(registration_id, safe="")
        status, payload = self._call("POST", f"/v1/registrations/{rid}/renew", body)
        if status != 200 or not isinstance(payload, dict):
            raise self._fail(status, payload, f"renew {registration_id}")
        return payload

    def release(self, registration_id: str) -> bool:
        """Cancel-then-release; False if it was already gone (404)."""
        rid = urllib.parse.quote(registration_id, safe="")
        status, payload = self._call("DELETE", f"/v1/registrations/{rid}")
        if status == 204:
            return True
        if status == 404:
            return False
        raise self._fail(status, payload, f"release {registration_id}")

    def approvals(self, wait: float | None = None) -> list[dict[str, Any]]:
        """``GET /v1/approvals`` (issue 49): the calls an ``approve`` rule holds, oldest first,
        each ``{"id", "registration_id", "agent_id", "tool", "rule", "approver", "arguments"
        (``redact_keys`` applied), "args_digest", "definition_digest", "requested_at",
        "expires_at", …}``. With ``wait`` (seconds, at most 60), waits until one is held."""
        path = "/v1/approvals"
        timeout = None
        if wait is not None:
            path += f"?wait={float(wait):g}"
            timeout = max(self.timeout, float(wait) + 10.0)
        status, payload = self._call("GET", path, timeout=timeout)
        if status != 200 or not isinstance(payload, dict):
            raise self._fail(status, payload, "approvals")
        return list(payload.get("approvals") or [])

    def _decide(self, approval_id: str, decision: str, reason: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"decision": decision, "by": "harness"}
        if reason is not None:
            body["reason"] = reason
        aid = urllib.parse.quote(approval_id, safe="")
        status, payload = self._call("POST", f"/v1/approvals/{aid}", body)
        if status != 200 or not isinstance(payload, dict):
            raise self._fail(status, payload, f"{decision} {approval_id}")
        return payload

    def approve(self, approval_id: str, reason: str | None = None) -> dict[str, Any]:
        """``POST /v1/approvals/<id>`` ``{"decision": "approve"}``: the held call runs (once,
        with exactly the arguments it was held with). Raises ``AdminError`` with status 404
        for an unknown id, 409 for one decided, timed out or ended already."""
        return self._decide(approval_id, "approve", reason)

    def deny(self, approval_id: str, reason: str | None = None) -> dict[str, Any]:
        """``POST /v1/approvals/<id>`` ``{"decision": "deny"}``: the held call is refused with
        a tool error carrying ``reason``. Errors as :meth:`approve`."""
        return self._decide(approval_id, "deny", reason)

    def probe(
        self,
        registration_id: str,
        token: str,
        *,
        mcp_url: str | None = None,
        timeout: float = _probe.DEFAULT_TIMEOUT,
        check: bool = True,
    ) -> dict[str, Any]:
        """Probes a registration as its agent would reach it: the MCP round trip with its
        ``token`` (the daemon keeps only a digest), then ``POST /v1/registrations/<id>/probe``
        (its grant, each upstream pinged); all within ``timeout`` seconds. Returns the probe
        (``ok``, ``reachable``, ``latency_ms``, ``tools`` against the grant, ``upstreams``,
        ``upstreams_down``, ``failure``); raises ``ProbeFailed`` with the reason when it failed,
        unless ``check=False``. ``mcp_url`` defaults to where the daemon serves it."""
        rid = urllib.parse.quote(registration_id, safe="")

        def daemon_half(left: float) -> dict[str, Any] | None:
            try:
                status, payload = self._call(
                    "POST",
                    f"/v1/registrations/{rid}/probe",
                    # A fifth kept for the answer: a hanging upstream is named, not a timeout.
                    {"timeout_ms": max(int(left * 800), 1)},
                    timeout=max(left, 0.05),
                )
            except AdminError as e:
                raise _probe._Failure("unreachable", str(e)) from e
            if status == 404:
                return None
            if status != 200 or not isinstance(payload, dict):
                raise _probe.failure_of_status(status, f"admin API: {self._message(status, payload)}")
            return payload

        if mcp_url is None:
            try:
                seen = daemon_half(timeout)
            except _probe._Failure as f:
                return _probe.checked(_failed(registration_id, f), check)
            if seen is None or not seen.get("mcp_url"):
                return _probe.checked(
                    _failed(registration_id, _probe.failure_of_status(404, "no such registration")),
                    check,
                )
            mcp_url = seen["mcp_url"]
        return _probe.checked(_probe.run(registration_id, mcp_url, token, timeout, daemon_half), check)


def _failed(registration_id: str, f: "_probe._Failure") -> dict[str, Any]:
    return {
        "id": registration_id, "ok": False, "reachable": False, "latency_ms": None,
        "protocol_version": None,
        "tools": {"equal": False, "granted": [], "listed": [], "missing": [], "unexpected": []},
        "upstreams": [], "upstreams_down": [], "failure": f.as_dict(), "elapsed_ms": 0.0,
    }
