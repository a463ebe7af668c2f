"""gpuguard.torch._native — gpuguard as PyTorch's CUDA allocator backend (the C++ sources in ``native/``:
a torch-free adapter core and a thin CUDAAllocator facade over it), loaded and installed with PyTorch's
own ``changeCurrentAllocator`` before the first CUDA allocation.

The wheel carries it prebuilt for the PyTorch versions of PREBUILT (``prebuilt/``, built by
scripts/torch_prebuilt.py against each version's wheel from the package index): the one matching the
running PyTorch's major.minor and CUDA major is loaded as it is, no compiler needed. Any other PyTorch
(2.8 or later) gets it built once at first use against its headers, with one line saying so. That build
needs a C++ compiler (``$CXX``, ``c++`` or ``g++``), PyTorch's headers (in every PyTorch wheel),
the CUDA runtime's headers (``CUDA_HOME``, ``/usr/local/cuda`` or the ``nvidia-cuda-runtime`` wheel PyTorch
depends on) and gpuguard's headers (in the gpuguard wheel). It takes ~10 s once; the library is cached
under ``$XDG_CACHE_HOME/gpuguard`` (``~/.cache/gpuguard``), keyed by the source, PyTorch's version and
path and libgpuguard's path, in a directory only the user may write (anything else is refused and the
build goes to a private temporary directory instead)."""
from __future__ import annotations

import atexit
import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, List, Optional

from .. import _cachedir, _cxxruntime, _lib

_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
# Every source and header of the backend (the cache key hashes them all); the .cpp files are compiled.
_SOURCES = sorted(glob.glob(os.path.join(_DIR, "*.cpp")) + glob.glob(os.path.join(_DIR, "*.h")))
_CPP = [f for f in _SOURCES if f.endswith(".cpp")]
# The versions the release wheel carries prebuilt (scripts/torch_prebuilt.py builds the same list).
PREBUILT = ("2.8", "2.9", "2.10", "2.11")
_PREBUILT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")
_loaded: Optional[ctypes.CDLL] = None
_why_not = ""


class NativeUnavailable(RuntimeError):
    """The backend cannot be built or loaded here; the message says what is missing and how to get it."""


class Unsupported(NativeUnavailable):
    """This PyTorch is older than the backend serves: PyTorch's own allocator stays, whatever the options."""


def why_not() -> str:
    """Why the last attempt to build or load the backend failed ("" when it did not)."""
    return _why_not


def _cache_dir() -> str:
    return _cachedir.private_dir("gpuguard")  # ours alone, or a private one: the .so is loaded as code


def _site_dirs(torch: Any) -> List[str]:
    tdir = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    return [tdir] + [p for p in sys.path if p.endswith("site-packages") and p != tdir]


def _cuda_include(torch: Any) -> Optional[str]:
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    dirs = [os.path.join(c, "include") for c in cands if c]
    for site in _site_dirs(torch):
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    for d in dirs:
        if os.path.exists(os.path.join(d, "cuda_runtime_api.h")):
            return d
    return None


def _cudart(torch: Any) -> Optional[str]:
    tlib = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    pats = [os.path.join(tlib, "libcudart.so*")]
    for site in _site_dirs(torch):
        pats.append(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*"))
    for c in [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]:
        if c:
            pats.append(os.path.join(c, "lib64", "libcudart.so*"))
    for pat in pats:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def _gpuguard_include() -> Optional[str]:
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cands = [os.environ.get("GPUGUARD_INCLUDE_DIR"), os.path.join(pkg, "include"),
             os.path.join(pkg, "..", "..", "..", "include")]
    for d in cands:
        if d and os.path.exists(os.path.join(d, "gpuguard", "share.h")):
            return os.path.abspath(d)
    return None


MIN_TORCH = (2, 8)


def _torch_version(torch: Any) -> tuple:
    parts = []
    for p in str(torch.__version__).split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def prebuilt_name(torch: Any) -> Optional[str]:
    """The prebuilt backend's file name for this PyTorch (major.minor, CUDA major), or None for a PyTorch
    without CUDA or built with the old C++ ABI (the prebuilt ones use the new one, as PyTorch's wheels)."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if not cuda or int(getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", 1)) != 1:
        return None
    major, minor = _torch_version(torch)[:2]
    return f"libgpuguard_torch-{major}.{minor}-cu{str(cuda).split('.')[0]}.so"


def prebuilt(torch: Any) -> Optional[str]:
    """The path of the prebuilt backend this wheel carries for this PyTorch, or None."""
    name = prebuilt_name(torch)
    path = os.path.join(_PREBUILT_DIR, name) if name else ""
    return path if name and os.path.isfile(path) else None


def _carried() -> str:
    names = sorted(glob.glob(os.path.join(_PREBUILT_DIR, "libgpuguard_torch-*.so")))
    if not names:
        return "this gpuguard carries no prebuilt backends (built without them: docs/python.md)"
    tags = [os.path.basename(n)[len("libgpuguard_torch-"):-len(".so")] for n in names]
    return "prebuilt for " + ", ".join(tags)


def _no_prebuilt(torch: Any) -> str:
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    return f"no prebuilt backend for PyTorch {torch.__version__} with CUDA {cuda} ({_carried()})"


def _build(torch: Any) -> str:
    if _torch_version(torch) < MIN_TORCH:
        raise Unsupported(
            f"gpuguard's PyTorch backend serves PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} and later; this is PyTorch "
            f"{torch.__version__} (upgrade PyTorch for gpuguard's)")
    tdir = os.path.dirname(os.path.abspath(torch.__file__))
    inc, libdir = os.path.join(tdir, "include"), os.path.join(tdir, "lib")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    missing = []
    if not cxx:
        missing.append("a C++ compiler (install g++, or set CXX)")
    if not os.path.exists(os.path.join(inc, "c10", "cuda", "CUDACachingAllocator.h")):
        missing.append(f"PyTorch's CUDA headers (under {inc})")
    cuda_inc = _cuda_include(torch)
    if not cuda_inc:
        missing.append("the CUDA runtime headers (cuda_runtime_api.h: set CUDA_HOME, or pip install "
                       "nvidia-cuda-runtime for your CUDA version)")
    gg_inc = _gpuguard_include()
    if not gg_inc:
        missing.append("gpuguard's headers (gpuguard/include in the wheel; or set GPUGUARD_INCLUDE_DIR)")
    if missing:
        raise NativeUnavailable(f"gpuguard: {_no_prebuilt(torch)}; building it here needs " + "; ".join(missing))
    lib = os.path.realpath(_lib.path)
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    h = hashlib.sha256()
    for src in _SOURCES:  # the source and the headers it includes from beside it
        with open(src, "rb") as f:
            h.update(f.read())
    stdcxx = _cxxruntime.loaded_libstdcxx()
    runtime = [stdcxx] if stdcxx else []  # named first: its symbols win over any static fallback
    h.update(f"{torch.__version__}|{tdir}|{lib}|{abi}|{gg_inc}|{cuda_inc}|{stdcxx}".encode())
    key = h.hexdigest()[:16]
    cache = _cache_dir()
    out = os.path.join(cache, f"libgpuguard_torch_native-{key}.so")
    if os.path.lexists(out):
        if _cachedir.usable(out):
            return out
        raise NativeUnavailable(f"gpuguard: refusing {out}: not a regular file of this user, or writable by others")
    sys.stderr.write(f"gpuguard: {_no_prebuilt(torch)}: building it for this PyTorch once (about 15 s), "
                     f"cached in {cache}\n")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           "-isystem", inc, "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"),
           "-isystem", cuda_inc, "-I", gg_inc, *_CPP, "-o", tmp, *runtime, lib,
           f"-Wl,-rpath,{os.path.dirname(lib)}", f"-L{libdir}", "-lc10", "-lc10_cuda", "-ltorch_cuda", "-ltorch_cpu",
           f"-Wl,-rpath,{libdir}"]
    rt = _cudart(torch)
    if rt:
        cmd += [rt, f"-Wl,-rpath,{os.path.dirname(rt)}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        os.unlink(tmp)
        raise NativeUnavailable(f"gpuguard: building the PyTorch backend failed: {e}") from e
    if r.returncode != 0:
        os.unlink(tmp)
        tail = "\n".join(r.stderr.strip().splitlines()[-12:])
        raise NativeUnavailable(f"gpuguard: building the PyTorch backend failed ({' '.join(cmd[:2])} ...):\n{tail}")
    os.chmod(tmp, 0o700)
    os.replace(tmp, out)  # atomic: a concurrent process sees the whole file or none
    return out


def load(torch: Any) -> ctypes.CDLL:
    """The backend's library, built first when needed; NativeUnavailable says why it cannot be."""
    global _loaded, _why_not
    if _loaded is not None:
        return _loaded
    path = "the PyTorch backend"
    try:
        path = prebuilt(torch) or _build(torch)
        lib = ctypes.CDLL(path)
        own = _cxxruntime.defining_file(lib, "__cxa_throw")
        if own is not None and own == os.path.realpath(path):
            raise NativeUnavailable(
                f"gpuguard: the PyTorch backend at {path} carries its own copy of the C++ runtime (the compiler "
                "linked libstdc++.a: its libstdc++.so is missing), which would crash inside PyTorch: install "
                "the compiler's libstdc++ development package (libstdc++-N-dev), delete that file, and retry")
    except NativeUnavailable as e:
        _why_not = str(e)
        raise
    except OSError as e:
        _why_not = f"gpuguard: loading {path} failed: {e}"
        raise NativeUnavailable(_why_not) from e
    lib.gg_torch_native_install.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.gg_torch_native_install.restype = ctypes.c_int
    lib.gg_torch_native_active.restype = ctypes.c_int
    lib.gg_torch_native_capture_query.argtypes = [ctypes.c_int]
    lib.gg_torch_native_capture_query.restype = ctypes.c_int
    lib.gg_torch_native_counters.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    lib.gg_torch_native_counters.restype = ctypes.c_int
    lib.gg_torch_native_pools.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.gg_torch_native_pools.restype = ctypes.c_long
    lib.gg_torch_native_use_arena.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.gg_torch_native_use_arena.restype = ctypes.c_int
    lib.gg_torch_native_pool_arena.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p]
    lib.gg_torch_native_pool_arena.restype = ctypes.c_int
    lib.gg_torch_native_at_exit.restype = ctypes.c_int
    lib.gg_torch_native_check.restype = ctypes.c_int
    _loaded = lib
    return lib


CAPTURES = ("announced", "any")


def install(torch: Any, capacity: int = 0, chunk_size: int = 0, captures: str = "announced") -> None:
    """Makes gpuguard PyTorch's CUDA allocator (once per process; ``captures`` applies at every call);
    StateError when PyTorch's allocator is initialised already, NativeUnavailable when the backend cannot be
    built here."""
    from ..errors import GG_ESTATE, StateError
    lib = load(torch)
    if not lib.gg_torch_native_active():
        err = ctypes.create_string_buffer(1024)
        if lib.gg_torch_native_install(capacity, chunk_size, err, len(err)) != 0:
            raise StateError("gpuguard.torch: PyTorch refused gpuguard's backend: "
                             + err.value.decode(errors="replace") + " (install it before the first CUDA tensor: "
                             "GPUGUARD_TORCH=1, or call gpuguard.torch.use_native() right after importing torch)",
                             GG_ESTATE, "GG_ESTATE")
        # Registered now, so it runs after the atexit handlers of the program (last in, first out).
        atexit.register(_at_exit, lib)
    lib.gg_torch_native_capture_query(1 if captures == "any" else 0)


def _at_exit(lib: ctypes.CDLL) -> None:
    """Releases what the backend holds of Python's (recorded stacks, out-of-memory observers, trace
    trackers) while the interpreter lives, with the GIL held (a PYFUNCTYPE call keeps it)."""
    call = ctypes.PYFUNCTYPE(ctypes.c_int)(("gg_torch_native_at_exit", lib))
    call()


def active() -> bool:
    """Whether gpuguard's backend is this process's PyTorch allocator."""
    return _loaded is not None and bool(_loaded.gg_torch_native_active())


def counters() -> dict:
    """Pools alive, blocks in pools, blocks in all, captures under way (for tests and diagnostics)."""
    if _loaded is None:
        return {}
    v = (ctypes.c_uint64 * 4)()
    if _loaded.gg_torch_native_counters(v) != 0:
        return {}
    return {"n_pools": v[0], "n_pool_blocks": v[1], "n_blocks": v[2], "n_captures": v[3]}


def check() -> int:
    """The backend's tables walked against its figures: 0, or a negative GG_E* code (for tests)."""
    from ..errors import GG_ESTATE
    return GG_ESTATE if _loaded is None else int(_loaded.gg_torch_native_check())


def pools() -> list:
    """The private pools alive: (first, second, use_count, live blocks) each (for tests and diagnostics)."""
    if _loaded is None:
        return []
    n = _loaded.gg_torch_native_pools(None, 0)
    if n < 0:
        return []
    buf = ctypes.create_string_buffer(n + 1)
    _loaded.gg_torch_native_pools(buf, len(buf))
    return [tuple(int(x) for x in line.split()) for line in buf.value.decode().splitlines() if line]


def use_arena(device: int, handle: int) -> int:
    """Device ``device``'s default pool draws from the arena ``handle``: 0, GG_EINVAL (an arena without
    stream tracking), GG_ESTATE (another arena serves the device already, or the backend is not installed)."""
    from ..errors import GG_ESTATE
    return GG_ESTATE if _loaded is None else int(_loaded.gg_torch_native_use_arena(device, handle))


def pool_arena(pool_id: "tuple[int, int]", device: int, handle: int) -> int:
    """The MemPool ``pool_id`` draws from the arena ``handle``: 0, or GG_ESTATE (the pool holds memory of
    another source already, or the backend is not installed)."""
    from ..errors import GG_ESTATE
    if _loaded is None:
        return GG_ESTATE
    return int(_loaded.gg_torch_native_pool_arena(pool_id[0], pool_id[1], device, handle))
