"""gpuguard.torch._shim — finds (or builds once) the C++ allocation entry point that PyTorch's global
pluggable allocator calls, so that a failed allocation raises instead of giving a tensor at address 0.

Two builds of ``_shim.cpp`` (beside this file):
- typed: compiled here against the installed PyTorch's headers and libc10, on first use, when a C++
  compiler is there; throws ``c10::OutOfMemoryError``, so PyTorch raises ``torch.OutOfMemoryError``.
  Cached under ``$XDG_CACHE_HOME/gpuguard`` (``~/.cache/gpuguard``) by PyTorch version and library path.
- generic: ``libgpuguard_torch.so`` built with the library (CMake), beside libgpuguard; throws
  ``std::runtime_error``: a RuntimeError whose message starts "CUDA out of memory." as PyTorch's own.

``GPUGUARD_TORCH_SHIM=typed|generic|none`` picks one (default: typed, else generic); ``none`` leaves
PyTorch on the plain C entry points."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Any, Optional

from .. import _cachedir, _lib

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim.cpp")
_kind = ""


def kind() -> str:
    return _kind


def _generic() -> Optional[str]:
    path = os.path.join(os.path.dirname(os.path.realpath(_lib.path)), "libgpuguard_torch.so")
    return path if os.path.exists(path) else None


def _cache_dir() -> str:
    return _cachedir.private_dir("gpuguard")  # ours alone, or a private one: the .so is loaded as code


def _typed(torch: Any) -> Optional[str]:
    """The typed build for this PyTorch and this libgpuguard, compiled once; None when it cannot be."""
    tdir = os.path.dirname(os.path.abspath(torch.__file__))
    inc, libdir = os.path.join(tdir, "include"), os.path.join(tdir, "lib")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    lib = os.path.realpath(_lib.path)
    if not (cxx and os.path.isdir(os.path.join(inc, "c10")) and os.path.exists(_SRC)):
        return None
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    with open(_SRC, "rb") as f:
        key = hashlib.sha256(f.read() + f"{torch.__version__}|{tdir}|{lib}|{abi}".encode()).hexdigest()[:16]
    out = os.path.join(_cache_dir(), f"libgpuguard_torch-{key}.so")
    if _cachedir.usable(out):
        return out
    os.makedirs(_cache_dir(), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=_cache_dir())
    os.close(fd)
    cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-DGG_WITH_C10", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           "-isystem", inc, _SRC, "-o", tmp, lib, f"-Wl,-rpath,{os.path.dirname(lib)}",
           f"-L{libdir}", "-lc10", f"-Wl,-rpath,{libdir}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is None or r.returncode != 0:
        os.unlink(tmp)
        return None
    os.replace(tmp, out)  # atomic: a concurrent process sees the whole file or none
    return out


def find(torch: Any) -> Optional[str]:
    """The path PyTorch's CUDAPluggableAllocator should load, or None (then the plain C entry points)."""
    global _kind
    want = os.environ.get("GPUGUARD_TORCH_SHIM", "typed")
    if want not in ("typed", "generic", "none"):
        from ..errors import GG_EINVAL, InvalidArgumentError
        raise InvalidArgumentError(f"GPUGUARD_TORCH_SHIM='{want}' is not one of typed, generic, none", GG_EINVAL,
                                   "GG_EINVAL")
    path = None
    if want == "typed":
        path = _typed(torch)
        _kind = "torch.OutOfMemoryError" if path else ""
    if path is None and want != "none":
        path = _generic()
        _kind = "RuntimeError" if path else ""
    if path is None:
        _kind = "NULL"
    return path
