"""gpuguard._cxxruntime — which C++ runtime a process and a library run on: C++ built at run time (the
PyTorch backend) must link the libstdc++ the process already runs on, never a private static copy.
Needs no PyTorch."""
from __future__ import annotations

import ctypes
import os
from typing import Optional


def loaded_libstdcxx() -> Optional[str]:
    """The C++ runtime this process runs on (PyTorch loaded it): the backend must link that very library.
    A compiler whose libstdc++.so link is missing falls back to libstdc++.a without a word, and the
    backend then carries a private copy of the runtime with its own, never initialised, locale: on the
    H200 machine the first `ostream << pointer` in it (an error message) jumped to address 0."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libstdc++.so") and os.path.exists(path):
                    return path
    except OSError:
        pass
    return None


def defining_file(lib: ctypes.CDLL, symbol: str) -> Optional[str]:
    """The file that defines `symbol` as `lib` resolves it (dladdr), or None when that cannot be told."""
    try:
        libdl = ctypes.CDLL(None)
        addr = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
    except (AttributeError, OSError):
        return None

    class _DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                    ("saddr", ctypes.c_void_p)]

    info = _DlInfo()
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not addr or not libdl.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)) or not info.fname:
        return None
    return os.path.realpath(info.fname.decode(errors="replace"))
