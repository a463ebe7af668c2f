#!/usr/bin/env python3
"""check_layers.py — the layers of src/ hold: a file includes headers of its own folder or of folders
below it, never above (docs/architecture.md draws the order). Also: a folder's `*_impl.h` (its private
layout) is included from that folder alone; tools/ includes no src/ header but core/clock_internal.h
(no library state); every internal header is named `X_internal.h` after its source file (or is one of
the named exceptions). Exits 1 naming each offending include, 0 when the layers hold.

Usage: scripts/check_layers.py [repository root]   (run by scripts/test.sh's first step)
"""
import pathlib
import re
import sys

# Lowest first. A folder may include its own headers and those of any folder before it.
LAYERS = ["core", "backend", "proc", "guard", "arena", "plugin", "query"]
# Internal headers not named after one source file, each with its reason (docs/architecture.md).
HEADER_EXCEPTIONS = {
    "core/internal.h": "the base every file includes: error.c, options.c, fork.c",
    "backend/backend.h": "the interface every backend implements, not one file's functions",
}
TOOLS_MAY_INCLUDE = {"core/clock_internal.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_/]+\.h)"', re.M)


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    src = root / "src"
    rank = {name: i for i, name in enumerate(LAYERS)}
    errors = []
    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    for folder in folders:
        if folder not in rank:
            errors.append(f"src/{folder}/: a folder with no layer (add it to LAYERS and docs/architecture.md)")
    for path in sorted(src.rglob("*.[ch]")):
        rel = path.relative_to(src)
        here = rel.parts[0]
        if path.suffix == ".h" and str(rel) not in HEADER_EXCEPTIONS:
            if not (path.stem.endswith("_internal") or path.stem.endswith("_impl")):
                errors.append(f"src/{rel}: an internal header is named X_internal.h (or X_impl.h)")
        for m in INCLUDE.finditer(path.read_text(errors="replace")):
            there, header = m.group(1), m.group(2)
            if there == "gpuguard" or there not in rank:
                continue  # the public headers, and system headers spelt with a folder
            line = path.read_text(errors="replace")[: m.start()].count("\n") + 1
            where = f"src/{rel}:{line}: #include \"{there}/{header}\""
            if here in rank and rank[there] > rank[here]:
                errors.append(f"{where}: {here} ({rank[here]}) includes from {there} ({rank[there]}), a layer above")
            if header.endswith("_impl.h") and there != here:
                errors.append(f"{where}: {there}/{header} is private to src/{there}/")
    for path in sorted((root / "tools").glob("*.[ch]")):
        for m in INCLUDE.finditer(path.read_text(errors="replace")):
            name = f"{m.group(1)}/{m.group(2)}"
            if m.group(1) != "gpuguard" and name not in TOOLS_MAY_INCLUDE:
                errors.append(f"tools/{path.name}: #include \"{name}\": the command line uses the public API only")
    for e in errors:
        print("check_layers:", e)
    if errors:
        print(f"check_layers: {len(errors)} problem(s); layers, lowest first: {' < '.join(LAYERS)}")
        return 1
    print(f"check_layers: clean ({' < '.join(LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
