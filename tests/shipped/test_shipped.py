"""Black-box tests of the shipped binary (issue 46): target/release/gatehouse as
`cargo build --release --locked` makes it. See conftest.py."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    PEERS,
    ROOT,
    HERE,
    admin_client_module,
    call_tool,
    cli,
    daemon_env,
    free_port,
    https_upstream,
    venv_python,
    write_config,
)


def register(d, agent: str, tools: list[str]) -> dict:
    status, body = d.admin("POST", "/v1/registrations", {"agent_id": agent, "tools": tools})
    assert status == 201, (status, body)
    return body


def upstream_state(d, upstream: str) -> dict:
    status, body = d.admin("GET", "/v1/upstreams")
    assert status == 200, body
    return next(u for u in body if u["id"] == upstream)


# ------------------------------------------------------------------ quick start, CLI, restart


def test_quick_start_cli_verbs_and_kill_9_restart(tmp_path: Path, daemons) -> None:
    """The README's quick start with the shipped config: serve from a directory holding
    config/gatehouse.toml, register with the CLI, initialize and call; every CLI verb; a kill -9
    and a restart on the same address, where the same URL and token still work."""
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "gatehouse.toml", tmp_path / "config" / "gatehouse.toml")
    data, admin = free_port(), free_port()
    env = daemon_env(
        GATEHOUSE_LISTEN=f"127.0.0.1:{data}", GATEHOUSE_ADMIN_LISTEN=f"127.0.0.1:{admin}"
    )
    cli(["check-config"], tmp_path, env)
    d = daemons(tmp_path, env)
    assert d.data_url == f"http://127.0.0.1:{data}"

    out = cli(["register", "--agent-id", "support-bot", "--tool", "helpdesk.*", "--ttl", "10m",
               "--label", "run-42", "--json"], tmp_path, env).stdout
    reg = json.loads(out)
    assert reg["mcp_url"].startswith(f"http://127.0.0.1:{data}/gw/")
    tools, text = call_tool(reg["mcp_url"], reg["token"], "helpdesk.open_case",
                            {"title": "printer on fire"})
    assert "helpdesk.open_case" in tools and "helpdesk.list_notes" in tools
    assert text, "open_case answered nothing"

    listed = cli(["list"], tmp_path, env).stdout
    assert reg["id"] in listed and reg["token"] not in listed
    cli(["renew", reg["id"], "--ttl", "20m"], tmp_path, env)
    child = json.loads(cli(["register", "--parent", reg["id"], "--agent-id", "researcher",
                            "--tool", "helpdesk.list_notes", "--json"], tmp_path, env).stdout)
    cli(["reload"], tmp_path, env)

    # kill -9, then the same command again: the registration, its URL and token survive.
    d.kill(signal.SIGKILL)
    d2 = daemons(tmp_path, env)
    assert "1 registration(s) restored" in d2.text() or "2 registration(s) restored" in d2.text(), d2.text()
    tools, _ = call_tool(reg["mcp_url"], reg["token"], "helpdesk.open_case", {"title": "after"})
    assert "helpdesk.list_notes" in tools

    cli(["release", child["id"]], tmp_path, env)
    cli(["release", reg["id"]], tmp_path, env)
    assert reg["id"] not in cli(["list"], tmp_path, env).stdout
    audit = cli(["audit", "--agent-id", "support-bot"], tmp_path, env).stdout
    assert "helpdesk.open_case" in audit
    # The data port answers 404 for the released registration's URL.
    import urllib.error
    import urllib.request

    req = urllib.request.Request(reg["mcp_url"], data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {reg['token']}",
                                          "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 404


# ------------------------------------------------------------------ a foreign stdio upstream


def test_stdio_upstream_on_the_python_sdk(tmp_path: Path, daemons) -> None:
    write_config(tmp_path, f"""
[[upstreams]]
id = "py"
command = "{venv_python()}"
args = ["{HERE / 'https_upstream.py'}", "--stdio"]
""")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    reg = register(d, "a", ["py.*"])
    tools, text = call_tool(reg["mcp_url"], reg["token"], "py.echo", {"text": "over stdio"})
    assert sorted(tools) == ["py.echo", "py.whoami"]
    assert text == "echo: over stdio"


# ------------------------------------------------------------------ HTTPS upstreams


def https_config(tmp_path: Path, url: str, **keys: str) -> None:
    extra = "".join(f'{k} = "{v}"\n' for k, v in keys.items())
    write_config(tmp_path, f"""
[[upstreams]]
id = "secure"
url = "{url}"
{extra}""")


def test_https_upstream_through_tls_ca_file(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("server")
    up = https_upstream(peers, cert, key)
    plain = peers([venv_python(), str(HERE / "https_upstream.py"), "--plain"])
    write_config(tmp_path, f"""
[[upstreams]]
id = "secure"
url = "https://localhost:{up.port}/mcp"
tls_ca_file = "{pki.ca_file}"
[[upstreams]]
id = "plain"
url = "http://localhost:{plain.port}/mcp"
""")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    # The first registration of each opens its first connection (for HTTPS: the TLS handshake,
    # the platform roots not loaded as tls_ca_file replaces them), then initialize + tools/list.
    t0 = time.monotonic()
    reg = register(d, "a", ["secure.*"])
    first_https = time.monotonic() - t0
    t0 = time.monotonic()
    reg_plain = register(d, "b", ["plain.*"])
    first_http = time.monotonic() - t0
    tools, text = call_tool(reg["mcp_url"], reg["token"], "secure.whoami")
    assert text == "https"
    _, text = call_tool(reg["mcp_url"], reg["token"], "secure.echo", {"text": "sealed"})
    assert text == "echo: sealed"
    _, text = call_tool(reg_plain["mcp_url"], reg_plain["token"], "plain.whoami")
    assert text == "http"
    assert upstream_state(d, "secure")["last_error"] is None
    print(f"\nfirst registration (connect + initialize + tools/list): HTTPS {first_https * 1000:.1f} ms,"
          f" plain HTTP {first_http * 1000:.1f} ms")


def test_tls_server_name_checks_the_certificate_against_it(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("named", dns=["upstream.test"], ips=[])
    up = https_upstream(peers, cert, key)
    https_config(tmp_path, f"https://127.0.0.1:{up.port}/mcp", tls_ca_file=str(pki.ca_file),
                 tls_server_name="upstream.test")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    reg = register(d, "a", ["secure.*"])
    _, text = call_tool(reg["mcp_url"], reg["token"], "secure.whoami")
    assert text == "https"


def refused(tmp_path: Path, daemons, url: str, cause: str, fix: str, **keys: str) -> None:
    """Registration is refused naming the upstream, the cause and the fix; the log and
    GET /v1/upstreams say the same."""
    https_config(tmp_path, url, **keys)
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    status, body = d.admin("POST", "/v1/registrations", {"agent_id": "a", "tools": ["secure.*"]})
    assert status == 400, (status, body)
    msg = body["error"]
    assert 'upstream "secure"' in msg and cause in msg and fix in msg, msg
    last = upstream_state(d, "secure")["last_error"]
    assert last and cause in last and fix in last, last
    deadline = time.monotonic() + 5
    while cause not in d.text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = [line for line in d.text().splitlines() if cause in line and "upstream=secure" in line]
    assert log and "TLS" in log[0], d.text()


def test_wrong_ca_is_refused_as_unknown_issuer(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("server")
    up = https_upstream(peers, cert, key)
    other = pki.other_ca()
    refused(tmp_path, daemons, f"https://localhost:{up.port}/mcp", "unknown issuer", "tls_ca_file",
            tls_ca_file=str(other.ca_file))


def test_platform_roots_do_not_trust_a_private_ca(tmp_path: Path, pki, peers, daemons) -> None:
    """No tls_ca_file: the platform's roots (here SSL_CERT_FILE, the system bundle) are used,
    and the test CA is not among them."""
    cert, key = pki.issue("server")
    up = https_upstream(peers, cert, key)
    refused(tmp_path, daemons, f"https://localhost:{up.port}/mcp", "unknown issuer", "tls_ca_file")


def test_wrong_server_name_is_refused_as_name_mismatch(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("elsewhere", dns=["elsewhere.test"], ips=[])
    up = https_upstream(peers, cert, key)
    refused(tmp_path, daemons, f"https://localhost:{up.port}/mcp", "name mismatch", "tls_server_name",
            tls_ca_file=str(pki.ca_file))


def test_expired_certificate_is_refused_as_expired(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("old", expired=True)
    up = https_upstream(peers, cert, key)
    refused(tmp_path, daemons, f"https://localhost:{up.port}/mcp", "expired", "renew",
            tls_ca_file=str(pki.ca_file))


def test_mtls_upstream_is_reached_with_a_client_certificate(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("server")
    clients = pki.other_ca()
    ccert, ckey = clients.issue("gateway-client", dns=["gateway.test"], ips=[], client=True)
    up = https_upstream(peers, cert, key, client_ca=clients.ca_file)
    https_config(tmp_path, f"https://localhost:{up.port}/mcp", tls_ca_file=str(pki.ca_file),
                 tls_client_cert_file=str(ccert), tls_client_key_file=str(ckey))
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    reg = register(d, "a", ["secure.*"])
    _, text = call_tool(reg["mcp_url"], reg["token"], "secure.whoami")
    assert text == "mtls"


def test_mtls_upstream_refuses_the_gateway_without_a_client_certificate(tmp_path: Path, pki, peers, daemons) -> None:
    cert, key = pki.issue("server")
    clients = pki.other_ca()
    up = https_upstream(peers, cert, key, client_ca=clients.ca_file)
    refused(tmp_path, daemons, f"https://localhost:{up.port}/mcp", "client certificate refused",
            "tls_client_cert_file", tls_ca_file=str(pki.ca_file))


# ------------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    "keys, expect",
    [
        ({"tls_client_key_file": "k.pem"}, "tls_client_key_file without tls_client_cert_file"),
        ({"tls_client_cert_file": "c.pem"}, "tls_client_cert_file needs tls_client_key_file"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, 'tls_ca_file = "/nonexistent/ca.pem": cannot read it'),
    ],
)
def test_tls_keys_are_checked_at_config_load(tmp_path: Path, keys, expect) -> None:
    https_config(tmp_path, "https://localhost:1/mcp", **keys)
    r = cli(["check-config", "gatehouse.toml"], tmp_path, daemon_env(), check=False)
    assert r.returncode != 0 and expect in r.stderr and 'upstream "secure"' in r.stderr, r.stderr
    # serve refuses the same file before binding anything.
    r = cli(["serve", "--config", "gatehouse.toml"], tmp_path, daemon_env(), check=False)
    assert r.returncode != 0 and expect in r.stderr, r.stderr


def test_tls_keys_on_a_stdio_upstream_are_a_config_error(tmp_path: Path, pki) -> None:
    write_config(tmp_path, f"""
[[upstreams]]
id = "local"
command = "true"
tls_ca_file = "{pki.ca_file}"
""")
    r = cli(["check-config", "gatehouse.toml"], tmp_path, daemon_env(), check=False)
    assert r.returncode != 0 and "stdio" in r.stderr and "remove them" in r.stderr, r.stderr


# ------------------------------------------------------------------ OTLP over HTTPS


def test_otlp_https_receiver_gets_the_spans(tmp_path: Path, pki, peers, daemons) -> None:
    """The exporter trusts the platform's roots; SSL_CERT_FILE names the test CA."""
    cert, key = pki.issue("collector")
    rx = peers([venv_python(), str(PEERS / "otel_receiver.py"), "--tls", str(cert), str(key)])
    write_config(tmp_path, """
[[upstreams]]
id = "helpdesk"
command = "@self"
args = ["demo-upstream"]
""", extra=f"""[telemetry]
endpoint = "https://localhost:{rx.port}"
delay_ms = 100
""")
    d = daemons(tmp_path, daemon_env(SSL_CERT_FILE=str(pki.ca_file)), ["--config", "gatehouse.toml"])
    reg = register(d, "a", ["helpdesk.*"])
    call_tool(reg["mcp_url"], reg["token"], "helpdesk.open_case", {"title": "traced"})
    deadline = time.monotonic() + 20
    spans: list[dict] = []
    while time.monotonic() < deadline:
        spans = [json.loads(l)["span"] for l in list(rx.lines) if '"span"' in l]
        if any(s["name"].startswith("tools/call") for s in spans):
            break
        time.sleep(0.1)
    names = [s["name"] for s in spans]
    assert any(n.startswith("tools/call") for n in names), (names, d.text()[-3000:])


# ------------------------------------------------------------------ the Python admin client


def test_python_admin_client_against_the_shipped_daemon(tmp_path: Path, daemons) -> None:
    write_config(tmp_path, """
[[upstreams]]
id = "helpdesk"
command = "@self"
args = ["demo-upstream"]
""")
    d = daemons(tmp_path, daemon_env(), ["--config", "gatehouse.toml"])
    admin = admin_client_module()
    client = admin.AdminClient(d.admin_url, d.token())
    with client.register("py-agent", ["helpdesk.*"], ttl_s=600, label="shipped") as reg:
        assert any(r["id"] == reg.id for r in client.list())
        tools, _ = call_tool(reg.mcp_url, reg.token, "helpdesk.open_case", {"title": "after"})
        assert "helpdesk.open_case" in tools
        client.renew(reg.id, 900)
    assert all(r["id"] != reg.id for r in client.list())
    assert client.release(reg.id) is False
