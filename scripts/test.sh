#!/usr/bin/env bash
# scripts/test.sh — the README's test command: installs what it needs, then builds and passes every test:
# a -Werror build with the whole CTest suite, the suite again under AddressSanitizer+UBSan, the threaded
# tests under ThreadSanitizer, valgrind on the core suites, the Doxygen reference (warnings are errors)
# a static check with cppcheck, and the layout check with clang-format. Build trees go under build/ci-*.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh --tests
jobs=$(nproc 2>/dev/null || echo 2)
t0=$(date +%s)
step() { echo; echo "==> [$(( $(date +%s) - t0 ))s] $*"; }

configure_build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUGUARD_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
}

step "1/7 layout: clang-format --dry-run --Werror on src/, include/, tools/ (.clang-format)"
find src include tools -name '*.c' -o -name '*.h' -o -name '*.hpp' | sort | xargs clang-format --dry-run --Werror
echo "clang-format: clean"

step "2/7 -Werror build and the whole CTest suite (gpu tests skip without a device)"
configure_build build/ci-release
(cd build/ci-release && ctest --output-on-failure -j "$jobs")

step "3/7 AddressSanitizer + UBSan build and the whole CTest suite"
configure_build build/ci-asan -DGPUGUARD_SANITIZE=address -DGPUGUARD_BUILD_BENCH=OFF
(cd build/ci-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --output-on-failure -j "$jobs")

step "4/7 ThreadSanitizer build, tests labelled 'threads'"
configure_build build/ci-tsan -DGPUGUARD_SANITIZE=thread -DGPUGUARD_BUILD_BENCH=OFF -DGPUGUARD_BUILD_EXAMPLES=OFF
(cd build/ci-tsan && ctest --output-on-failure -L threads --no-tests=ignore)

step "5/7 valgrind memcheck on the core suites"
for t in test_error test_options test_host_backend test_arena; do
  exe=build/ci-release/tests/$t
  [ -x "$exe" ] || continue
  valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite "$exe" >/dev/null
  echo "valgrind: $t clean"
done

step "6/7 API reference with Doxygen (warnings are errors)"
configure_build build/ci-docs -DGPUGUARD_BUILD_DOCS=ON -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_BUILD_EXAMPLES=OFF -DGPUGUARD_BUILD_BENCH=OFF
echo "docs: build/ci-docs/docs/html/index.html"

step "7/7 static check (cppcheck)"
cppcheck --enable=warning,performance,portability --error-exitcode=1 --inline-suppr -q \
  --suppress=missingIncludeSystem -I include -I src -I build/ci-release/generated src tools
echo "cppcheck: clean"

step "all tests passed"
