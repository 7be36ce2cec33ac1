"""gatehouse.AdminClient against a real `gatehouse serve` (the binary cargo built)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import gatehouse
from conftest import Daemon, session, text_of


@pytest.fixture
def daemon_with_helpdesk(tmp_path: Path):
    d = Daemon(tmp_path, upstreams='[[upstreams]]\nid = "helpdesk"\ncommand = "@self"\nargs = ["demo-upstream"]\nsharing = "leased"\n')
    yield d
    d.stop()


def test_finds_url_and_token_like_the_cli(
    daemon_with_helpdesk: Daemon, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    d = daemon_with_helpdesk
    for k in ("GATEHOUSE_ADMIN_URL", "GATEHOUSE_ADMIN_TOKEN", "GATEHOUSE_CONFIG", "GATEHOUSE_ADMIN_LISTEN"):
        monkeypatch.delenv(k, raising=False)
    # URL from the environment, token from the config's admin_token_file.
    monkeypatch.setenv("GATEHOUSE_ADMIN_URL", d.admin_url)
    monkeypatch.setenv("GATEHOUSE_CONFIG", str(d.config))
    assert gatehouse.AdminClient().list() == []
    # Both from the environment (no config read at all).
    monkeypatch.setenv("GATEHOUSE_ADMIN_TOKEN", d.token_file.read_text().strip())
    monkeypatch.setenv("GATEHOUSE_CONFIG", str(tmp_path / "absent.toml"))
    assert gatehouse.AdminClient().list() == []
    # The admin listener from GATEHOUSE_ADMIN_LISTEN, as the CLI applies it to the config.
    monkeypatch.delenv("GATEHOUSE_ADMIN_URL")
    with pytest.raises(gatehouse.AdminError, match="cannot read the config"):
        gatehouse.AdminClient()
    monkeypatch.setenv("GATEHOUSE_CONFIG", str(d.config))
    monkeypatch.setenv("GATEHOUSE_ADMIN_LISTEN", d.admin_url.removeprefix("http://"))
    assert gatehouse.AdminClient().url == d.admin_url
    # Nothing to find: the message says what to set.
    monkeypatch.delenv("GATEHOUSE_ADMIN_TOKEN")
    d.token_file.rename(d.token_file.with_suffix(".moved"))
    with pytest.raises(gatehouse.AdminError, match="GATEHOUSE_ADMIN_TOKEN"):
        gatehouse.AdminClient()
    with pytest.raises(gatehouse.AdminError, match="401"):
        gatehouse.AdminClient(d.admin_url, "wrong-token").list()
    d.token_file.with_suffix(".moved").rename(d.token_file)
    with pytest.raises(gatehouse.AdminError, match="is `gatehouse serve` running"):
        gatehouse.AdminClient("http://127.0.0.1:1", "t").list()


def test_register_list_renew_release_and_background_renewal(daemon_with_helpdesk: Daemon) -> None:
    d = daemon_with_helpdesk
    admin = gatehouse.AdminClient(d.admin_url, d.token_file.read_text().strip())
    with pytest.raises(gatehouse.UnknownGrant, match="nosuch"):
        admin.register("agent-d", ["nosuch.*"])
    with admin.register("agent-d", ["helpdesk.*"], label="run-d", ttl_s=2) as reg:
        assert "helpdesk.open_case" in reg.tools and reg.token and reg.sse_url.endswith("/sse")
        rows = admin.list()
        assert [r["id"] for r in rows] == [reg.id]
        assert rows[0]["agent_id"] == "agent-d" and "token" not in rows[0]

        async def call() -> str:
            async with session("sse", reg) as s:
                r = await s.call_tool("helpdesk.open_case", {"title": "printer"})
                assert not r.is_error
                return text_of(r)

        assert anyio.run(call)
        time.sleep(4.5)  # more than twice the TTL: only the background renewal keeps it alive
        assert [r["id"] for r in admin.list()] == [reg.id]
        assert reg.renewals >= 2 and reg.renew_error is None
        assert admin.renew(reg.id, 30)["expires_at"]
    assert admin.list() == []
    assert admin.release(reg.id) is False
    with pytest.raises(gatehouse.AdminError) as e:
        admin.renew(reg.id)
    assert e.value.status == 404
    # Without renewal a TTL ends the registration.
    short = admin.register("agent-e", ["helpdesk.*"], ttl_s=1, renew=False)
    deadline = time.monotonic() + 10
    while admin.list() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert admin.list() == []
    assert short.release() is False
    # Explicit release of a live one.
    other = admin.register("agent-f", ["helpdesk.open_case"])
    assert admin.release(other.id) is True
    assert admin.list() == []


def test_approvals_wait_approve_and_deny_while_the_sdk_client_waits(daemon_with_helpdesk: Daemon) -> None:
    """Issue 49: a call an `approve` rule holds is seen by approvals(wait=…), approved (it runs)
    or denied (the client gets the reason); deciding twice is a 409, an unknown id a 404."""
    d = daemon_with_helpdesk
    admin = gatehouse.AdminClient(d.admin_url, d.token_file.read_text().strip())
    rule = [{"id": "cases_need_ok", "when": "tool.name == 'helpdesk.open_case'", "effect": "approve",
             "approver": "harness", "timeout_s": 60}]
    with admin.register("agent-a", ["helpdesk.*"], policy=rule) as reg:
        assert admin.approvals() == []
        results: list[Any] = []

        async def calls() -> None:
            async with session("streamable", reg) as s:
                for title in ["approved", "denied"]:
                    results.append(await s.call_tool("helpdesk.open_case", {"title": title}))

        def harness() -> None:
            for decision in ["approve", "deny"]:
                [p] = admin.approvals(wait=20)
                assert p["tool"] == "helpdesk.open_case" and p["agent_id"] == "agent-a"
                assert p["arguments"] == {"title": "approved" if decision == "approve" else "denied"}
                if decision == "approve":
                    admin.approve(p["id"])
                else:
                    admin.deny(p["id"], reason="not on a Sunday")
                with pytest.raises(gatehouse.AdminError) as e:
                    admin.approve(p["id"])
                assert e.value.status == 409

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(calls)
                await anyio.to_thread.run_sync(harness)

        anyio.run(both)
        assert not results[0].is_error, text_of(results[0])
        assert results[1].is_error and "not on a Sunday" in text_of(results[1])
        with pytest.raises(gatehouse.AdminError) as e:
            admin.deny("no-such-approval")
        assert e.value.status == 404
