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
echo "== module graph (no import circle; layering as ARCHITECTURE.md says) =="
python3 tests/modgraph.py
# --- end issue 16 ---
echo "== cargo test =="
cargo test --locked --all-targets
echo "== official MCP conformance suite, directly and through the gateway =="
bash tests/conformance/run.sh all  # current (0.1.16) and next (2026-07-28); docs/conformance.md
echo "== RELIABILITY.md =="
python3 tests/reliability.py
