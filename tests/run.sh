#!/usr/bin/env bash
# The whole test suite: installs the Python and Node peers the tests drive (into git-ignored
# folders under tests/peers/), then runs every Rust test. A missing peer fails; nothing skips.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== peers (Python mcp SDK, TypeScript SDK, server-everything) =="
bash tests/peers/setup.sh --conformance
# --- issue 16: static checks first, so they fail fast (format, lints, module graph) ---
echo "== cargo fmt --check =="
cargo fmt --check
echo "== cargo clippy (all targets, warnings denied) =="
cargo clippy --locked --all-targets -- -D warnings
# The cluster backend (etcd, issue 36) is behind a cargo feature (its client needs protoc):
# linted and tested too, so CI builds both ways.
echo "== cargo clippy --features cluster (all targets, warnings denied) =="
cargo clippy --locked --features cluster --all-targets -- -D warnings
# The Python binding is its own workspace member: linted the same way (issue 15).
cargo clippy --locked -p gatehouse-python --all-targets -- -D warnings
echo "== module graph (no import circle; layering as ARCHITECTURE.md says) =="
python3 tests/modgraph.py
# --- end issue 16 ---
echo "== cargo test (with --features cluster: tests/cluster.rs runs 3 real etcd members) =="
cargo test --locked --features cluster --all-targets
# ---- Python package (issue 15): build bindings/python into the peers' venv, run tests/python.
# maturin builds the extension in the `wheel` profile, release without debuginfo, as
# `pip install ./bindings/python` does (most of this block's time); pytest drives it with the
# MCP Python SDK and a real `gatehouse serve` (target/debug/gatehouse, built by cargo test above).
echo "== Python package: maturin develop (wheel profile), pytest tests/python =="
VIRTUAL_ENV="$PWD/tests/peers/.venv" PATH="$PWD/tests/peers/.venv/bin:$PATH" \
  tests/peers/.venv/bin/python -m maturin develop --profile wheel --locked -q -m bindings/python/Cargo.toml
GATEHOUSE_BIN="$PWD/target/debug/gatehouse" \
  tests/peers/.venv/bin/python -m pytest tests/python -q -p no:cacheprovider --timeout 300
# ---- end of the Python package block
# ---- TypeScript client (issue 48): bindings/typescript against target/debug/gatehouse (built
# by cargo test above): npm ci (committed lock), tsc (ESM + CJS), node --test (a real daemon per
# test; the `npm pack` tarball installed into a fresh folder runs the SDK example).
echo "== TypeScript client: npm ci, tsc, node --test (bindings/typescript) =="
(cd bindings/typescript && npm ci --no-audit --no-fund && npm run build \
  && GATEHOUSE_BIN="$PWD/../../target/debug/gatehouse" npm test)
# ---- end of the TypeScript client block
echo "== official MCP conformance suite, directly and through the gateway =="
bash tests/conformance/run.sh all  # current (0.1.16) and next (2026-07-28); docs/conformance.md
echo "== RELIABILITY.md =="
python3 tests/reliability.py
echo "== disk used by target/ (CI machines' disks vary) =="
du -sh target 2>/dev/null || true
