"""Upstream credentials through the embedded Python API (issue 47): `gw.register(...,
upstream_credentials=...)` sends the registration's own credential to an HTTPS upstream that
echoes who called it (tests/fixtures/whoami_https_server.py, run by the peers' Python: the
official SDK over uvicorn and TLS, a CA made per run); another registration on the same
upstream sends none; a malformed credential is refused naming the upstream, never the value.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import gatehouse

from conftest import ROOT, session, text_of

PEERS_PY = ROOT / "tests" / "peers" / ".venv" / "bin" / "python"
WHOAMI = ROOT / "tests" / "fixtures" / "whoami_https_server.py"


@pytest.fixture
def whoami(tmp_path: Path) -> Iterator[tuple[str, str]]:
    assert PEERS_PY.exists(), "tests/peers/.venv is missing: run `bash tests/peers/setup.sh`"
    d = tmp_path / "upstream"
    d.mkdir()
    p = subprocess.Popen([str(PEERS_PY), str(WHOAMI), str(d)], stdout=subprocess.PIPE, text=True)
    try:
        line = json.loads(p.stdout.readline() if p.stdout else "")
        yield f"https://127.0.0.1:{line['listening']}/mcp", line["ca"]
    finally:
        p.kill()
        p.wait()


@pytest.mark.anyio
async def test_embedded_registrations_send_only_their_own_credential(
    tmp_path: Path, whoami: tuple[str, str]
) -> None:
    url, ca = whoami
    config = (
        f'[[upstreams]]\nid = "who"\nurl = {json.dumps(url)}\n'
        f'tls_ca_file = {json.dumps(ca)}\nsharing = "shared"\n'
    )
    audit = tmp_path / "a.jsonl"
    with gatehouse.Gateway(config_toml=config, audit_path=audit, linger_ms=0) as gw:
        with gw.register(
            "py-a", ["who.*"], upstream_credentials={"who": {"bearer": "emb-tok-A1x"}}
        ) as a, gw.register("py-b", ["who.*"]) as b:
            async with session("streamable", a) as s:
                r = await s.call_tool("who.whoami", {})
                assert text_of(r) == "auth=Bearer emb-tok-A1x tenant=-", r
            async with session("sse", b) as s:
                r = await s.call_tool("who.whoami", {})
                assert text_of(r) == "auth=- tenant=-", r
        async with gw.register_async(
            "py-d",
            ["who.*"],
            upstream_credentials={
                "who": {"headers": {"Authorization": "Bearer emb-tok-D4y", "X-Tenant": "t-d"}}
            },
        ) as d:
            async with session("streamable", d) as s:
                r = await s.call_tool("who.whoami", {})
                assert text_of(r) == "auth=Bearer emb-tok-D4y tenant=t-d", r
        with pytest.raises(gatehouse.RegistrationError, match=r"upstream_credentials\.who") as e:
            gw.register("py-c", ["who.*"], upstream_credentials={"who": {"bearer": "two words"}})
        assert "two words" not in str(e.value)
    text = audit.read_text()
    assert "emb-tok-A1x" not in text and "emb-tok-D4y" not in text
    kinds = {
        (r.get("agent_id"), r.get("upstream_auth"))
        for r in map(json.loads, text.splitlines())
        if r.get("event") == "governed_mcp_call"
    }
    # py-b sent no credential: `none` is the record's default, left out (docs/audit.md).
    assert kinds == {("py-a", "registration"), ("py-b", None), ("py-d", "registration")}, kinds
