"""The probe (issue 48) from Python: ``Registration.probe()`` on an embedded gateway and
``AdminRegistration.probe()`` / ``AdminClient.probe()`` on a real `gatehouse serve`, through
real sockets. Healthy: reachable, tools as granted, upstreams answered; released → ``released``
(404); a wrong token → ``refused`` (401); an upstream that cannot answer → ``upstream_down``
naming it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import gatehouse
from conftest import Daemon, gatehouse_bin

KEYS = {
    "id", "ok", "reachable", "latency_ms", "protocol_version", "tools", "upstreams",
    "upstreams_down", "failure", "elapsed_ms",
}


@gatehouse.tool(description="Echo")
def echo(text: str = "") -> str:
    return text


def test_embedded_probe_healthy_then_released(gw: gatehouse.Gateway) -> None:
    keep = gw.register("keeper", tools=[echo])  # the server stays up after the release below
    reg = gw.register("prober", tools=[echo])
    p = reg.probe(timeout=10)
    assert set(p) == KEYS
    assert p["ok"] and p["reachable"] and p["failure"] is None
    assert p["tools"]["equal"] and p["tools"]["listed"] == reg.tools == ["echo"]
    assert p["upstreams"] == [] and p["upstreams_down"] == []
    assert p["latency_ms"] > 0
    assert reg.token not in repr(p)
    reg.release()
    with pytest.raises(gatehouse.ProbeFailed) as e:
        reg.probe(timeout=10)
    assert e.value.reason == "released" and e.value.status == 404
    assert e.value.probe["reachable"] is False
    # check=False returns what it saw instead of raising.
    p = reg.probe(timeout=10, check=False)
    assert p["ok"] is False and p["failure"]["reason"] == "released"
    keep.release()


@pytest.fixture
def flaky_daemon(tmp_path: Path):
    down = tmp_path / "down"
    script = f'if [ -e "{down}" ]; then exit 1; fi; exec "{gatehouse_bin()}" demo-upstream'
    script = script.replace("\\", "\\\\").replace('"', '\\"')
    d = Daemon(
        tmp_path,
        upstreams=f'[[upstreams]]\nid = "helpdesk"\ncommand = "sh"\nargs = ["-c", "{script}"]\n'
        'sharing = "shared"\ncall_timeout_s = 5\n',
    )
    d.down = down  # type: ignore[attr-defined]
    yield d
    d.stop()


def upstream_pids(admin: gatehouse.AdminClient) -> list[int]:
    status, ups = admin._call("GET", "/v1/upstreams")
    assert status == 200
    return [c["pid"] for u in ups for c in u["connections"] if c.get("pid")]


def test_admin_probe_healthy_refused_upstream_down_released(flaky_daemon: Daemon) -> None:
    d = flaky_daemon
    admin = gatehouse.AdminClient(d.admin_url, d.token_file.read_text().strip())
    reg = admin.register("prober", ["helpdesk.*"])
    p = reg.probe(timeout=10)
    assert set(p) == KEYS
    assert p["ok"] and p["tools"]["equal"] and p["tools"]["granted"] == reg.tools
    assert [u["id"] for u in p["upstreams"]] == ["helpdesk"]
    assert p["upstreams"][0]["answered"] is True
    # Without the URL, the daemon says where it serves the registration.
    assert admin.probe(reg.id, reg.token, timeout=10)["ok"]
    # A wrong token: refused, before anything else is asked.
    with pytest.raises(gatehouse.ProbeFailed) as e:
        admin.probe(reg.id, "not-the-token", mcp_url=reg.mcp_url, timeout=10)
    assert e.value.reason == "refused" and e.value.status == 401
    # The upstream dies and cannot come back: named.
    d.down.write_text("")  # type: ignore[attr-defined]
    pids = upstream_pids(admin)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(gatehouse.ProbeFailed) as e:
        reg.probe(timeout=10)
    assert e.value.reason == "upstream_down", e.value
    assert e.value.probe["upstreams_down"] == ["helpdesk"]
    assert e.value.probe["reachable"] is True
    assert "helpdesk" in str(e.value)
    # Released: 404 from the data plane, at once.
    reg.release()
    with pytest.raises(gatehouse.ProbeFailed) as e:
        reg.probe(timeout=30)
    assert e.value.reason == "released" and e.value.status == 404
