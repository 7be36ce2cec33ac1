#!/usr/bin/env bash
# Creates the venv of demos/per_execution_baseline.py (git-ignored: demos/.baseline-venv) with
# the versions the failure was measured with, and runs the baseline if asked:
#   bash demos/baseline-venv.sh          # create (idempotent)
#   bash demos/baseline-venv.sh --run    # create, then run the baseline (7 executions)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.baseline-venv"
pins=(mcp==1.30.0 uvicorn==0.54.0 starlette==1.10.0 sse-starlette==3.4.11)
stamp="$venv/.stamp"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${pins[*]}" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q "${pins[@]}"
  "$venv/bin/python" -m pip check
  echo "${pins[*]}" > "$stamp"
fi
if [[ "${1:-}" == "--run" ]]; then
  shift
  exec "$venv/bin/python" "$here/per_execution_baseline.py" "$@"
fi
