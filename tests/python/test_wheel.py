"""The ``gatehouse`` command an installed package brings (issue 48): a console script calling
``gatehouse._native.main``, so every CLI verb — ``serve`` included — runs from the native
module the embedded API uses. tests/wheel.sh runs this file against the wheel installed in a
fresh venv with no cargo or rustc on PATH."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

import gatehouse
from conftest import session, text_of

VERBS = ["serve", "register", "renew", "release", "reload", "list", "audit", "check-config"]


def command() -> str:
    exe = Path(sys.executable).parent / "gatehouse"
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        pytest.fail(f"no `gatehouse` command beside {sys.executable}: install the package (wheel)")
    return str(exe)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEHOUSE_")}
    env.update(extra)
    return env


def test_the_command_is_a_console_script_into_the_native_module() -> None:
    exe = command()
    first = Path(exe).read_bytes().split(b"\n", 1)[0]
    # A Python launcher, not a copied binary: the verbs run in gatehouse._native.
    assert first.startswith(b"#!") and b"python" in first, first
    assert "gatehouse._cli" in Path(exe).read_text()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert re.fullmatch(r"gatehouse \d+\.\d+\.\d+\n", version.stdout), version.stdout
    helped = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s", helped.stdout, re.M), (verb, helped.stdout)
    # Usage errors are clap's, with its exit status, and no Python traceback.
    bad = subprocess.run([exe, "no-such-verb"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2, bad
    assert "no-such-verb" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    # `python -m gatehouse` is the same command.
    mod = subprocess.run(
        [sys.executable, "-m", "gatehouse", "--version"], capture_output=True, text=True, timeout=60
    )
    assert mod.returncode == 0 and mod.stdout == version.stdout, mod
    # The shipped config travels in the package and validates.
    shipped = Path(gatehouse.__file__).parent / "gatehouse.toml"
    checked = subprocess.run(
        [exe, "check-config", str(shipped)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked


def test_serve_and_the_admin_verbs_from_the_package(tmp_path: Path) -> None:
    """`pip install gatehouse-*.whl && gatehouse serve` in an empty folder: the shipped config
    (its `@self` helpdesk upstream is this same command), the CLI verbs against it, a reload,
    and a clean stop."""
    exe = command()
    env = clean_env(GATEHOUSE_LISTEN="127.0.0.1:0", GATEHOUSE_ADMIN_LISTEN="127.0.0.1:0")
    proc = subprocess.Popen(
        [exe, "serve"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "gatehouse: ready" in line:
                break
        log = "".join(lines)
        assert "gatehouse: ready" in log, log
        admin = re.search(r"admin listener on (http://\S+)", log)
        assert admin, log
        # State lands where it ran (the shipped config's relative paths).
        assert (tmp_path / "gatehouse-admin.token").is_file(), log
        assert (tmp_path / "gatehouse-store.sqlite").is_file(), log

        verbs_env = dict(env, GATEHOUSE_ADMIN_URL=admin.group(1))

        def verb(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [exe, *args], cwd=tmp_path, env=verbs_env, capture_output=True, text=True, timeout=60
            )

        made = verb("register", "--agent-id", "wheel-agent", "--tool", "helpdesk.*", "--json")
        assert made.returncode == 0, made
        reg = json.loads(made.stdout)
        assert "helpdesk.open_case" in reg["tools"], reg

        async def call() -> None:
            r = SimpleNamespace(token=reg["token"], mcp_url=reg["mcp_url"], sse_url=reg["sse_url"])
            async with session("streamable", r) as s:
                out = await s.call_tool("helpdesk.open_case", {"title": "from the wheel"})
                assert not out.is_error, text_of(out)

        anyio.run(call)
        listed = verb("list")
        assert listed.returncode == 0 and reg["id"] in listed.stdout, listed
        assert verb("reload").returncode == 0
        assert verb("release", reg["id"]).returncode == 0
        audit = verb("audit", "--agent-id", "wheel-agent", "--json")
        assert audit.returncode == 0 and "helpdesk.open_case" in audit.stdout, audit

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        rest = proc.stderr.read()
        assert "gatehouse: stopped" in rest and "Traceback" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigint_stops_the_daemon_cleanly_without_a_traceback(tmp_path: Path) -> None:
    """The interpreter's SIGINT handler is out of the way: the daemon's own clean stop runs,
    and no KeyboardInterrupt is raised once it returns."""
    exe = command()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f'listen = "127.0.0.1:0"\nadmin_listen = "127.0.0.1:0"\n'
        f'admin_token_file = "{tmp_path / "t"}"\n[audit]\npath = "{tmp_path / "a.jsonl"}"\n'
    )
    proc = subprocess.Popen(
        [exe, "serve", "--config", str(cfg)],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        seen = ""
        while "gatehouse: ready" not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen += line
        assert "gatehouse: ready" in seen, seen
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        rest = proc.stderr.read()
        assert "SIGINT: shutting down" in rest and "gatehouse: stopped" in rest, rest
        assert "KeyboardInterrupt" not in rest and "Traceback" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()



def test_an_embedded_self_upstream_runs_the_package_command_without_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`command = "@self"` in an embedded gateway's config is the installed package's own
    `gatehouse` command, found beside the interpreter with no PATH and no GATEHOUSE_SELF_EXE."""
    command()
    monkeypatch.delenv("PATH", raising=False)
    monkeypatch.delenv("GATEHOUSE_SELF_EXE", raising=False)
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f'listen = "127.0.0.1:0"\nlinger_ms = 0\n[audit]\npath = "{tmp_path / "a.jsonl"}"\n'
        '[[upstreams]]\nid = "helpdesk"\ncommand = "@self"\nargs = ["demo-upstream"]\n'
    )
    with gatehouse.Gateway(cfg) as gw:
        with gw.register("self-agent", tools=["helpdesk.*"]) as reg:

            async def call() -> None:
                async with session("streamable", reg) as s:
                    out = await s.call_tool("helpdesk.open_case", {"title": "self"})
                    assert not out.is_error, text_of(out)

            anyio.run(call)
