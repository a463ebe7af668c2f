#!/usr/bin/env bash
# cli_plot_cwd.sh BUILD SRC — `gpuguard plot` runs the Python package, never a module planted in the
# current directory: `python3 -c` puts the current directory first on sys.path, and plot is run from
# wherever the user (root too) happens to stand, a shared /tmp or a downloaded checkout.
set -euo pipefail
build=$1
g="$(cd "$build" && pwd)/gpuguard"
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset GPUGUARD_PYTHON
mkdir -p "$tmp/cwd/gpuguard/diagnostics"
# What another user could leave in a directory: a package named like ours that says it ran.
for f in gpuguard/__init__.py gpuguard/diagnostics/__init__.py gpuguard/diagnostics/plot.py; do
  printf 'open(%s, "a").write("planted %s ran\\n")\n' "'$tmp/ran'" "$f" > "$tmp/cwd/$f"
done
printf 'def main(argv):\n    return 0\n' >> "$tmp/cwd/gpuguard/diagnostics/plot.py"
echo '{}' > "$tmp/cwd/t.jsonl"
(cd "$tmp/cwd" && "$g" plot t.jsonl -o "$tmp/m.html" > "$tmp/out" 2>&1) || true
[ ! -e "$tmp/ran" ] || { cat "$tmp/ran"; fail "plot ran Python planted in the current directory"; }
echo "plot: a package planted in the current directory is not imported"
