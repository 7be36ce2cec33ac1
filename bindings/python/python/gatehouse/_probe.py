"""The probe (issue 48) of a daemon's registration, in pure Python: the MCP round trip with the
registration's own token (``initialize``, ``notifications/initialized``, ``tools/list`` on
Streamable HTTP, then the session closed), then the daemon's half through the admin API
(``POST /v1/registrations/<id>/probe``: the grant, each upstream pinged); all within one
deadline. The result is the same JSON shape as Rust's ``Registration::probe`` (src/gateway/probe.rs),
the CLI's ``gatehouse probe --json`` and the TypeScript client's ``execution.probe()``.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from ._errors import ProbeFailed

PROTOCOL_VERSION = "2025-11-25"
DEFAULT_TIMEOUT = 5.0
_MAX_ANSWER = 4 << 20


class _Failure(Exception):
    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.status = reason, message, status

    def as_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "status": self.status, "message": self.message}


def failure_of_status(status: int, message: str) -> _Failure:
    reason = {401: "refused", 403: "refused", 404: "released", 503: "fenced"}.get(status, "protocol")
    return _Failure(reason, message, status)


def _opener(url: str) -> urllib.request.OpenerDirector:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    # No proxy for a loopback gateway: an HTTP_PROXY would otherwise see the token.
    return urllib.request.build_opener(urllib.request.ProxyHandler({})) if loopback else (
        urllib.request.build_opener()
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1e6) / 1e3


def _post(
    opener: urllib.request.OpenerDirector,
    url: str,
    token: str,
    body: dict[str, Any],
    deadline: float,
    session: str | None = None,
    version: str | None = None,
    method: str = "POST",
) -> tuple[Any, dict[str, Any] | None]:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Failure("timeout", "no answer within the deadline")
    data = json.dumps(body).encode() if method == "POST" else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json, text/event-stream")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if session:
        req.add_header("Mcp-Session-Id", session)
    if version:
        req.add_header("MCP-Protocol-Version", version)
    try:
        with opener.open(req, timeout=left) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read(_MAX_ANSWER + 1)
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read(_MAX_ANSWER + 1)
    except TimeoutError as e:
        raise _Failure("timeout", "no answer within the deadline") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise _Failure("timeout", "no answer within the deadline") from e
        raise _Failure("unreachable", f"cannot reach the gateway: {reason}") from e
    if len(raw) > _MAX_ANSWER:
        raise _Failure("protocol", "the gateway's answer is too large")
    if not 200 <= status < 300:
        message = f"HTTP {status}"
        try:
            v = json.loads(raw)
            err = v.get("error") if isinstance(v, dict) else None
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                message = err["message"]
            elif isinstance(err, str):
                message = err
        except ValueError:
            pass
        raise failure_of_status(status, message)
    if "id" not in body:
        return headers, None
    text = raw.decode("utf-8", "replace")
    answer = None
    if (headers.get("Content-Type") or "").startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data:"):
                try:
                    m = json.loads(line[5:].strip())
                except ValueError:
                    continue
                if isinstance(m, dict) and m.get("id") == body["id"]:
                    answer = m
                    break
    else:
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
    if not isinstance(answer, dict):
        raise _Failure("protocol", "the gateway's answer is not JSON-RPC")
    return headers, answer


def _result(answer: dict[str, Any] | None, method: str) -> dict[str, Any]:
    if answer is None:
        raise _Failure("protocol", f"{method}: no answer")
    if "error" in answer:
        msg = (answer.get("error") or {}).get("message", "")
        raise _Failure("protocol", f"{method} answered an error: {msg}")
    result = answer.get("result")
    if not isinstance(result, dict):
        raise _Failure("protocol", f"{method}: an answer without a result")
    return result


def round_trip(mcp_url: str, token: str, deadline: float) -> tuple[list[str], str | None, float]:
    """``initialize`` → ``notifications/initialized`` → ``tools/list``; the session closed."""
    opener = _opener(mcp_url)
    began = time.monotonic()
    init = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "gatehouse-probe-python", "version": "0"},
        },
    }
    headers, answer = _post(opener, mcp_url, token, init, deadline)
    version = _result(answer, "initialize").get("protocolVersion")
    session = headers.get("Mcp-Session-Id")
    _post(opener, mcp_url, token, {"jsonrpc": "2.0", "method": "notifications/initialized"},
          deadline, session, version)
    _, answer = _post(opener, mcp_url, token,
                      {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
                      deadline, session, version)
    tools = _result(answer, "tools/list").get("tools")
    latency = time.monotonic() - began
    if not isinstance(tools, list):
        raise _Failure("protocol", "tools/list answered without a tools array")
    listed = [t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
    if session:
        try:  # best effort: an unclosed session ends with the registration anyway
            _post(opener, mcp_url, token, {}, min(deadline, time.monotonic() + 2), session,
                  version, method="DELETE")
        except _Failure:
            pass
    return listed, version, latency


def compare(granted: list[str], listed: list[str]) -> dict[str, Any]:
    missing = [g for g in granted if g not in listed]
    unexpected = [t for t in listed if t not in granted]
    return {
        "equal": not missing and not unexpected,
        "granted": granted,
        "listed": listed,
        "missing": missing,
        "unexpected": unexpected,
    }


def run(
    registration_id: str,
    mcp_url: str,
    token: str,
    timeout: float,
    daemon_half: Callable[[float], dict[str, Any] | None],
) -> dict[str, Any]:
    """The probe's result (a dict, the shared JSON shape). ``daemon_half(seconds_left)``
    answers ``POST /v1/registrations/<id>/probe``'s body, ``None`` for a 404, or raises
    ``_Failure``."""
    began = time.monotonic()
    deadline = began + timeout
    p: dict[str, Any] = {
        "id": registration_id, "ok": False, "reachable": False, "latency_ms": None,
        "protocol_version": None, "tools": compare([], []), "upstreams": [],
        "upstreams_down": [], "failure": None, "elapsed_ms": 0.0,
    }
    p["tools"]["equal"] = False

    def finish(failure: _Failure | None) -> dict[str, Any]:
        p["ok"] = failure is None
        p["failure"] = failure.as_dict() if failure else None
        p["elapsed_ms"] = _ms(time.monotonic() - began)
        return p

    try:
        listed, version, latency = round_trip(mcp_url, token, deadline)
    except _Failure as f:
        return finish(f)
    p.update(reachable=True, latency_ms=_ms(latency), protocol_version=version)
    left = deadline - time.monotonic()
    if left <= 0:
        return finish(_Failure("timeout", f"no answer within {int(timeout * 1000)} ms"))
    try:
        seen = daemon_half(left)
    except _Failure as f:
        p["tools"] = compare([], listed)
        return finish(f)
    if seen is None:
        p["tools"] = compare([], listed)
        return finish(_Failure("released", "released while it was probed", 404))
    p["tools"] = compare(list(seen.get("tools", [])), listed)
    ups = list(seen.get("upstreams", []))
    p["upstreams"] = ups
    down = [u for u in ups if not u.get("answered")]
    p["upstreams_down"] = [u["id"] for u in down]
    if down:
        named = ", ".join(f"{u['id']} ({u.get('error') or 'no answer'})" for u in down)
        return finish(_Failure("upstream_down", f"did not answer: {named}"))
    return finish(None)


def checked(p: dict[str, Any], check: bool) -> dict[str, Any]:
    """``p``, or ``ProbeFailed`` raised when it failed and ``check`` is set."""
    if check and not p["ok"]:
        raise ProbeFailed(p)
    return p
