#!/usr/bin/env bash
# Instructions per proxied `tools/call`, counted by callgrind, for the gateway and the minimal
# proxy (with and without the required work) in the same run.
#
# Unlike the wall-clock shares of bench/run.sh, which this shared 2-core VM moves by ±15 points
# between rounds of one run, an instruction count repeats within about ±0.6% for the same binary
# and inputs whatever else the machine does (with 8 clients the polls and wake-ups per call
# still depend on timing: ±350 instructions per gateway row, ±400 on the twin, run to run). Each target runs twice under callgrind with exactly
# N calls per run (`--calls`, no warm-up); (I(2,500) − I(500)) / 2,000 over the server side's
# threads (every thread but the main one and the load client's workers: the 2-thread server
# runtime, the audit writer) is what one call costs, start-up left out. The upstream child is
# not followed. Under valgrind SHA-256 runs in software (the CPU's SHA extensions are hidden),
# so the token check, the argument digest and the audit chain hash weigh ~34k instructions
# per call here against a few hundred natively; the column without it subtracts `sha2`'s own.
#
#   bench/callgrind.sh [CLIENTS]    8 clients by default; takes a few minutes
# Needs valgrind (Debian: apt-get install valgrind).
#
# The gate (issue 28): each gateway row, without SHA, at most GATE (1.10) times the required-work
# twin's figure without SHA (the Streamable HTTP twin, for both transports); a verdict line per
# transport, and exit status 1 when one is missed. The legacy SSE line also gives, for scale, the
# ratio to the same twin spoken to over legacy SSE (it spawns each call and answers 202 too).
# CALLGRIND_KEEP=DIR keeps the N2 runs' callgrind files there (one directory per target) for
# `callgrind_annotate`. Not run by tests/run.sh or CI: it takes minutes and needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
command -v callgrind_annotate >/dev/null || { echo "callgrind.sh: callgrind_annotate is missing (it comes with valgrind)" >&2; exit 2; }
CLIENTS="${1:-8}"
N1=500
N2=2500
GATE=1.10
KEEP="${CALLGRIND_KEEP:-}"

# The `profiling` profile (Cargo.toml): release code with line-level debuginfo and symbols, so
# callgrind_annotate can name functions (sha2's below); the shipped release build is stripped.
echo "== build (profiling: release + debuginfo)" >&2
BIN=$(cargo bench --profile profiling --no-run --bench gateway 2>&1 | sed -n 's/.*Executable benches\/gateway\/main.rs (\(.*\))/\1/p' | tail -1)
[[ -x "$BIN" ]] || { echo "callgrind.sh: the gateway bench binary was not found" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Server-side instructions of one run: total and SHA-256's own, "TOTAL SHA".
server_side() {
  local prefix="$1" total=0 sha=0 f n s
  for f in "$prefix".*-[0-9][0-9]; do
    [[ "$f" == *-01 ]] && continue                       # the main thread
    grep -q 'role::Client' "$f" && continue              # the load client's workers
    n=$(sed -n 's/^summary: //p' "$f")
    s=$(callgrind_annotate --auto=no --threshold=100 "$f" 2>/dev/null \
      | awk '/sha2::sha256::compress256/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
    total=$((total + ${n:-0}))
    sha=$((sha + s))
  done
  echo "$total $sha"
}

# Instructions per call of one target: "PER_CALL PER_CALL_WITHOUT_SHA".
per_call() {
  local target="$1" n
  local -a counts=()
  for n in "$N1" "$N2"; do
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$TMP/cg.$n.%p" \
      "$BIN" --bench --only proxy --clients "$CLIENTS" --calls "$n" --rounds 1 \
      --targets "$target" --out "$TMP/out.md" >/dev/null 2>&1 \
      || { echo "callgrind.sh: the run of '$target' with $n calls failed" >&2; return 1; }
    grep -q "| $CLIENTS | [0-9]" "$TMP/out.md" \
      || { echo "callgrind.sh: '$target' served no calls" >&2; return 1; }
    counts+=($(server_side "$TMP/cg.$n"))
    if [[ -n "$KEEP" && "$n" == "$N2" ]]; then
      local keep_dir="$KEEP/${target//[^a-zA-Z0-9]/_}"
      mkdir -p "$keep_dir" && cp "$TMP"/cg.* "$keep_dir"/
    fi
    rm -f "$TMP"/cg.*
  done
  local calls=$((N2 - N1))
  echo "$(((counts[2] - counts[0]) / calls)) $(((counts[2] - counts[3] - counts[0] + counts[1]) / calls))"
}

echo "Instructions per proxied tools/call (server side; callgrind; $CLIENTS clients; ($N2 - $N1 calls)):"
echo
echo "| target | instructions per call | without the software SHA-256 | vs the minimal proxy (without SHA) |"
echo "|---|---:|---:|---:|"
BASE=""
TWIN=""
SSE_TWIN=""
VERDICTS=()
MISSED=0
for spec in "ceiling: minimal|minimal HTTP→stdio proxy (the baseline)" \
            "+ the required work (|minimal proxy + the required work (token, Host, hash-chained audit line)" \
            "legacy sse + the required work|minimal proxy over legacy SSE + the required work (the SSE floor)" \
            "gateway → stdio, streamable|gateway → stdio, Streamable HTTP" \
            "gateway → stdio, legacy sse|gateway → stdio, legacy SSE"; do
  target="${spec%%|*}"
  name="${spec#*|}"
  echo "== $name" >&2
  counted=$(per_call "$target")
  read -r all nosha <<<"$counted"
  [[ -z "$BASE" ]] && BASE="$nosha"
  [[ "$target" == "+ the required work (" ]] && TWIN="$nosha"
  [[ "$target" == "legacy sse + the required work" ]] && SSE_TWIN="$nosha"
  echo "| $name | $all | $nosha | $(python3 -c "print(f'{$nosha / $BASE:.2f}×')") |"
  if [[ "$target" == gateway* && -n "$TWIN" ]]; then
    verdict=$(python3 -c "r = $nosha / $TWIN; print(f'{r:.3f}× the required-work twin ({$nosha:,} vs {$TWIN:,}): ' + ('met' if r <= $GATE else 'MISSED'))")
    [[ "$verdict" == *MISSED ]] && MISSED=1
    if [[ "$target" == *"legacy sse"* && -n "$SSE_TWIN" ]]; then
      verdict+=$(python3 -c "print(f'; for scale, {$nosha / $SSE_TWIN:.3f}× the twin over legacy SSE ({$SSE_TWIN:,}, which spawns each call and answers 202 too)')")
    fi
    VERDICTS+=("${name#gateway → stdio, }: gate ≤${GATE}×: $verdict")
  fi
done
echo
for v in "${VERDICTS[@]}"; do echo "$v"; done
exit "$MISSED"
