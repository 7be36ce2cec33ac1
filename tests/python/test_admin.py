"""gatehouse.AdminClient against a real `gatehouse serve` (the binary cargo built)."""

from __future__ import annotations

import time
from pathlib import Path

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
