#!/usr/bin/env python3
"""torch_prebuilt.py — gpuguard's PyTorch backend (bindings/python/gpuguard/torch/native/*.cpp) built
ahead of time for each PyTorch version the wheel serves without a compiler: for each, that version's
Linux x86_64 CUDA wheel from the package index (the one `pip install torch` gets) is downloaded once
into a cache, its headers and the five libraries the backend links are extracted, and the backend is
compiled against them with -Wall -Wextra -Werror and linked with --no-undefined, so every symbol it
uses resolves in that version's own libraries. Then each build is load-checked (torch_loadcheck.py):
loaded with that version's libraries, stand-ins only for the NVIDIA libraries PyTorch needs, and no GPU.

Out: DIR/libgpuguard_torch-<major.minor>-cu<CUDA major>.so for each version, named so that
gpuguard.torch._native picks the one of the running PyTorch. Any failure (a download, a compile, a
load) stops the script with a line that says which version and what; nothing half-built is left in DIR.

usage: torch_prebuilt.py --lib build/libgpuguard.so.0 --out DIR [--cache build/torch-prebuilt-cache]
                         [--versions 2.8,2.9,2.10,2.11] [--jobs N]"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "bindings", "python", "gpuguard", "torch", "native")
# One pinned release per minor version: the allocator interface changes between minors only, and a pin
# keeps the download cache valid. The wheel's Python tag does not matter for headers and libraries.
PINS = {"2.8": "2.8.0", "2.9": "2.9.0", "2.10": "2.10.0", "2.11": "2.11.0"}
WHEEL_TAGS = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11", "--implementation", "cp",
              "--abi", "cp311", "--only-binary", ":all:"]
LINKED = ["c10", "c10_cuda", "torch_cuda", "torch_cpu", "torch"]
# The newest glibc symbol version the manylinux_2_28 tag allows.
MAX_GLIBC = (2, 28)


class Failed(Exception):
    """A step failed; the message says which version and what."""


def log(msg: str) -> None:
    print(f"torch_prebuilt: {msg}", flush=True)


def run(cmd: List[str], what: str, **kw: object) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise Failed(f"{what} failed (exit {r.returncode}): {' '.join(cmd[:6])} ...\n{tail}")
    return str(r.stdout)


def pip_download(spec: str, dest: str, deps: bool) -> None:
    """Downloads spec's wheel(s) into dest; a network or index failure is a clear error."""
    os.makedirs(dest, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", dest,
           *WHEEL_TAGS, spec]
    if not deps:
        cmd.insert(4, "--no-deps")
    run(cmd, f"downloading {spec} from the package index (network or index unreachable?)")


def torch_wheel(cache: str, pin: str) -> str:
    """The cached torch wheel of that release, downloaded first when absent."""
    pattern = os.path.join(cache, "wheels", f"torch-{pin}-*manylinux*x86_64.whl")
    if not glob.glob(pattern):
        log(f"downloading torch=={pin} (about 900 MB, once: cached in {cache}/wheels)")
        pip_download(f"torch=={pin}", os.path.join(cache, "wheels"), deps=False)
    hits = sorted(glob.glob(pattern))
    if not hits:
        raise Failed(f"torch=={pin}: pip reported success but left no wheel matching {pattern}")
    return hits[-1]


def cudart_requirement(metadata: str) -> str:
    """The CUDA runtime package a torch wheel depends on, pinned as it pins it (without the marker)."""
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].split(";")[0].strip()
        if req.startswith("nvidia-cuda-runtime"):
            return req
        if req.startswith("cuda-toolkit[") and "cudart" in req:  # CUDA 13: one meta package, extras per part
            return re.sub(r"\[[^]]*\]", "[cudart]", req)
    raise Failed("the torch wheel names no CUDA runtime package (is it a CPU-only build?)")


def extract(wheel: str, dest: str) -> Dict[str, str]:
    """Extracts torch/include, torch/version.py, the linked libraries and what they load from torch/lib
    into dest (once: a stamp marks a whole extraction); returns the wheel's metadata and version file."""
    stamp = os.path.join(dest, ".complete")
    if not os.path.exists(stamp):
        shutil.rmtree(dest, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.startswith("torch/include/") or n == "torch/version.py"
                     or re.fullmatch(r"torch/lib/lib[^/]*\.so[.0-9]*", n) and "python" not in n
                     or re.fullmatch(r"torch-[^/]*\.dist-info/METADATA", n)]
            z.extractall(dest, members=names)
        open(stamp, "w").close()
    meta = glob.glob(os.path.join(dest, "torch-*.dist-info", "METADATA"))
    with open(meta[0], encoding="utf-8") as f, open(os.path.join(dest, "torch", "version.py"), encoding="utf-8") as g:
        return {"metadata": f.read(), "version": g.read()}


def cuda_runtime(cache: str, req: str) -> Tuple[str, str]:
    """(include dir, lib dir) of the CUDA runtime wheel req, downloaded and extracted once."""
    key = re.sub(r"[^A-Za-z0-9.]+", "_", req)
    dest = os.path.join(cache, "cudart", key)
    stamp = os.path.join(dest, ".complete")
    if not os.path.exists(stamp):
        shutil.rmtree(dest, ignore_errors=True)
        log(f"downloading {req} (the CUDA runtime's headers and library)")
        pip_download(req, os.path.join(dest, "wheels"), deps=True)
        for w in glob.glob(os.path.join(dest, "wheels", "nvidia_cuda_runtime*.whl")):
            with zipfile.ZipFile(w) as z:
                z.extractall(os.path.join(dest, "x"))
        open(stamp, "w").close()
    heads = glob.glob(os.path.join(dest, "x", "nvidia", "**", "cuda_runtime_api.h"), recursive=True)
    libs = glob.glob(os.path.join(dest, "x", "nvidia", "**", "libcudart.so.*"), recursive=True)
    if not heads or not libs:
        raise Failed(f"{req}: no cuda_runtime_api.h or libcudart.so in its wheel under {dest}/x")
    return os.path.dirname(heads[0]), os.path.dirname(libs[0])


def version_field(text: str, name: str) -> str:
    m = re.search(rf"^{name}\s*(?::[^=]*)?=\s*'([^']*)'", text, re.M)
    if not m:
        raise Failed(f"torch/version.py has no {name}")
    return m.group(1)


def symbol_versions(path: str) -> List[str]:
    """The symbol versions path needs from other libraries (its verneed entries)."""
    out = run(["readelf", "-V", "-W", path], f"readelf {path}")
    return re.findall(r"Name: ((?:GLIBC|GLIBCXX|CXXABI)_[0-9.]+)", out)


def check_versions(so: str, torch_lib: str) -> str:
    """The build asks glibc for no more than manylinux_2_28 allows, and the C++ runtime for no more than
    that PyTorch's own libraries do: it loads wherever they load."""
    def newest(vers: List[str], prefix: str) -> Tuple[int, ...]:
        nums = [tuple(int(x) for x in v[len(prefix):].split(".")) for v in vers if v.startswith(prefix)]
        return max(nums, default=(0,))
    ours = symbol_versions(so)
    theirs = symbol_versions(os.path.join(torch_lib, "libtorch_cpu.so"))
    glibc, cxx, cxx_torch = newest(ours, "GLIBC_"), newest(ours, "GLIBCXX_"), newest(theirs, "GLIBCXX_")
    if glibc > MAX_GLIBC:
        raise Failed(f"{so} needs GLIBC_{'.'.join(map(str, glibc))}, above manylinux_2_28")
    if cxx > cxx_torch:
        raise Failed(f"{so} needs GLIBCXX_{'.'.join(map(str, cxx))}; this PyTorch's libtorch_cpu needs "
                     f"GLIBCXX_{'.'.join(map(str, cxx_torch))} at most: it would not load where PyTorch does")
    return f"GLIBC_{'.'.join(map(str, glibc))}, GLIBCXX_{'.'.join(map(str, cxx))} (torch: " \
           f"GLIBCXX_{'.'.join(map(str, cxx_torch))})"


def build(minor: str, cache: str, lib: str, out: str, jobs: int) -> str:
    t0 = time.time()
    pin = PINS[minor]
    wheel = torch_wheel(cache, pin)
    tree = os.path.join(cache, f"torch-{pin}")
    info = extract(wheel, tree)
    cuda = version_field(info["version"], "cuda")
    tver = version_field(info["version"], "__version__")
    if not tver.startswith(minor + "."):
        raise Failed(f"the wheel for {minor} is PyTorch {tver}")
    cuda_inc, cuda_lib = cuda_runtime(cache, cudart_requirement(info["metadata"]))
    inc, tlib = os.path.join(tree, "torch", "include"), os.path.join(tree, "torch", "lib")
    name = f"libgpuguard_torch-{minor}-cu{cuda.split('.')[0]}.so"
    objdir = os.path.join(cache, "obj", minor)
    os.makedirs(objdir, exist_ok=True)
    cxx = os.environ.get("CXX") or "g++"
    flags = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-D_GLIBCXX_USE_CXX11_ABI=1", "-Wall", "-Wextra",
             "-Werror", "-include", os.path.join(ROOT, "cmake", "glibc_compat.h"), "-isystem", inc, "-isystem",
             os.path.join(inc, "torch", "csrc", "api", "include"), "-isystem", cuda_inc,
             "-I", os.path.join(ROOT, "include")]
    srcs = sorted(glob.glob(os.path.join(NATIVE, "*.cpp")))

    # An object newer than every input (the backend's sources and headers, gpuguard's headers, this
    # script, the extracted PyTorch) is kept: a re-run with nothing changed only links and checks.
    inputs = glob.glob(os.path.join(NATIVE, "*")) + glob.glob(os.path.join(ROOT, "include", "gpuguard", "*.h")) \
        + [os.path.abspath(__file__), os.path.join(ROOT, "cmake", "glibc_compat.h"), os.path.join(tree, ".complete")]
    newest = max(os.path.getmtime(f) for f in inputs)

    def compile_one(src: str) -> str:
        obj = os.path.join(objdir, os.path.basename(src)[:-4] + ".o")
        if os.path.exists(obj) and os.path.getmtime(obj) > newest:
            return obj
        run(["nice", "-n", "10", cxx, *flags, "-c", src, "-o", obj], f"PyTorch {minor}: compiling {src}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        objs = list(pool.map(compile_one, srcs))
    cudart = sorted(glob.glob(os.path.join(cuda_lib, "libcudart.so.*")))[-1]
    tmp = os.path.join(out, f".{name}.tmp")
    # RUNPATH: libgpuguard beside the package (gpuguard/lib); PyTorch's and CUDA's libraries are loaded by
    # `import torch` before the backend is, and found by their sonames.
    run([cxx, "-shared", "-o", tmp, *objs, "-Wl,--no-undefined", "-Wl,--as-needed", "-Wl,-z,now",
         f"-L{tlib}", *[f"-l{x}" for x in LINKED], lib, cudart, "-Wl,-rpath,$ORIGIN/../../lib",
         "-Wl,--push-state,--no-as-needed", "-l:libpthread.so.0", "-l:libdl.so.2", "-Wl,--pop-state"],
        f"PyTorch {minor}: linking {name} with --no-undefined")
    vers = check_versions(tmp, tlib)
    check = run([sys.executable, os.path.join(ROOT, "scripts", "torch_loadcheck.py"), tmp, tlib, cuda_lib,
                 os.path.dirname(os.path.abspath(lib)), os.path.join(cache, "stubs", minor)],
                f"PyTorch {minor}: load check of {name}")
    os.replace(tmp, os.path.join(out, name))
    return (f"PyTorch {tver} (CUDA {cuda}): {name}: compiled -Werror, linked --no-undefined, symbol versions "
            f"{vers}; {check.strip()} [{time.time() - t0:.0f} s]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="libgpuguard.so.0 to link against (its soname is what counts)")
    ap.add_argument("--out", required=True, help="directory for the libgpuguard_torch-*.so files")
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "torch-prebuilt-cache"))
    ap.add_argument("--versions", default=",".join(PINS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    try:
        for minor in a.versions.split(","):
            if minor not in PINS:
                raise Failed(f"no pinned release for PyTorch {minor} (known: {', '.join(PINS)})")
            log(build(minor, os.path.abspath(a.cache), os.path.abspath(a.lib), os.path.abspath(a.out), a.jobs))
    except Failed as e:
        print(f"torch_prebuilt: FAILED: {e}", file=sys.stderr)
        return 1
    log(f"{len(a.versions.split(','))} backends in {a.out} [{time.time() - t0:.0f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
