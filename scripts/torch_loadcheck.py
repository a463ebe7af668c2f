#!/usr/bin/env python3
"""torch_loadcheck.py — loads a prebuilt gpuguard PyTorch backend the way `import torch` would put it in a
process, on a machine with no GPU and without the NVIDIA libraries PyTorch depends on: with that PyTorch
version's own libc10, libc10_cuda, libtorch_cpu, libtorch_cuda, libtorch, its CUDA runtime (libcudart)
and libgpuguard on LD_LIBRARY_PATH, and a stand-in library for every other soname in their dependency
tree that is not on this machine (cuBLAS, cuDNN, NCCL, cuSPARSE, ...). A stand-in carries the soname,
the symbol versions and the symbols the real libraries ask of it, as functions that return 0, so the
dynamic linker can bind everything.

What a pass proves: every library the backend itself needs is a real one of that version (none is a
stand-in); every symbol it imports binds at load time (dlopen RTLD_NOW) to a definition with the right
symbol version in those real libraries; the static initialisers of the backend and of PyTorch's
libraries run; the backend's C entry points are exported. What it does not prove: anything about CUDA
calls or the NVIDIA libraries (stand-ins), or behaviour on a GPU (the H200 run shows that).

usage: torch_loadcheck.py BACKEND.so TORCH_LIB_DIR CUDART_LIB_DIR LIBGPUGUARD_DIR STUB_DIR"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict, List, Set, Tuple

# The system libraries a manylinux machine has; any other soname outside the given directories gets a
# stand-in, also where this machine has a CUDA toolkit of its own, so the check is the same everywhere.
SYSTEM = re.compile(r"(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libstdc\+\+|libgcc_s)\.so\.[0-9]+")
ENTRY_POINTS = ["gg_torch_native_install", "gg_torch_native_active", "gg_torch_native_counters",
                "gg_torch_native_use_arena", "gg_torch_native_pool_arena"]


def readelf(args: List[str], path: str) -> str:
    return subprocess.run(["readelf", "-W", *args, path], check=True, capture_output=True, text=True).stdout


def system_libs() -> Dict[str, str]:
    """soname -> path of what the system's loader cache knows (libc, libstdc++, libm, ...)."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], check=True, capture_output=True, text=True).stdout
    found: Dict[str, str] = {}
    for m in re.finditer(r"^\s*(\S+) \(([^)]*)\) => (\S+)", out, re.M):
        if "x86-64" in m.group(2) and SYSTEM.fullmatch(m.group(1)):
            found.setdefault(m.group(1), m.group(3))
    return found


def closure(root: str, dirs: List[str]) -> Tuple[Dict[str, str], Set[str], Set[str]]:
    """The real libraries in root's dependency tree found in dirs, the sonames found nowhere, and the
    system's libraries in the tree."""
    system = system_libs()
    real: Dict[str, str] = {}
    missing: Set[str] = set()
    seen_system: Set[str] = set()
    todo = [root]
    while todo:
        path = todo.pop()
        for soname in re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", readelf(["-d"], path)):
            if soname in system:
                seen_system.add(system[soname])
            if soname in real or soname in missing or soname in system:
                continue
            hits = [os.path.join(d, soname) for d in dirs if os.path.exists(os.path.join(d, soname))]
            if hits:
                real[soname] = hits[0]
                todo.append(hits[0])
            else:
                missing.add(soname)
    return real, missing, seen_system


def wanted(paths: List[str], system: Set[str], missing: Set[str]) -> Tuple[Dict[str, Dict[str, Set[str]]], Set[str]]:
    """What the real libraries ask of the missing ones: {soname: {version: symbols}}, and the unversioned
    undefined symbols none of them nor the system's libraries defines (libtorch_cuda asks libstdc++
    for some without a version)."""
    asked: Dict[str, Dict[str, Set[str]]] = {s: {} for s in missing}
    loose: Set[str] = set()
    defined: Set[str] = set()
    for path in system:
        defined |= {c[7].split("@")[0] for c in (ln.split() for ln in readelf(["--dyn-syms"], path).splitlines())
                    if len(c) >= 8 and c[6] != "UND"}
    for path in paths:
        owner = {}  # version name -> soname it is needed from
        for block in re.split(r"\n(?=\s*0x[0-9a-f]+: Version: \d+\s+File: )", readelf(["-V"], path)):
            f = re.search(r"File: (\S+)", block)
            if f:
                for v in re.findall(r"Name: (\S+)", block):
                    owner[v] = f.group(1)
        for line in readelf(["--dyn-syms"], path).splitlines():
            cols = line.split()
            if len(cols) < 8 or not cols[0].endswith(":"):
                continue
            bind, ndx, name = cols[4], cols[6], cols[7]
            sym, _, ver = name.partition("@")
            ver = ver.split(" ")[0].lstrip("@")
            if ndx != "UND":
                defined.add(sym)
            elif bind != "WEAK" and sym:
                if ver and owner.get(ver) in missing:
                    asked[owner[ver]].setdefault(ver, set()).add(sym)
                elif not ver:
                    loose.add(sym)
    return asked, loose - defined


def make_stub(stub_dir: str, soname: str, versions: Dict[str, Set[str]], extra: List[str]) -> None:
    """A shared library named soname defining versions' symbols under their versions, returning 0."""
    base = os.path.join(stub_dir, soname)
    syms = sorted({s for ss in versions.values() for s in ss})
    with open(base + ".s", "w") as f:
        f.write(".text\n")
        for s in syms:
            f.write(f'.globl "{s}"\n.type "{s}",@function\n"{s}":\n  xor %eax,%eax\n  ret\n')
    cmd = ["cc", "-shared", "-nostdlib", "-o", base, base + ".s", f"-Wl,-soname,{soname}", *extra]
    named = {v: ss for v, ss in versions.items() if v}  # "": symbols without a version, no script needed
    if named:
        with open(base + ".map", "w") as f:
            for v, ss in sorted(named.items()):
                f.write(f"{v} {{ global: {'; '.join(sorted(ss))}; }};\n")
        cmd.append(f"-Wl,--version-script,{base}.map")
    subprocess.run(cmd, check=True)


def main() -> int:
    so, torch_lib, cuda_lib, gg_dir, stub_dir = sys.argv[1:6]
    os.makedirs(stub_dir, exist_ok=True)
    dirs = [torch_lib, cuda_lib, gg_dir]
    real, missing, system = closure(so, dirs)
    own = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", readelf(["-d"], so)))
    if own & missing:
        print(f"FAIL: the backend needs {sorted(own & missing)}, found in neither PyTorch's, the CUDA "
              "runtime's nor gpuguard's libraries", file=sys.stderr)
        return 1
    asked, loose = wanted(list(real.values()), system, missing)
    # Unversioned leftovers go into one library every stand-in needs, so they are in the load scope.
    make_stub(stub_dir, "libgg_loose_stub.so", {"": loose} if loose else {}, [])
    for soname in sorted(missing):
        make_stub(stub_dir, soname, asked[soname], ["-Wl,--no-as-needed", f"-L{stub_dir}", "-l:libgg_loose_stub.so"])
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(dirs + [stub_dir]))
    probe = ("import ctypes, os, sys\n"
             "lib = ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_GLOBAL)\n"
             "missing = [e for e in sys.argv[2:] if not hasattr(lib, e)]\n"
             "sys.exit(f'entry points missing: {missing}' if missing else 0)\n")
    r = subprocess.run([sys.executable, "-c", probe, so, *ENTRY_POINTS], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: loading {so}: {r.stderr.strip()}", file=sys.stderr)
        return 1
    n = sum(len(s) for v in asked.values() for s in v.values())
    print(f"load check: dlopen RTLD_NOW passed; the backend's own needs all real ({', '.join(sorted(own))}); "
          f"{len(real)} libraries of PyTorch, CUDA runtime and gpuguard real, {len(missing)} stand-ins "
          f"({', '.join(sorted(missing))}: {n} versioned and {len(loose)} unversioned symbols)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
