"""gpuguard.errors — one exception class per status code, each carrying the library's detail message.
Each also derives from the built-in exception of its kind, so ``except PermissionError`` (the built-in)
catches ``gpuguard.PermissionError`` too; ``TimeoutError_``, ``IOError_`` and ``PermissionError_`` are the
old names, kept as aliases."""
from __future__ import annotations

import builtins

from typing import Dict, Type

# The status codes by name: the C table (GG_ERRORS in gpuguard/error.h) in Python. The binding's tests
# check every entry against the library's own gg_err_name(), and that the library has no code missing here.
GG_OK = 0
GG_EINVAL = -1
GG_ENOMEM = -2
GG_ENODEV = -3
GG_EDRIVER = -4
GG_ESTATE = -5
GG_EPERM = -6
GG_ENOTFOUND = -7
GG_ETIMEDOUT = -8
GG_ENOTSUP = -9
GG_EIO = -10

STATUS_CODES: Dict[str, int] = {name: value for name, value in globals().items() if name.startswith("GG_E")}


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
    code, name = GG_EINVAL, "GG_EINVAL"


class OutOfMemoryError(GpuGuardError, MemoryError):
    """GG_ENOMEM: the arena's capacity or the device's memory is exhausted."""
    code, name = GG_ENOMEM, "GG_ENOMEM"


class NoDeviceError(GpuGuardError):
    """GG_ENODEV: no usable device, or no driver."""
    code, name = GG_ENODEV, "GG_ENODEV"


class DriverError(GpuGuardError):
    """GG_EDRIVER: the driver reported a failure."""
    code, name = GG_EDRIVER, "GG_EDRIVER"


class StateError(GpuGuardError):
    """GG_ESTATE: the call is not valid now (after fork(), after teardown, scopes out of order)."""
    code, name = GG_ESTATE, "GG_ESTATE"


class PermissionError(GpuGuardError, builtins.PermissionError):  # noqa: A001 (gpuguard.PermissionError)
    """GG_EPERM: not permitted (another user's process, an unsafe directory)."""
    code, name = GG_EPERM, "GG_EPERM"


class NotFoundError(GpuGuardError, LookupError):
    """GG_ENOTFOUND: no such process, registration or file."""
    code, name = GG_ENOTFOUND, "GG_ENOTFOUND"


class TimeoutError(GpuGuardError, builtins.TimeoutError):  # noqa: A001
    """GG_ETIMEDOUT: a bounded wait ran out."""
    code, name = GG_ETIMEDOUT, "GG_ETIMEDOUT"


class NotSupportedError(GpuGuardError):
    """GG_ENOTSUP: not supported here."""
    code, name = GG_ENOTSUP, "GG_ENOTSUP"


class IOError(GpuGuardError, builtins.OSError):  # noqa: A001
    """GG_EIO: an input/output error."""
    code, name = GG_EIO, "GG_EIO"


# The names of earlier versions.
PermissionError_ = PermissionError
TimeoutError_ = TimeoutError
IOError_ = IOError

BY_CODE: Dict[int, Type[GpuGuardError]] = {
    cls.code: cls
    for cls in (InvalidArgumentError, OutOfMemoryError, NoDeviceError, DriverError, StateError,
                PermissionError, NotFoundError, TimeoutError, NotSupportedError, IOError)
}


def error_for(code: int, message: str, name: str) -> GpuGuardError:
    """The exception for a status code (GpuGuardError itself for codes this binding does not know)."""
    cls = BY_CODE.get(code, GpuGuardError)
    return cls(message or name, code, name)


SIZE_MAX = (1 << 64) - 1
INT_MAX = (1 << 31) - 1


class _ArgumentTypeError(InvalidArgumentError, TypeError):
    """A value of the wrong type where C wants an int: both InvalidArgumentError and TypeError."""


def check_int(call: str, name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi], or InvalidArgumentError naming the call and argument: ctypes would
    wrap an out-of-range Python int silently (2**64 + 100 becoming 100) where C's range ends. A value
    that is no int (bool included) raises one that is a TypeError too."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _ArgumentTypeError(f"{call}: {name} must be an int, not {type(value).__name__}", GG_EINVAL,
                                 "GG_EINVAL")
    if not lo <= value <= hi:
        raise InvalidArgumentError(f"{call}: {name} {value} is out of range ({lo}..{hi})", GG_EINVAL, "GG_EINVAL")
    return value


def check_interval(call: str, value: object) -> float:
    """A sampling interval in seconds: from 0.001 to 86400 (as `gpuguard watch` takes), else ValueError
    (TypeError for a value that is no number). Zero, a negative or NaN interval would sample in a busy
    loop; one beyond what a thread can wait would end the sampling thread."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{call}: interval must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    if not (0.001 <= v <= 86400):
        raise ValueError(f"{call}: interval {value!r} must be a number of seconds from 0.001 to 86400")
    return v


def check_str(call: str, name: str, value: object) -> None:
    """None or a str, else TypeError naming the argument."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{call}: {name} must be a str or None, not {type(value).__name__}")


def check_no_nul(call: str, name: str, value: bytes) -> bytes:
    """``value`` unchanged, or InvalidArgumentError: C would cut the string at its first NUL byte."""
    if b"\0" in value:
        raise InvalidArgumentError(f"{call}: {name} {value!r} holds a NUL byte (C would cut it there)", GG_EINVAL,
                                   "GG_EINVAL")
    return value
