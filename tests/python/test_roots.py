"""Roots the harness sets through the Python API (issue 18 item 4): `gw.register(...,
roots=...)`, `register_async(..., roots=...)` and `AdminClient.register(..., roots=...)`.
An upstream this registration owns (tests/fixtures/asker_server.py, `per_registration`) sends
`roots/list` outside any call; the gateway answers it from the registration's roots (the
client, which declares no roots, is never asked), and the upstream reports that answer back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import gatehouse

from conftest import ROOT, Daemon, session

ASKER = ROOT / "tests" / "fixtures" / "asker_server.py"
UPSTREAM = f"""
[[upstreams]]
id = "asker"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(ASKER))}]
sharing = "per_registration"
call_timeout_s = 10
"""

WANT = [
    {"uri": "file:///work/run-42", "name": "workspace"},
    {"uri": "file:///tmp/run-42"},
    {"uri": "file:///data", "name": "data"},
]
# The three shapes `roots` takes: a mapping, a (uri, None) pair, a bare URI; then a pair.
GIVEN: list[Any] = [{"uri": "file:///work/run-42", "name": "workspace"}, ("file:///tmp/run-42", None), ("file:///data", "data")]


async def roots_the_upstream_got(transport: str, reg: Any) -> Any:
    """`ask roots/list` (the upstream asks outside the call), then what it got back."""
    async with session(transport, reg) as s:
        r = await s.call_tool("asker.ask", {"method": "roots/list"})
        assert r.structured_content["asked"] == "roots/list", r
        got = await s.call_tool("asker.answers", {"n": 1})
        answers = got.structured_content["answers"]
        assert len(answers) == 1, answers
        return answers[0]


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["sse", "streamable"])
async def test_register_roots_answer_an_upstreams_roots_list(tmp_path: Path, transport: str) -> None:
    with gatehouse.Gateway(config_toml=UPSTREAM, audit_path=tmp_path / "a.jsonl", linger_ms=0) as gw:
        with gw.register("agent-roots", ["asker.*"], roots=GIVEN) as reg:
            answer = await roots_the_upstream_got(transport, reg)
            assert answer.get("result") == {"roots": WANT}, answer
        # register_async takes them too.
        async with gw.register_async("agent-roots-async", ["asker.*"], roots=["file:///srv/a"]) as reg:
            answer = await roots_the_upstream_got(transport, reg)
            assert answer.get("result") == {"roots": [{"uri": "file:///srv/a"}]}, answer
        # Without roots the gateway asks the client, which declared none: an error, no roots.
        with gw.register("agent-no-roots", ["asker.*"]) as reg:
            answer = await roots_the_upstream_got(transport, reg)
            assert "error" in answer and "result" not in answer, answer


def test_register_refuses_bad_roots(tmp_path: Path) -> None:
    with gatehouse.Gateway(config_toml=UPSTREAM, audit_path=tmp_path / "a.jsonl", linger_ms=0) as gw:
        with pytest.raises(gatehouse.RegistrationError, match=r"roots\[0\]\.uri"):
            gw.register("bad", ["asker.*"], roots=["https://example.com/"])
        with pytest.raises(gatehouse.RegistrationError, match="roots"):
            gw.register("bad", ["asker.*"], roots=[{"uri": "file:///a", "nmae": "typo"}])
        with pytest.raises(TypeError):
            gw.register("bad", ["asker.*"], roots="file:///a")


@pytest.mark.anyio
async def test_admin_client_register_sends_roots(tmp_path: Path) -> None:
    d = Daemon(tmp_path, upstreams=UPSTREAM)
    try:
        admin = gatehouse.AdminClient(d.admin_url, d.token_file.read_text().strip())
        with admin.register("agent-admin-roots", ["asker.*"], roots=GIVEN) as reg:
            row = next(r for r in admin.list() if r["id"] == reg.id)
            assert row["roots"] == WANT, row
            answer = await roots_the_upstream_got("streamable", reg)
            assert answer.get("result") == {"roots": WANT}, answer
    finally:
        d.stop()
