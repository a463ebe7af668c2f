"""gpuguard — scoped GPU memory, exit-path guards and process teardown for Python trainers, through a
thin ctypes binding over libgpuguard (the same library C and C++ programs use).

``gpuguard.torch`` (PyTorch's allocator drawing from an arena) and ``gpuguard.cupy`` are separate
modules, imported on demand: ``import gpuguard`` never imports torch or cupy."""
from __future__ import annotations

from ._lib import version
from ._version import __version__
from .arena import NO_STREAM, TRIM_ON_SCOPE_EXIT, Allocation, Arena, ArenaScope
from .errors import (DriverError, GpuGuardError, InvalidArgumentError, IOError_, NoDeviceError,
                     NotFoundError, NotSupportedError, OutOfMemoryError, PermissionError_, StateError,
                     TimeoutError_)
from .guard import DEFAULT_SIGNALS, SIGHUP, SIGINT, SIGNALS_FATAL, SIGQUIT, SIGTERM, Guard
from .proc import (adopt, arm_child, close_device_fds, orphans, registry_list, registry_register,
                   registry_unregister, set_subreaper, spawn, teardown)
from .query import device_count, device_info, processes

__all__ = [
    "Allocation", "Arena", "ArenaScope", "NO_STREAM", "TRIM_ON_SCOPE_EXIT", "DriverError", "GpuGuardError",
    "InvalidArgumentError", "IOError_", "NoDeviceError", "NotFoundError", "NotSupportedError",
    "OutOfMemoryError", "PermissionError_", "StateError", "TimeoutError_", "device_count", "device_info",
    "processes", "version", "Guard", "DEFAULT_SIGNALS", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT",
    "SIGNALS_FATAL", "spawn", "adopt", "teardown", "arm_child", "set_subreaper", "close_device_fds",
    "registry_list", "registry_register", "registry_unregister", "orphans",
]
