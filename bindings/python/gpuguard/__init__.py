"""gpuguard — scoped GPU memory, exit-path guards and process teardown for Python trainers, through a
thin ctypes binding over libgpuguard (the same library C and C++ programs use).

``gpuguard.torch`` (PyTorch's allocator drawing from an arena) and ``gpuguard.cupy`` are separate
modules, imported on demand: ``import gpuguard`` never imports torch or cupy."""
from __future__ import annotations

import os as _os
import sys as _sys

from ._lib import version
from ._version import __version__ as __version__
from .arena import NO_STREAM, TRIM_ON_SCOPE_EXIT, Allocation, Arena, ArenaScope
from .errors import (DriverError, GpuGuardError, InvalidArgumentError, IOError, NoDeviceError,  # noqa: A004
                     NotFoundError, NotSupportedError, OutOfMemoryError, PermissionError, StateError, TimeoutError)
# The older names with a trailing underscore, kept importable (not in __all__).
from .errors import IOError_ as IOError_, PermissionError_ as PermissionError_, TimeoutError_ as TimeoutError_
from .guard import DEFAULT_SIGNALS, SIGHUP, SIGINT, SIGNALS_FATAL, SIGQUIT, SIGTERM, Guard
from .proc import (adopt, arm_child, close_device_fds, orphans, pid_ns_probe, registry_list, registry_register,
                   registry_session, registry_unregister, set_subreaper, spawn, teardown)
from .query import device_count, device_info, device_telemetry, processes

# Memory diagnostics, imported on first use so that `import gpuguard` stays light (none imports torch).
_LAZY = {"holders": ".diagnostics.holding", "Holders": ".diagnostics.holding", "rounds": ".diagnostics.growth",
         "MemoryGrowthWarning": ".diagnostics.growth",
         "record": ".diagnostics.timeline", "monitor": ".diagnostics.monitoring",
         "Monitor": ".diagnostics.monitoring"}


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpuguard' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def get_include() -> str:
    """The directory of gpuguard's C headers inside the installed package (``#include <gpuguard/gpuguard.h>``)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")


def get_cmake_dir() -> str:
    """The directory of gpuguard's CMake package inside the installed package (``gpuguard_DIR``)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "lib", "cmake", "gpuguard")


#: The prefix to add to CMAKE_PREFIX_PATH so that ``find_package(gpuguard)`` finds the installed wheel's
#: library, headers and CMake package: ``cmake -DCMAKE_PREFIX_PATH=$(python -c "import gpuguard;
#: print(gpuguard.cmake_prefix_path)")``.
cmake_prefix_path = _os.path.dirname(_os.path.abspath(__file__))


# The start-up hook (gpuguard/_pth.py) loads these three before the package, so the import system did not
# make them its attributes: ``gpuguard._workers`` must still work after ``import gpuguard``.
for _hooked in ("_autostart", "_postimport", "_workers"):
    if __name__ + "." + _hooked in _sys.modules:
        globals()[_hooked] = _sys.modules[__name__ + "." + _hooked]


def load_ipython_extension(shell: object) -> None:
    """``%load_ext gpuguard`` in IPython/Jupyter: see gpuguard.diagnostics.notebook."""
    from .diagnostics.notebook import load_ipython_extension as load
    load(shell)


def unload_ipython_extension(shell: object) -> None:
    """``%unload_ext gpuguard``."""
    from .diagnostics.notebook import unload_ipython_extension as unload
    unload(shell)

__all__ = [
    "Allocation", "Arena", "ArenaScope", "NO_STREAM", "TRIM_ON_SCOPE_EXIT", "DriverError", "GpuGuardError",
    "InvalidArgumentError", "IOError", "NoDeviceError", "NotFoundError", "NotSupportedError",
    "OutOfMemoryError", "PermissionError", "StateError", "TimeoutError", "device_count", "device_info", "device_telemetry",
    "processes", "version", "Guard", "DEFAULT_SIGNALS", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT",
    "SIGNALS_FATAL", "spawn", "adopt", "teardown", "arm_child", "set_subreaper", "close_device_fds",
    "registry_list", "registry_register", "registry_session", "registry_unregister", "orphans", "pid_ns_probe",
    "holders", "Holders", "rounds", "MemoryGrowthWarning", "record", "monitor", "Monitor",
    "load_ipython_extension", "unload_ipython_extension", "get_include", "get_cmake_dir", "cmake_prefix_path",
]


def __dir__() -> "list[str]":
    """The public names, the lazily imported diagnostics (holders, rounds, monitor, record) included."""
    return sorted(set(__all__) | {"__version__"})


# `from __future__ import annotations` leaves a module attribute that is no part of the API.
del annotations
