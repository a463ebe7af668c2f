"""gpuguard — scoped GPU memory, exit-path guards and process teardown for Python trainers, through a
thin ctypes binding over libgpuguard (the same library C and C++ programs use)."""
from __future__ import annotations

from ._lib import version
from .arena import NO_STREAM, TRIM_ON_SCOPE_EXIT, Allocation, Arena, ArenaScope
from .errors import (DriverError, GpuGuardError, InvalidArgumentError, IOError_, NoDeviceError,
                     NotFoundError, NotSupportedError, OutOfMemoryError, PermissionError_, StateError,
                     TimeoutError_)
from .query import device_count, device_info, processes

__version__ = "0.1.0"

__all__ = [
    "Allocation", "Arena", "ArenaScope", "NO_STREAM", "TRIM_ON_SCOPE_EXIT", "DriverError", "GpuGuardError",
    "InvalidArgumentError", "IOError_", "NoDeviceError", "NotFoundError", "NotSupportedError",
    "OutOfMemoryError", "PermissionError_", "StateError", "TimeoutError_", "device_count", "device_info",
    "processes", "version",
]
