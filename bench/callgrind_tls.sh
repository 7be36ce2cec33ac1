#!/usr/bin/env bash
# Instructions per proxied `tools/call` when the gateway's upstream is a Streamable HTTP server
# over plain http and over https (issue 46), counted by callgrind side by side in one run.
#
# The rows (benches/gateway/upstream_http.rs, selected by `--targets`): the gateway (Streamable
# HTTP to the load client, as bench/callgrind.sh's "gateway → stdio, Streamable HTTP") in front
# of a minimal MCP echo server in the bench process, one over `http://127.0.0.1:P/mcp`, one
# over `https://127.0.0.1:Q/mcp` (rustls with `ring` on both sides; a P-256 CA made by the
# bench with `openssl` at start, given to the gateway as the upstream's `tls_ca_file`). The
# connections to the upstream stay open (reqwest's pool, HTTP/1.1 keep-alive): the TLS
# handshakes (one per pooled connection, ≤ CLIENTS) happen in both runs alike and cancel out.
#
# Counted: (I(N2) − I(N1)) / (N2 − N1) over the gateway's threads only — the 2-thread server
# runtime and the audit writer; the main thread, the load client's runtime and the upstream's
# runtime (threads marked by `bench_role_client_thread` / `bench_role_upstream_thread`) are
# left out, so the upstream's own TLS server side is not in the figure. The "in rustls/ring"
# column is the self cost of code from rustls, ring (Rust and its C/assembly), tokio-rustls
# and webpki in those threads, per call (callgrind_annotate, by source file or name; what they
# call — memcpy, the allocator, the socket — is not in it). The last line checks that both runs
# made the same number of handshakes (ring's constant-time x25519 counted the same). Under valgrind ring's
# AES-GCM runs with AES-NI/PCLMULQDQ (valgrind passes them through; it hides only the SHA
# extensions), so that figure is close to the native cost. SHA-256: as bench/callgrind.sh.
#
#   bench/callgrind_tls.sh [CLIENTS]    8 clients by default; takes a few minutes
# Needs valgrind and openssl. CG_KEEP=DIR keeps the N2 runs' callgrind files for
# callgrind_annotate. Not run by tests/run.sh or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v openssl >/dev/null || { echo "callgrind_tls.sh: openssl is missing (apt-get install openssl)" >&2; exit 2; }
. bench/callgrind_common.sh
CLIENTS="${1:-8}"
N1=500
N2=2500
EXCLUDE='bench_role_client_thread|bench_role_upstream_thread'

echo "== build (profiling: release + debuginfo)" >&2
BIN=$(cg_build_bench .)

echo "Instructions per proxied tools/call, gateway threads only (callgrind; $CLIENTS clients; ($N2 - $N1 calls)):"
echo
echo "| upstream | instructions per call | without the software SHA-256 | in rustls/ring/tokio-rustls code (self) | of which ring's AES-GCM |"
echo "|---|---:|---:|---:|---:|"
declare -A ALL NOSHA TLS AEAD
HANDSHAKES=()
for spec in "gateway → http upstream|http://" "gateway → https upstream|https:// (tls_ca_file)"; do
  target="${spec%%|*}"
  name="${spec#*|}"
  echo "== $target" >&2
  # The pool's number of connections to the upstream depends on timing: a pair of runs whose
  # handshakes differ is measured again (up to 3 times), since one handshake (~2.3M
  # instructions in ring alone) moves the figure by ~1,000 per call.
  for try in 1 2 3; do
    read -r all nosha tls x1 x2 aead <<<"$(cg_per_call "$BIN" "$target")"
    [[ "$x1" == "$x2" ]] && break
    echo "   the two runs made different numbers of TLS handshakes (x25519: $x1 vs $x2); again" >&2
  done
  ALL[$name]=$all NOSHA[$name]=$nosha TLS[$name]=$tls AEAD[$name]=$aead
  echo "| $name | $all | $nosha | $tls | $aead |"
  [[ "$x1" == "$x2" ]] || HANDSHAKES+=("$name: ring's x25519 counted $x1 instructions in the $N1-call run and $x2 in the $N2-call run: the runs made different numbers of TLS handshakes, and the figure carries the difference")
done
h="http://"
s="https:// (tls_ca_file)"
echo
python3 - "${ALL[$h]}" "${ALL[$s]}" "${NOSHA[$h]}" "${NOSHA[$s]}" "${TLS[$h]}" "${TLS[$s]}" "${AEAD[$s]}" <<'EOF'
import sys
ah, as_, nh, ns, th, ts, aead = map(int, sys.argv[1:])
d = as_ - ah
tls = ts - th
print(f"HTTPS − HTTP: {d:+,} instructions per call ({100 * d / ah:+.1f}%; without SHA-256 {ns - nh:+,}); "
      f"rustls/ring/tokio-rustls code: {tls:+,} per call, of which ring's AES-GCM {aead:,}; "
      f"everything else: {d - tls:+,} (the run-to-run spread of one row is ±~700 here)")
EOF
if ((${#HANDSHAKES[@]})); then
  for w in "${HANDSHAKES[@]}"; do echo "warning: $w"; done
else
  echo "TLS handshakes: the same number in the $N1- and $N2-call runs (ring's x25519, constant-time, counted the same), so none is in the per-call figure: the connections to the upstream were already open."
fi
