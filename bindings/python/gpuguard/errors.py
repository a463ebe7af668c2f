"""gpuguard.errors — one exception class per status code, each carrying the library's detail message."""
from __future__ import annotations

from typing import Dict, Type


class GpuGuardError(Exception):
    """A gpuguard call failed. ``code`` is the negative GG_E* status, ``name`` its symbolic name and the
    message is the library's detail (which call, which argument, the driver's error)."""

    code: int = 0
    name: str = "GG_UNKNOWN"

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name


class InvalidArgumentError(GpuGuardError, ValueError):
    """GG_EINVAL: a bad argument, option or environment value."""
    code, name = -1, "GG_EINVAL"


class OutOfMemoryError(GpuGuardError, MemoryError):
    """GG_ENOMEM: the arena's capacity or the device's memory is exhausted."""
    code, name = -2, "GG_ENOMEM"


class NoDeviceError(GpuGuardError):
    """GG_ENODEV: no usable device, or no driver."""
    code, name = -3, "GG_ENODEV"


class DriverError(GpuGuardError):
    """GG_EDRIVER: the driver reported a failure."""
    code, name = -4, "GG_EDRIVER"


class StateError(GpuGuardError):
    """GG_ESTATE: the call is not valid now (after fork(), after teardown, scopes out of order)."""
    code, name = -5, "GG_ESTATE"


class PermissionError_(GpuGuardError, PermissionError):
    """GG_EPERM: not permitted (another user's process, an unsafe directory)."""
    code, name = -6, "GG_EPERM"


class NotFoundError(GpuGuardError, LookupError):
    """GG_ENOTFOUND: no such process, registration or file."""
    code, name = -7, "GG_ENOTFOUND"


class TimeoutError_(GpuGuardError, TimeoutError):
    """GG_ETIMEDOUT: a bounded wait ran out."""
    code, name = -8, "GG_ETIMEDOUT"


class NotSupportedError(GpuGuardError):
    """GG_ENOTSUP: not supported here."""
    code, name = -9, "GG_ENOTSUP"


class IOError_(GpuGuardError, OSError):
    """GG_EIO: an input/output error."""
    code, name = -10, "GG_EIO"


BY_CODE: Dict[int, Type[GpuGuardError]] = {
    cls.code: cls
    for cls in (InvalidArgumentError, OutOfMemoryError, NoDeviceError, DriverError, StateError,
                PermissionError_, NotFoundError, TimeoutError_, NotSupportedError, IOError_)
}


def error_for(code: int, message: str, name: str) -> GpuGuardError:
    """The exception for a status code (GpuGuardError itself for codes this binding does not know)."""
    cls = BY_CODE.get(code, GpuGuardError)
    return cls(message or name, code, name)
