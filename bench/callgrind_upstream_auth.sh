#!/usr/bin/env bash
# Instructions per upstream request for the Authorization header work (issue 47, item 6):
# a static configured header beside a cached client_credentials token and a cached
# token_exchange token (benches/upstream_auth.rs says what each case does). Counted as
# bench/callgrind.sh does: each case runs twice under callgrind with exactly N1 and N2 calls
# (`--calls`), (I(N2) − I(N1)) / (N2 − N1) over the whole process, so the start-up and the one
# token request each holder makes are left out.
#
#   bench/callgrind_upstream_auth.sh      needs valgrind; a minute after the build
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
N1=20000
N2=120000
BIN=$(cargo bench --profile profiling --no-run --bench upstream_auth 2>&1 \
  | sed -n 's/.*Executable benches\/upstream_auth.rs (\(.*\))/\1/p' | tail -1)
[[ -x "$BIN" ]] || { echo "the upstream_auth bench binary was not built" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
count() {
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg" "$BIN" --calls "$2" "$1" >/dev/null 2>&1 \
    || { echo "the run of $1 with $2 calls failed" >&2; return 1; }
  sed -n 's/^summary: //p' "$TMP/cg"
}
echo "| case | instructions per call | added |"
echo "|---|---:|---:|"
BASE=""
for c in static client_credentials token_exchange; do
  a=$(count "$c" "$N1") || exit 1
  b=$(count "$c" "$N2") || exit 1
  per=$(((b - a) / (N2 - N1)))
  [[ -z "$BASE" ]] && BASE="$per"
  echo "| $c | $per | $((per - BASE)) |"
done
