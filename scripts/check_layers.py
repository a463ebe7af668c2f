#!/usr/bin/env python3
"""check_layers.py — the layers of src/ hold as docs/architecture.md states them: a file includes and
calls its own folder and the folders below it, never one above.

Includes (always checked):
  - internal headers: a file includes headers of its own folder or of folders below it;
  - public headers: each is ranked by the folder that implements it (PUBLIC below); a src/ file may
    include those of its own layer or below; the umbrella header, scope.h and gpuguard.hpp are never
    included from src/ (the umbrella would hide which layers a file uses); a public header includes
    only public headers of its own rank or below;
  - a folder's `*_impl.h` (its private layout) is included from that folder alone; tools/ includes no
    src/ header but core/clock_internal.h (no library state); every internal header is named
    `X_internal.h` after its source file (or is one of the named exceptions).
Calls (with --objects BUILD_DIR, after a build): for each object file of libgpuguard, every undefined
`gg_`/`gg__` symbol that nm lists must be defined by an object of its own layer or below.

Exits 1 naming each offending include or call, 0 when the layers hold.

Usage: scripts/check_layers.py [repository root] [--objects BUILD_DIR]
  (scripts/test.sh: the includes in its first step, the calls after the release build)
"""
import pathlib
import re
import subprocess
import sys

# Lowest first. A folder may include and call its own files and those of any folder before it.
LAYERS = ["core", "backend", "proc", "guard", "arena", "query"]
# Public headers by the folder that implements them.
PUBLIC = {
    "error.h": "core",
    "version.h": "core",
    "export.h": "core",
    "host.h": "backend",
    "proc.h": "proc",
    "guard.h": "guard",
    "arena.h": "arena",
    "share.h": "arena",
    "query.h": "query",
    "report.h": "query",
}
# Public headers for programs, never for the library's own files.
NOT_FROM_SRC = {
    "gpuguard.h": "the umbrella hides which layers a file uses: include the headers it needs",
    "scope.h": "cleanup macros for programs",
    "gpuguard.hpp": "the C++ facade for programs",
}
# Internal headers not named after one source file, each with its reason (docs/architecture.md).
HEADER_EXCEPTIONS = {
    "core/internal.h": "the base every file includes: error.c, options.c, fork.c",
    "backend/backend.h": "the interface every backend implements, not one file's functions",
}
TOOLS_MAY_INCLUDE = {"core/clock_internal.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_/]+\.h)"', re.M)
PUBLIC_INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]gpuguard/([A-Za-z0-9_]+\.h(?:pp)?)[>"]', re.M)
SYMBOL = re.compile(r"^gg__?[A-Za-z0-9_]")


def line_of(text: str, pos: int) -> int:
    return text[:pos].count("\n") + 1


def check_src_includes(src: pathlib.Path, rank: dict[str, int], errors: list[str]) -> None:
    for path in sorted(src.rglob("*.[ch]")):
        rel = path.relative_to(src)
        here = rel.parts[0]
        text = path.read_text(errors="replace")
        if path.suffix == ".h" and str(rel) not in HEADER_EXCEPTIONS:
            if not (path.stem.endswith("_internal") or path.stem.endswith("_impl")):
                errors.append(f"src/{rel}: an internal header is named X_internal.h (or X_impl.h)")
        for m in INCLUDE.finditer(text):
            there, header = m.group(1), m.group(2)
            if there == "gpuguard" or there not in rank:
                continue  # the public headers (below), and system headers spelt with a folder
            where = f"src/{rel}:{line_of(text, m.start())}: #include \"{there}/{header}\""
            if here in rank and rank[there] > rank[here]:
                errors.append(f"{where}: {here} ({rank[here]}) includes from {there} ({rank[there]}), a layer above")
            if header.endswith("_impl.h") and there != here:
                errors.append(f"{where}: {there}/{header} is private to src/{there}/")
        for m in PUBLIC_INCLUDE.finditer(text):
            header = m.group(1)
            where = f"src/{rel}:{line_of(text, m.start())}: #include \"gpuguard/{header}\""
            if header in NOT_FROM_SRC:
                errors.append(f"{where}: not from the library's own files ({NOT_FROM_SRC[header]})")
            elif header not in PUBLIC:
                errors.append(f"{where}: a public header with no layer (add it to PUBLIC and docs/architecture.md)")
            elif here in rank and rank[PUBLIC[header]] > rank[here]:
                layer = PUBLIC[header]
                errors.append(f"{where}: {here} ({rank[here]}) includes {layer}'s public header ({rank[layer]}), a layer above")


def check_public_headers(include: pathlib.Path, rank: dict[str, int], errors: list[str]) -> None:
    for path in sorted(include.glob("*.h")):
        if path.name in NOT_FROM_SRC:
            continue  # the umbrella and the programs' helpers include whatever they gather
        if path.name not in PUBLIC:
            errors.append(f"include/gpuguard/{path.name}: a public header with no layer (add it to PUBLIC)")
            continue
        mine = PUBLIC[path.name]
        text = path.read_text(errors="replace")
        for m in PUBLIC_INCLUDE.finditer(text):
            other = m.group(1)
            theirs = PUBLIC.get(other)
            if theirs is None or rank[theirs] > rank[mine]:
                errors.append(
                    f"include/gpuguard/{path.name}:{line_of(text, m.start())}: #include \"gpuguard/{other}\": "
                    f"{mine}'s header includes {theirs or 'an unranked'} header, a layer above"
                )


def check_tools(root: pathlib.Path, errors: list[str]) -> None:
    for path in sorted((root / "tools").glob("*.[ch]")):
        for m in INCLUDE.finditer(path.read_text(errors="replace")):
            name = f"{m.group(1)}/{m.group(2)}"
            if m.group(1) != "gpuguard" and name not in TOOLS_MAY_INCLUDE:
                errors.append(f"tools/{path.name}: #include \"{name}\": the command line uses the public API only")


def library_objects(build: pathlib.Path) -> dict[str, pathlib.Path]:
    """src-relative source path -> its object file, from the static library's objects (built without
    link-time optimisation, so nm reads them as they are), else the shared library's."""
    for target in ("gpuguard_static.dir", "gpuguard.dir"):
        top = build / "CMakeFiles" / target / "src"
        objs = {str(p.relative_to(top))[: -len(".o")]: p for p in sorted(top.rglob("*.o"))}
        if objs:
            return objs
    return {}


def nm_symbols(obj: pathlib.Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) gg_/gg__ symbols of one object file."""
    out = subprocess.run(["nm", "-P", str(obj)], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or not SYMBOL.match(parts[0]):
            continue
        (undefined if parts[1] in ("U", "w", "v") else defined).add(parts[0])
    return defined, undefined


def check_calls(build: pathlib.Path, rank: dict[str, int], errors: list[str]) -> int:
    objs = library_objects(build)
    if not objs:
        errors.append(f"{build}: no object files of libgpuguard (build it first)")
        return 0
    defined_in: dict[str, list[str]] = {}
    undefined_by: dict[str, set[str]] = {}
    for source, obj in objs.items():
        defined, undefined = nm_symbols(obj)
        for name in defined:
            defined_in.setdefault(name, []).append(source)
        undefined_by[source] = undefined
    if not defined_in:
        errors.append(f"{build}: nm lists no gg_ symbols in its objects (link-time optimisation?): "
                      "give a build with the static library (GPUGUARD_BUILD_STATIC=ON)")
    for source, undefined in sorted(undefined_by.items()):
        here = source.split("/")[0]
        if here not in rank:
            continue
        for name in sorted(undefined):
            owners = defined_in.get(name)
            if not owners:
                continue  # not the library's (the link with --no-undefined says if it is missing)
            lowest = min(owners, key=lambda s: rank.get(s.split("/")[0], len(rank)))
            there = lowest.split("/")[0]
            if there in rank and rank[there] > rank[here]:
                errors.append(
                    f"src/{source}: uses {name}, defined in src/{lowest}: {here} ({rank[here]}) "
                    f"calls {there} ({rank[there]}), a layer above (pass a hook down instead)"
                )
    return len(objs)


def main() -> int:
    args = sys.argv[1:]
    build = None
    if "--objects" in args:
        i = args.index("--objects")
        build = pathlib.Path(args[i + 1]).resolve()
        del args[i : i + 2]
    root = pathlib.Path(args[0] if args else ".").resolve()
    src = root / "src"
    rank = {name: i for i, name in enumerate(LAYERS)}
    errors: list[str] = []
    for folder in sorted(p.name for p in src.iterdir() if p.is_dir()):
        if folder not in rank:
            errors.append(f"src/{folder}/: a folder with no layer (add it to LAYERS and docs/architecture.md)")
    check_src_includes(src, rank, errors)
    check_public_headers(root / "include" / "gpuguard", rank, errors)
    check_tools(root, errors)
    checked = "includes of src/, include/gpuguard/ and tools/"
    if build is not None:
        n = check_calls(build, rank, errors)
        checked += f"; calls of {n} objects in {build.name}"
    for e in errors:
        print("check_layers:", e)
    if errors:
        print(f"check_layers: {len(errors)} problem(s); layers, lowest first: {' < '.join(LAYERS)}")
        return 1
    print(f"check_layers: clean ({' < '.join(LAYERS)}): {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
