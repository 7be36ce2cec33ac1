"""The shipped-binary suite (issue 46): black-box tests of the one executable the README's quick
start builds, `cargo build --release --locked` (default features, no dev-dependency's features):
target/release/gatehouse, or $GATEHOUSE_RELEASE_BIN. Nothing here links gatehouse's Rust code;
the peers are the official MCP Python SDK (client and upstream, served by uvicorn), certificates
from a CA each test run makes (`cryptography`), and the package's pure-Python AdminClient.

A missing binary or peer fails the test; nothing skips.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PEERS = ROOT / "tests" / "peers"


def release_bin() -> str:
    path = Path(os.environ.get("GATEHOUSE_RELEASE_BIN") or ROOT / "target" / "release" / "gatehouse")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"the shipped binary {path} is missing: run `cargo build --release --locked` first")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- certificates (cryptography)


class Pki:
    """A CA made for this test run, and certificates it (or another CA) signs, as PEM files."""

    def __init__(self, tmp: Path, name: str = "gatehouse-test-ca") -> None:
        self.tmp = tmp
        self.ca_key, self.ca_cert, self.ca_file = self._ca(name)

    @staticmethod
    def _key():
        from cryptography.hazmat.primitives.asymmetric import ec

        return ec.generate_private_key(ec.SECP256R1())

    def _write(self, name: str, cert, key=None) -> tuple[Path, Path | None]:
        from cryptography.hazmat.primitives import serialization

        cert_path = self.tmp / f"{name}.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path = None
        if key is not None:
            key_path = self.tmp / f"{name}-key.pem"
            key_path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        return cert_path, key_path

    def _ca(self, name: str):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        key = self._key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        path, _ = self._write(name, cert)
        return key, cert, path

    def other_ca(self) -> "Pki":
        """A second, unrelated CA (the 'wrong CA' case)."""
        sub = self.tmp / "other-ca"
        sub.mkdir(exist_ok=True)
        return Pki(sub, "another-test-ca")

    def issue(
        self,
        name: str,
        dns: list[str] = ("localhost",),
        ips: list[str] = ("127.0.0.1",),
        *,
        expired: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = self._key()
        now = dt.datetime.now(dt.timezone.utc)
        if expired:
            before, after = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
        else:
            before, after = now - dt.timedelta(hours=1), now + dt.timedelta(days=7)
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before)
            .not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        cert_path, key_path = self._write(name, cert, key)
        assert key_path is not None
        return cert_path, key_path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    d = tmp_path / "pki"
    d.mkdir()
    return Pki(d)


# ---------------------------------------------------------------- peers


class Peer:
    """A child process announcing {"listening": PORT} on stdout; killed at teardown."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env,
        )
        self.lines: list[str] = []
        self.port = 0
        deadline = time.monotonic() + 60
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "listening" in msg:
                self.port = int(msg["listening"])
                break
        if not self.port:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            pytest.fail(f"peer {argv} did not start: {err[-2000:]}")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def venv_python() -> str:
    py = PEERS / ".venv" / "bin" / "python"
    if not py.exists():
        pytest.fail(f"{py} is missing: run tests/peers/setup.sh")
    return str(py)


@pytest.fixture
def peers():
    started: list[Peer] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> Peer:
        p = Peer(argv, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def https_upstream(start, cert: Path, key: Path, client_ca: Path | None = None) -> Peer:
    argv = [venv_python(), str(HERE / "https_upstream.py"), "--cert", str(cert), "--key", str(key)]
    if client_ca is not None:
        argv += ["--client-ca", str(client_ca)]
    return start(argv)


# ---------------------------------------------------------------- the daemon


class Daemon:
    """`gatehouse serve` (the shipped binary) in `workdir`, its stderr kept (the log)."""

    def __init__(self, workdir: Path, env: dict[str, str], args: list[str] | None = None) -> None:
        self.workdir = workdir
        self.env = env
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            [release_bin(), "serve", *(args or [])],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=env,
        )
        self.admin_url = ""
        self.data_url = ""
        deadline = time.monotonic() + 30
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if m := re.search(r"admin listener on (http://\S+)", line):
                self.admin_url = m.group(1)
            if m := re.search(r"data listener on (http://\S+)", line):
                self.data_url = m.group(1)
            if "gatehouse: ready" in line:
                break
        if not self.admin_url:
            self.kill()
            pytest.fail("gatehouse serve did not start: " + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def text(self) -> str:
        return "".join(self.log)

    def token(self, name: str = "gatehouse-admin.token") -> str:
        return (self.workdir / name).read_text().strip()

    def admin(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.admin_url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.env.get('GATEHOUSE_ADMIN_TOKEN') or self.token()}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        return status, (json.loads(raw) if raw.strip() else None)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEHOUSE_", "OTEL_"))}
    env.update(extra)
    return env


@pytest.fixture
def daemons():
    started: list[Daemon] = []

    def start(workdir: Path, env: dict[str, str], args: list[str] | None = None) -> Daemon:
        d = Daemon(workdir, env, args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill(signal.SIGTERM)


def write_config(workdir: Path, upstreams: str, extra: str = "") -> Path:
    """A config on ephemeral ports with `upstreams` (TOML [[upstreams]] tables)."""
    path = workdir / "gatehouse.toml"
    path.write_text(
        f"""listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token_file = "gatehouse-admin.token"
{extra}
[audit]
path = "audit.jsonl"
[store]
backend = "memory"
{upstreams}
"""
    )
    return path


def cli(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([release_bin(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        pytest.fail(f"gatehouse {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


# ---------------------------------------------------------------- an MCP client (the SDK)


def call_tool(mcp_url: str, token: str, tool: str, arguments: dict[str, Any] | None = None) -> tuple[list[str], str]:
    """Initializes a Streamable HTTP session with the official SDK, lists tools and calls one.
    Returns (tool names, the call's text)."""
    import anyio

    async def run() -> tuple[list[str], str]:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60.0)
        ) as http:
            async with streamable_http_client(mcp_url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    tools = [t.name for t in (await s.list_tools()).tools]
                    result = await s.call_tool(tool, arguments or {})
                    text = "".join(getattr(b, "text", "") for b in result.content)
                    is_error = getattr(result, "is_error", None)
                    if is_error is None:
                        is_error = getattr(result, "isError", False)
                    assert not is_error, text
                    return tools, text

    return anyio.run(run)


# ---------------------------------------------------------------- the pure-Python AdminClient


def admin_client_module():
    """bindings/python's `gatehouse._admin` (pure Python: urllib), loaded from the source tree
    under a package of its own, so the native extension need not be built for it."""
    name = "gatehouse_admin_only"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(ROOT / "bindings" / "python" / "python" / "gatehouse")]
        sys.modules[name] = pkg
    return importlib.import_module(f"{name}._admin")
