#!/usr/bin/env python3
"""count_asserts.py — invariants are asserted where state changes: at least MIN uses of GG__ASSERT or
GG__ASSERT_EXPENSIVE per 1,000 lines of the library's C (docs/architecture.md, "Debug levels").

Counted: every .c and .h file under src/ (src/plugin/ aside: it leaves the library's layers), all of
their lines; a use is a GG__ASSERT( or GG__ASSERT_EXPENSIVE( that is not the macros' own #define.
Prints the figures per folder and in all; exits 1 below MIN.

Usage: scripts/count_asserts.py [repository root] [--min N]   (run by scripts/test.sh's first step)
"""
import pathlib
import re
import sys

MIN = 5.0
SKIP = {"plugin"}
USE = re.compile(r"\bGG__ASSERT(?:_EXPENSIVE)?\(")
DEFINE = re.compile(r"^\s*#\s*define\s+GG__ASSERT")


def count(path: pathlib.Path) -> tuple[int, int]:
    lines = path.read_text(errors="replace").splitlines()
    uses = sum(len(USE.findall(line)) for line in lines if not DEFINE.match(line))
    return len(lines), uses


def main() -> int:
    args = sys.argv[1:]
    least = MIN
    if "--min" in args:
        i = args.index("--min")
        least = float(args[i + 1])
        del args[i : i + 2]
    src = pathlib.Path(args[0] if args else ".").resolve() / "src"
    by_folder: dict[str, list[int]] = {}
    for path in sorted(src.rglob("*.[ch]")):
        folder = path.relative_to(src).parts[0]
        if folder in SKIP:
            continue
        lines, uses = count(path)
        total = by_folder.setdefault(folder, [0, 0])
        total[0] += lines
        total[1] += uses
    lines = sum(v[0] for v in by_folder.values())
    uses = sum(v[1] for v in by_folder.values())
    for folder, (n, k) in sorted(by_folder.items()):
        print(f"count_asserts: src/{folder}/: {k} asserts in {n} lines ({1000 * k / max(n, 1):.1f} per 1,000)")
    ratio = 1000 * uses / max(lines, 1)
    verdict = "ok" if ratio >= least else f"below {least:g}"
    print(f"count_asserts: {uses} asserts in {lines} lines of src/ C: {ratio:.2f} per 1,000 ({verdict})")
    return 0 if ratio >= least else 1


if __name__ == "__main__":
    sys.exit(main())
