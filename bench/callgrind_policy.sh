#!/usr/bin/env bash
# Instructions per policy decision (issue 49), counted by callgrind on benches/policy.rs (the
# `profiling` build): the whole bench run with N1 and N2 calls per case, so
# (I(N2) − I(N1)) / (1.1 × (N2 − N1)) is what one call of each of its three cases costs on
# average together (each case runs N/10 warm-up calls and N timed ones): the no-policy
# baseline (one atomic load), five rules none of which matches, five rules the first denies.
# The per-case figures come from callgrind_annotate's inclusive cost of `decide` (the two
# policy cases) per call. Needs valgrind. Not run by tests/run.sh or CI.
#
#   bench/callgrind_policy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
N1=2000
N2=12000
BIN=$(cargo bench --locked --profile profiling --no-run --bench policy 2>&1 \
  | sed -n 's/.*Executable benches\/policy.rs (\(.*\))/\1/p' | tail -1)
[[ -x "$BIN" ]] || { echo "the policy bench was not built" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
decide_of() {  # inclusive instructions of gatehouse::policy::eval::decide in a callgrind file
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null \
    | awk '!found && /policy::eval::decide( |$)/ {gsub(",", "", $1); print $1; found = 1}'
}
for n in "$N1" "$N2"; do
  POLICY_BENCH_CALLS=$n valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$n" "$BIN" \
    >"$TMP/out.$n" 2>"$TMP/err.$n" || { cat "$TMP/err.$n" >&2; exit 1; }
done
total() { sed -n 's/^summary: //p' "$1"; }
d1=$(decide_of "$TMP/cg.$N1"); d2=$(decide_of "$TMP/cg.$N2")
python3 - "$N1" "$N2" "$(total "$TMP/cg.$N1")" "$(total "$TMP/cg.$N2")" "${d1:-0}" "${d2:-0}" <<'PY'
import sys
n1, n2, t1, t2, d1, d2 = (int(x) for x in sys.argv[1:])
calls = 1.1 * (n2 - n1)
print(f"instructions per call, all three cases together: {(t2 - t1) / calls / 3:,.0f}")
print(f"instructions per policy decision (five rules; the allowed and the denied case averaged): {(d2 - d1) / calls / 2:,.0f}")
PY
