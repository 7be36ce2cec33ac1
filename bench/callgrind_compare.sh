#!/usr/bin/env bash
# Instructions per proxied `tools/call` at two git revisions, side by side: for refactors that
# must not make the call dearer. Counted as bench/callgrind.sh counts them (callgrind, CLIENTS
# clients, (I(N2) − I(N1)) / (N2 − N1) over the server side's threads, the `profiling` build),
# for the gateway's two transports: "gateway → stdio, Streamable HTTP" and "gateway → stdio,
# legacy SSE".
#
#   bench/callgrind_compare.sh BASE_REV [HEAD_REV]     HEAD_REV: HEAD by default
#
# Each revision's tree is exported (`git archive`, so the repository gets no new worktree) to
# $CG_COMPARE_DIR/<sha> (default /tmp/gatehouse-cg-compare) and built there with its own
# CARGO_TARGET_DIR, seeded with a copy of this checkout's target/profiling when there is one (the
# dependencies are then not rebuilt; the gatehouse crate is). Each bench binary keeps its own
# `gatehouse` (the echo upstream it spawns). Built trees are kept: a second comparison with
# the same revision does not rebuild it. A revision from before the `profiling` profile
# (issue 46) is built with `--profile bench` (release, which then had debuginfo).
#
# The two revisions are measured alternately, BASE then HEAD for each row, CG_COMPARE_REPEAT
# times (1 by default; each figure printed, the Δ on the means). Comparing a revision with
# itself measures the noise: instruction counts repeat within about ±0.7% for one binary (the
# polls and wake-ups of 8 clients depend on timing), so a Δ inside ±1% is not a difference.
# CG_COMPARE_MINIMAL=1 adds the minimal proxy (the bench's own baseline, no gateway code) as a
# control row. Here: 1.5-4 minutes to build a revision (seeded), then ~30-60 s per row,
# revision and repetition (two callgrind runs).
# Needs valgrind. Not run by tests/run.sh or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/callgrind_common.sh
[[ $# -ge 1 ]] || { echo "usage: bench/callgrind_compare.sh BASE_REV [HEAD_REV]" >&2; exit 2; }
BASE=$(git rev-parse --verify "$1^{commit}")
HEAD_SHA=$(git rev-parse --verify "${2:-HEAD}^{commit}")
CLIENTS="${CLIENTS:-8}"
N1=500
N2=2500
REPEAT="${CG_COMPARE_REPEAT:-1}"
DIR="${CG_COMPARE_DIR:-/tmp/gatehouse-cg-compare}"
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd)
EXCLUDE='role::Client|bench_role_client_thread|bench_role_upstream_thread'

# The bench binary of revision SHA (built once; its path printed).
bench_of() {
  local sha="$1" src="$DIR/$1/src" tgt="$DIR/$1/target" profile=profiling bin
  if [[ -x "$DIR/$sha/bench" ]]; then echo "$DIR/$sha/bench"; return; fi
  if [[ ! -d "$src" ]]; then
    mkdir -p "$src"
    git archive "$sha" | tar -x -C "$src"
  fi
  grep -q '^\[profile\.profiling\]' "$src/Cargo.toml" || profile=bench
  local out="$profile"; [[ "$profile" == bench ]] && out=release
  if [[ ! -d "$tgt/$out" && -d "target/$out" ]]; then
    echo "   seeding $tgt/$out from target/$out" >&2
    mkdir -p "$tgt" && cp -a "target/$out" "$tgt/$out"
  fi
  echo "   building ${sha:0:10} (--profile $profile; log $DIR/$sha/build.log)" >&2
  bin=$(cd "$src" && CARGO_TARGET_DIR="$tgt" cargo bench --locked --profile "$profile" --no-run --bench gateway 2>&1 \
    | tee "$DIR/$sha/build.log" | sed -n 's/.*Executable benches\/gateway\/main.rs (\(.*\))/\1/p' | tail -1)
  [[ -x "$bin" ]] || { echo "callgrind_compare.sh: the bench of ${sha:0:10} did not build (see $DIR/$sha/build.log)" >&2; return 1; }
  # Kept by its path in the target directory (its `gatehouse` beside it is compiled in).
  ln -sf "$bin" "$DIR/$sha/bench"
  echo "$DIR/$sha/bench"
}

echo "== build" >&2
BIN_BASE=$(bench_of "$BASE")
BIN_HEAD=$(bench_of "$HEAD_SHA")

ROWS=("gateway → stdio, streamable|gateway → stdio, Streamable HTTP"
      "gateway → stdio, legacy sse|gateway → stdio, legacy SSE")
[[ "${CG_COMPARE_MINIMAL:-0}" == 1 ]] && ROWS=("ceiling: minimal|minimal proxy (control: bench code only)" "${ROWS[@]}")

b="${BASE:0:10}"
h="${HEAD_SHA:0:10}"
echo "Instructions per proxied tools/call (server side; callgrind; $CLIENTS clients; ($N2 - $N1 calls); $REPEAT run(s) each, alternating):"
echo
echo "| row | $b | $h | Δ | $b without SHA-256 | $h without SHA-256 | Δ without SHA-256 |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for spec in "${ROWS[@]}"; do
  target="${spec%%|*}"
  name="${spec#*|}"
  ab=() ah=() nb=() nh=()
  for ((i = 0; i < REPEAT; i++)); do
    echo "== $name: $b (run $((i + 1)))" >&2
    read -r all nosha _ <<<"$(cg_per_call "$BIN_BASE" "$target")"
    ab+=("$all") nb+=("$nosha")
    echo "== $name: $h (run $((i + 1)))" >&2
    read -r all nosha _ <<<"$(cg_per_call "$BIN_HEAD" "$target")"
    ah+=("$all") nh+=("$nosha")
  done
  python3 - "$name" "${ab[*]}" "${ah[*]}" "${nb[*]}" "${nh[*]}" <<'EOF'
import sys
name, *cols = sys.argv[1:]
ab, ah, nb, nh = ([int(x) for x in c.split()] for c in cols)
mean = lambda v: sum(v) / len(v)
fmt = lambda v: " / ".join(f"{x:,}" for x in v)
d = lambda b, h: f"{100 * (mean(h) - mean(b)) / mean(b):+.2f}%"
print(f"| {name} | {fmt(ab)} | {fmt(ah)} | {d(ab, ah)} | {fmt(nb)} | {fmt(nh)} | {d(nb, nh)} |")
EOF
done
