"""Child registrations for sub-agents (issue 39) through a real `gatehouse serve`, made with
gatehouse.AdminClient and the embedded gateway, driven by the official MCP Python SDK: a parent
with three tools and a child with one; the child lists and calls only its tool, over legacy SSE
and Streamable HTTP; a child asking for a tool its parent lacks is refused (400 naming it);
releasing the parent releases the child first and both URL sets answer 404; the child's audit
records carry its parent and `agent_path`.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

import gatehouse
from conftest import Daemon, http_status, session, text_of


@pytest.fixture
def daemon(tmp_path: Path):
    d = Daemon(
        tmp_path,
        upstreams='[[upstreams]]\nid = "helpdesk"\ncommand = "@self"\nargs = ["demo-upstream"]\nsharing = "leased"\n',
    )
    yield d
    d.stop()


def test_a_child_of_a_daemon_registration_sees_and_calls_its_one_tool(daemon: Daemon, tmp_path: Path) -> None:
    admin = gatehouse.AdminClient(daemon.admin_url, daemon.token_file.read_text().strip())
    parent = admin.register(
        "planner", ["helpdesk.open_case", "helpdesk.add_note", "helpdesk.list_notes"], label="run-7", ttl_s=600
    )
    assert sorted(parent.tools) == ["helpdesk.add_note", "helpdesk.list_notes", "helpdesk.open_case"]
    with pytest.raises(gatehouse.RegistrationError, match="not among the parent's tools: helpdesk.delete_everything"):
        parent.child("researcher", ["helpdesk.open_case", "helpdesk.delete_everything"])
    # The CLI verb makes one too (`gatehouse register --parent`), released here at once.
    import os
    import subprocess

    from conftest import gatehouse_bin

    env = dict(os.environ, GATEHOUSE_ADMIN_URL=daemon.admin_url, GATEHOUSE_ADMIN_TOKEN=daemon.token_file.read_text().strip())
    out = subprocess.run(
        [gatehouse_bin(), "register", "--parent", parent.id, "--agent-id", "cli-kid", "--tool", "helpdesk.list_notes", "--json"],
        capture_output=True, text=True, env=env, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["tools"] == ["helpdesk.list_notes"]
    bad = subprocess.run(
        [gatehouse_bin(), "register", "--parent", parent.id, "--agent-id", "cli-kid", "--tool", "helpdesk.add_note_slow"],
        capture_output=True, text=True, env=env, timeout=30,
    )
    assert bad.returncode != 0 and "helpdesk.add_note_slow" in bad.stderr, bad.stderr
    assert admin.release(made["id"])
    child = parent.child("researcher", ["helpdesk.open_case"], ttl_s=3600)
    assert child.tools == ["helpdesk.open_case"]
    # Its lease ends no later than the parent's (it asked for an hour); compared as times.
    assert child.expires_at is not None and parent.expires_at is not None
    from datetime import datetime
    def at(t: str) -> float:
        return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
    assert at(child.expires_at) <= at(parent.expires_at), (child.expires_at, parent.expires_at)
    shown = {r["id"]: r for r in admin.list()}
    assert shown[child.id]["parent"] == parent.id
    assert shown[parent.id]["children"] == [child.id]
    assert shown[child.id]["agent_path"] == ["planner", "researcher"]

    async def use(transport: str) -> None:
        async with session(transport, child) as s:
            listed = await s.list_tools()
            assert [t.name for t in listed.tools] == ["helpdesk.open_case"]
            r = await s.call_tool("helpdesk.open_case", {"title": "from the sub-agent"})
            assert not r.is_error, r
            assert "case" in text_of(r).lower()
            from mcp.shared.exceptions import MCPError

            with pytest.raises(MCPError, match="Unknown tool: helpdesk.add_note"):
                await s.call_tool("helpdesk.add_note", {"text": "x"})

    anyio.run(use, "sse")
    anyio.run(use, "streamable")
    # The parent's token does not open the child's paths.
    assert http_status("GET", child.sse_url, parent.token) == 401
    # Releasing the parent releases the child first; every URL answers 404.
    assert parent.release()
    for url, token in [(child.sse_url, child.token), (child.mcp_url, child.token), (parent.sse_url, parent.token)]:
        assert http_status("GET", url, token) == 404, url
    assert not child.release()  # already gone
    records = [json.loads(line) for line in (tmp_path / "daemon-audit.jsonl").read_text().splitlines()]
    mine = [r for r in records if r.get("registration_id") == child.id]
    assert mine and all(r["parent_registration_id"] == parent.id and r["agent_path"] == ["planner", "researcher"] for r in mine)
    calls = [r for r in mine if r["event"] == "governed_mcp_call"]
    assert {r["outcome"] for r in calls} >= {"ok"}
    order = [(r["event"], r.get("registration_id")) for r in records if r["event"] == "registration_released"]
    assert order.index(("registration_released", child.id)) < order.index(("registration_released", parent.id))


def test_an_embedded_registration_makes_a_child(tmp_path: Path) -> None:
    @gatehouse.tool
    def lookup(q: str) -> str:
        """Looks something up."""
        return f"found {q}"

    @gatehouse.tool
    def write(text: str) -> str:
        """Writes something."""
        return f"wrote {text}"

    with gatehouse.Gateway(audit_path=str(tmp_path / "audit.jsonl")) as gw:
        gw.add_tool(lookup)
        gw.add_tool(write)
        keep = gw.register("bystander", ["write"])  # keeps the server up for the 404 below
        with gw.register("planner", ["lookup", "write"]) as parent:
            with pytest.raises(gatehouse.RegistrationError, match="not among the parent's tools"):
                parent.child("researcher", ["other"])
            child = parent.child("researcher", ["lookup"])
            assert child.tools == ["lookup"]

            async def use() -> None:
                async with session("streamable", child) as s:
                    assert [t.name for t in (await s.list_tools()).tools] == ["lookup"]
                    assert text_of(await s.call_tool("lookup", {"q": "x"})) == "found x"

            anyio.run(use)
        # The parent's exit released the child too.
        assert http_status("GET", child.mcp_url, child.token) == 404
        keep.release()
