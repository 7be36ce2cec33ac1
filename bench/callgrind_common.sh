# Shared by bench/callgrind_tls.sh and bench/callgrind_compare.sh (sourced, not run): build the
# gateway bench in the `profiling` profile and count instructions per proxied call the way
# bench/callgrind.sh does — each target run twice under callgrind with exactly N1 and N2 calls
# (`--calls`, no warm-up), (I(N2) − I(N1)) / (N2 − N1) summed over the server side's threads.
#
# Which threads are "server side": every thread but the main one (-01) and those whose
# callgrind file holds EXCLUDE (an extended regex): the load client's workers and, for the
# HTTP-upstream rows, the in-process upstream's. bench/callgrind.sh and the stdio rows use
# 'role::Client' (hyper's client role, which only the load client runs there); the bench's
# HTTP-upstream rows need the markers `bench_role_client_thread` / `bench_role_upstream_thread`
# (benches/gateway/upstream_http.rs), since the gateway's own threads then run hyper's client.

command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 2; }
command -v callgrind_annotate >/dev/null || { echo "callgrind_annotate is missing (it comes with valgrind)" >&2; exit 2; }

CG_LOCK_FLAG="${CG_LOCK_FLAG:---locked}"

# Builds the gateway bench (profiling profile) in the checkout DIR (default: here) with target
# directory TARGET_DIR (default: DIR's own) and prints the executable's path.
cg_build_bench() {
  local dir="${1:-.}" target_dir="${2:-}" bin
  bin=$(cd "$dir" && ${target_dir:+env CARGO_TARGET_DIR="$target_dir"} \
    cargo bench $CG_LOCK_FLAG --profile profiling --no-run --bench gateway 2>&1 \
    | tee "${CG_BUILD_LOG:-/dev/null}" \
    | sed -n 's/.*Executable benches\/gateway\/main.rs (\(.*\))/\1/p' | tail -1)
  [[ -n "$bin" && "$bin" != /* ]] && bin="$dir/$bin"
  [[ -x "$bin" ]] || { echo "the gateway bench binary was not built in $dir (see ${CG_BUILD_LOG:-the cargo output})" >&2; return 1; }
  echo "$bin"
}

# Server-side instructions of one run's thread files PREFIX.*-NN: "TOTAL SHA TLS X25519 AEAD" —
# all; sha2's software SHA-256 (compress256, self cost); the self cost of code from rustls, ring
# (its Rust and its C/assembly), tokio-rustls and webpki (by source file, so that their code
# inlined into a caller counts too, or by name); of that, ring's x25519, which is constant-time:
# its count is the same number of TLS handshakes times a constant, so equal counts in two runs
# mean the two runs made the same number of handshakes; and ring's AES-GCM (its `aes`, `gcm`,
# `ghash` code: the record encryption itself).
cg_server_side() {
  local prefix="$1" exclude="$2" f files=()
  for f in "$prefix".*-[0-9][0-9]*; do
    [[ "$f" == *-01 ]] && continue                       # the main thread
    grep -Eq "$exclude" "$f" && continue                 # the client's (and upstream's) threads
    files+=("$f")
  done
  local total=0 sha=0 tls=0 x=0 aead=0 n a
  for f in "${files[@]}"; do
    n=$(sed -n 's/^summary: //p' "$f")
    a=$(callgrind_annotate --auto=no --threshold=100 "$f" 2>/dev/null | python3 -c '
import re, sys
sha = tls = x = aead = 0
lead = re.compile(r"^[<&]*(?:mut |dyn )?(rustls|ring|tokio_rustls|webpki|rustls_pki_types)::|^ring_core_")
src = re.compile(r"/(ring|rustls|tokio-rustls|rustls-webpki|rustls-pki-types)-[0-9]")
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?)\s*(\[[^\]]*\])?$", line)
    if not m or ":" not in m.group(2):
        continue
    ir = int(m.group(1).replace(",", ""))
    path, fn = m.group(2).split(":", 1)
    if "sha2::sha256::compress256" in fn:
        sha += ir
    elif src.search(path) or lead.search(fn):
        tls += ir
        if "curve25519" in path or "x25519" in fn:
            x += ir
        if re.search(r"/ring-[0-9][^/]*/.*(aes|gcm|ghash)", path + ":" + fn):
            aead += ir
print(sha, tls, x, aead)')
    read -r a_sha a_tls a_x a_aead <<<"$a"
    total=$((total + ${n:-0}))
    sha=$((sha + a_sha))
    tls=$((tls + a_tls))
    x=$((x + a_x))
    aead=$((aead + a_aead))
  done
  echo "$total $sha $tls $x $aead"
}

# Instructions per call of TARGET (a `--targets` filter) with bench BIN: prints
# "PER_CALL PER_CALL_WITHOUT_SHA TLS_PER_CALL X25519_N1 X25519_N2 AEAD_PER_CALL". Uses CLIENTS, N1, N2,
# EXCLUDE; CG_KEEP=DIR keeps both runs' callgrind files in DIR/<target>.
cg_per_call() {
  local bin="$1" target="$2" n tmp
  tmp=$(mktemp -d)
  local -a c=()
  for n in "$N1" "$N2"; do
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$tmp/cg.$n.%p" \
      "$bin" --bench --only proxy --clients "$CLIENTS" --calls "$n" --rounds 1 \
      --targets "$target" --out "$tmp/out.md" >"$tmp/run.log" 2>&1 \
      || { echo "the run of '$target' with $n calls failed:" >&2; tail -5 "$tmp/run.log" >&2; rm -rf "$tmp"; return 1; }
    grep -q "| $CLIENTS | [0-9]" "$tmp/out.md" \
      || { echo "'$target' served no calls" >&2; grep -i "fail" "$tmp/out.md" >&2; rm -rf "$tmp"; return 1; }
    c+=($(cg_server_side "$tmp/cg.$n" "$EXCLUDE"))
    if [[ -n "${CG_KEEP:-}" ]]; then
      local keep="$CG_KEEP/${target//[^a-zA-Z0-9]/_}"
      [[ "$n" == "$N1" ]] && rm -rf "$keep"                # a measurement again replaces it
      mkdir -p "$keep" && cp "$tmp"/cg.* "$keep"/
    fi
    rm -f "$tmp"/cg.*
  done
  rm -rf "$tmp"
  local calls=$((N2 - N1))
  echo "$(((c[5] - c[0]) / calls)) $(((c[5] - c[6] - c[0] + c[1]) / calls)) $(((c[7] - c[2]) / calls)) ${c[3]} ${c[8]} $(((c[9] - c[4]) / calls))"
}
