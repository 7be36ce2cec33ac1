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
echo "== ARCHITECTURE.md: every test its invariants name exists, nothing outside the repo cited =="
python3 tests/archcheck.py
# --- end issue 16 ---
echo "== cargo test (with --features cluster: tests/cluster.rs runs 3 real etcd members) =="
cargo test --locked --features cluster --all-targets
# ---- Python package (issues 15, 48): the wheel users install. tests/wheel.sh builds the one
# abi3 manylinux2014 wheel (maturin + zig, `wheel` profile; most of this block's time), checks
# it with auditwheel, installs it into a fresh venv (offline, from tests/peers/wheelhouse) and
# runs tests/python and demos/shared_gateway.py against it with no cargo or rustc on PATH; the
# `gatehouse` those tests run (serve included) is the wheel's console script.
echo "== Python package: wheel (maturin --zig, manylinux2014), fresh venv without cargo, pytest tests/python, demo =="
bash tests/wheel.sh
# ---- end of the Python package block
# ---- The shipped binary (issue 46): built as the README's quick start builds it (default
# features, no dev-dependency's features, no debuginfo), then a black-box suite against that
# one executable (tests/shipped: quick start, CLI verbs, kill -9 + restart, stdio and HTTPS/mTLS
# upstreams, OTLP/HTTPS, the Python AdminClient).
echo "== shipped binary: cargo build --release --locked, pytest tests/shipped =="
cargo build --release --locked
ls -l target/release/gatehouse
GATEHOUSE_RELEASE_BIN="$PWD/target/release/gatehouse" \
  tests/peers/.venv/bin/python -m pytest tests/shipped -q -p no:cacheprovider --timeout 300
# ---- end of the shipped binary block
# ---- TypeScript client (issue 48): bindings/typescript against target/debug/gatehouse (built
# by cargo test above): npm ci (committed lock), tsc (ESM + CJS), node --test (a real daemon per
# test; the `npm pack` tarball installed into a fresh folder runs the SDK example).
echo "== TypeScript client: npm ci, tsc, node --test (bindings/typescript) =="
(cd bindings/typescript && npm ci --no-audit --no-fund && npm run build \
  && GATEHOUSE_BIN="$PWD/../../target/debug/gatehouse" npm test)
# ---- end of the TypeScript client block
echo "== official MCP conformance suite, directly and through the gateway =="
bash tests/conformance/run.sh all  # current (0.1.16), next (2026-07-28) and tasks; docs/conformance.md
echo "== RELIABILITY.md =="
python3 tests/reliability.py
echo "== disk used by target/ (CI machines' disks vary) =="
du -sh target 2>/dev/null || true
