"""gpuguard._lib — finds libgpuguard.so, declares every C function the binding uses (one table), and
turns negative status codes into exceptions carrying the library's detail message."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_int, c_longlong, c_size_t, c_uint,
                    c_ulonglong, c_void_p)
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from ._version import __version__
from .errors import GG_ENOTSUP, error_for


def _candidates() -> Tuple[List[str], str]:
    """Where libgpuguard is looked for, in order, and a description of that for messages."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "lib", "libgpuguard.so.0")]  # inside a wheel (pip install)
    candidates += [os.path.join(here, n) for n in sorted(os.listdir(here)) if n.startswith("libgpuguard.so")]
    found = ctypes.util.find_library("gpuguard")
    candidates += [c for c in (found, "libgpuguard.so.0", "libgpuguard.so") if c]
    return candidates, f"inside the package ({here}/lib), next to it, the system loader"


def _load() -> Tuple[ctypes.CDLL, str]:
    """GPUGUARD_LIBRARY alone when it is set (an explicit choice is never swapped for another copy);
    else the copy the wheel installed inside the package, then one next to it, then the system loader."""
    env = os.environ.get("GPUGUARD_LIBRARY")
    if env and os.sep in env and not os.path.isabs(env):
        # Made absolute once, here: a child started in another directory (a worker, `gpuguard plot`)
        # inherits the variable and would otherwise look for another file.
        env = os.environ["GPUGUARD_LIBRARY"] = os.path.abspath(env)
    if env:
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise ImportError(f"gpuguard: GPUGUARD_LIBRARY={env} cannot be loaded: {e}. Unset it to use the "
                              "library installed with the package.") from None
    tried: List[str] = []
    candidates, where = _candidates()
    for path in candidates:
        if os.path.isabs(path) and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("gpuguard: libgpuguard.so not found. Looked " + where + ". "
                      + ("Errors: " + "; ".join(tried) + ". " if tried else "")
                      + "Install the package as a wheel (pip install ./bindings/python builds the library "
                      "into it), or build it with cmake and set GPUGUARD_LIBRARY=/path/to/libgpuguard.so.")


def _release(v: str) -> Tuple[str, ...]:
    """MAJOR.MINOR.PATCH of a version string ('0.1.0.dev1' -> ('0', '1', '0'))."""
    return tuple(v.split("+")[0].split(".")[:3])


def _check_version(lib: ctypes.CDLL, path: str) -> str:
    """The binding declares struct layouts and functions of one library version: another version could
    read or write memory wrongly, so a mismatch stops the import instead of warning."""
    try:
        fn = lib.gg_version
    except AttributeError:
        raise ImportError(f"gpuguard: {path} has no gg_version(): not a gpuguard library") from None
    fn.argtypes, fn.restype = [], c_char_p
    have = (fn() or b"").decode(errors="replace")
    if _release(have) != _release(__version__):
        raise ImportError(f"gpuguard: the library {path} is version {have}, but this Python package is "
                          f"{__version__}; they must match. Reinstall the package (pip install "
                          "./bindings/python builds both), or point GPUGUARD_LIBRARY at a library built from "
                          "the same checkout.")
    return have


lib, path = _load()
_check_version(lib, path)


class DeviceInfo(Structure):
    _fields_ = [("index", c_int), ("backend", c_char * 8), ("name", c_char * 256), ("uuid", c_char * 48),
                ("total_bytes", c_size_t), ("free_bytes", c_size_t), ("used_bytes", c_size_t),
                ("cc_major", c_int), ("cc_minor", c_int), ("driver_version", c_int), ("vmm_supported", c_int),
                ("simulated", c_int)]


class DeviceTelemetry(Structure):
    _fields_ = [("index", c_int), ("utilization_gpu", c_int), ("utilization_memory", c_int),
                ("temperature_c", c_int), ("power_watts", c_double), ("power_limit_watts", c_double)]


class Process(Structure):
    _fields_ = [("pid", c_int), ("ppid", c_int), ("uid", c_uint), ("user", c_char * 32), ("state", c_char),
                ("start_time", c_ulonglong), ("used_bytes", c_longlong), ("device", c_int), ("cls", c_int),
                ("session", c_char * 40), ("command", c_char * 256), ("why", c_char * 192)]


class ArenaOptions(Structure):
    _fields_ = [("device", c_int), ("backend", c_char_p), ("capacity", c_size_t), ("chunk_size", c_size_t),
                ("stream", c_void_p), ("flags", c_uint), ("name", c_char_p)]


class ArenaStats(Structure):
    _fields_ = [("bytes_in_use", c_size_t), ("bytes_mapped", c_size_t), ("bytes_reserved", c_size_t),
                ("peak_in_use", c_size_t), ("peak_mapped", c_size_t), ("largest_free_block", c_size_t),
                ("n_live", c_ulonglong), ("n_allocs", c_ulonglong), ("n_frees", c_ulonglong),
                ("n_trims", c_ulonglong), ("bytes_trimmed", c_ulonglong), ("scope_depth", c_int),
                ("fragmentation", c_double), ("bytes_pending", c_size_t), ("n_chunks", c_ulonglong),
                ("n_events", c_ulonglong), ("n_stream_waits", c_ulonglong), ("n_maps", c_ulonglong),
                ("n_unmaps", c_ulonglong), ("reserved_", c_ulonglong * 14)]


class StatsBuffer(Structure):
    """Room for the stats struct plus a reserve: a newer library may append fields, and must never
    write past what Python allocated."""
    _fields_ = [("stats", ArenaStats), ("_reserve", c_char * 256)]


class Scope(Structure):
    _fields_ = [("arena", c_void_p), ("id", c_ulonglong)]


class BlockInfo(Structure):
    _fields_ = [("ptr", c_void_p), ("size", c_size_t), ("tag", c_char_p), ("scope_depth", c_int),
                ("n_frames", c_int), ("frames", POINTER(c_void_p))]


BLOCK_VISITOR = ctypes.CFUNCTYPE(c_int, POINTER(BlockInfo), c_void_p)


class GuardOptions(Structure):
    _fields_ = [("device", c_int), ("backend", c_char_p), ("signals", c_uint), ("run_at_exit", c_bool),
                ("reset_context", c_bool), ("teardown_timeout_ms", c_int), ("leak_report", c_char_p),
                ("name", c_char_p), ("child_grace_ms", c_int)]


CLEANUP_FN = ctypes.CFUNCTYPE(None, c_void_p)


class SpawnOptions(Structure):
    _fields_ = [("size", c_size_t), ("new_process_group", c_int), ("env", POINTER(c_char_p)),
                ("stdin_fd", c_int), ("stdout_fd", c_int), ("stderr_fd", c_int), ("cwd", c_char_p),
                ("death_signal", c_int), ("close_device_fds", c_int), ("pid_ns", c_int),
                ("pid_ns_grace_ms", c_int), ("keep_ignored", c_int)]


class SessionRecord(Structure):
    _fields_ = [("pid", c_int), ("ppid", c_int), ("start_time", c_ulonglong), ("session", c_char * 40),
                ("role", c_char * 16), ("devices", c_char * 64), ("command", c_char * 256),
                ("stale", c_int), ("parent_alive", c_int)]


def _check(rc: int, func: Any, args: Any) -> int:
    """errcheck for every status-returning call: negative codes become exceptions."""
    if rc < 0:
        raise error_for(rc, lib.gg_last_error().decode(errors="replace"), lib.gg_err_name(rc).decode())
    return rc


# (name, argtypes, restype, checked): every C function the binding uses, in one place.
_STATUS = c_int
FUNCTIONS: List[Tuple[str, list, Any, bool]] = [
    ("gg_strerror", [c_int], c_char_p, False),
    ("gg_err_name", [c_int], c_char_p, False),
    ("gg_last_error", [], c_char_p, False),
    ("gg_version", [], c_char_p, False),
    ("gg_sizeof", [c_char_p], c_size_t, False),
    ("gg_device_count", [POINTER(c_int)], _STATUS, True),
    ("gg_device_info", [c_int, POINTER(DeviceInfo)], _STATUS, True),
    ("gg_device_telemetry", [c_int, POINTER(DeviceTelemetry)], _STATUS, True),
    ("gg_process_list", [c_int, POINTER(Process), c_size_t, POINTER(c_size_t)], _STATUS, True),
    ("gg_process_class_name", [c_int], c_char_p, False),
    ("gg_host_fault_set", [c_char_p], _STATUS, True),
    ("gg_host_op_count", [c_char_p], c_ulonglong, False),
    ("gg_host_stream_create", [POINTER(c_void_p)], _STATUS, True),
    ("gg_host_stream_hold", [c_void_p], _STATUS, True),
    ("gg_host_stream_release", [c_void_p], _STATUS, True),
    ("gg_host_stream_destroy", [c_void_p], _STATUS, True),
    ("gg_arena_options_init", [POINTER(ArenaOptions)], None, False),
    ("gg_arena_create", [POINTER(c_void_p), POINTER(ArenaOptions)], _STATUS, True),
    ("gg_arena_destroy", [c_void_p], _STATUS, True),
    ("gg_alloc", [c_void_p, c_size_t, POINTER(c_void_p)], _STATUS, True),
    ("gg_alloc_ex", [c_void_p, c_size_t, c_size_t, c_char_p, POINTER(c_void_p)], _STATUS, True),
    ("gg_free", [c_void_p, c_void_p], _STATUS, True),
    ("gg_scope_begin", [c_void_p, POINTER(Scope)], _STATUS, True),
    ("gg_scope_end", [POINTER(Scope)], _STATUS, True),
    ("gg_arena_trim", [c_void_p, c_size_t], _STATUS, True),
    ("gg_arena_stats", [c_void_p, POINTER(StatsBuffer)], _STATUS, True),
    ("gg_arena_foreach_block", [c_void_p, BLOCK_VISITOR, c_void_p], _STATUS, True),
    ("gg_arena_name", [c_void_p], c_char_p, False),
    ("gg_arena_backend", [c_void_p], c_char_p, False),
    ("gg_arena_copy_to_device", [c_void_p, c_void_p, c_void_p, c_size_t], _STATUS, True),
    ("gg_arena_copy_from_device", [c_void_p, c_void_p, c_void_p, c_size_t], _STATUS, True),
    ("gg_arena_memset", [c_void_p, c_void_p, c_int, c_size_t], _STATUS, True),
    # guards
    ("gg_guard_options_init", [POINTER(GuardOptions)], None, False),
    ("gg_guard_create", [POINTER(c_void_p), POINTER(GuardOptions)], _STATUS, True),
    ("gg_guard_destroy", [c_void_p], _STATUS, True),
    ("gg_guard_on_teardown_ex", [c_void_p, CLEANUP_FN, c_void_p, c_char_p, POINTER(c_ulonglong)], _STATUS,
     True),
    ("gg_guard_cancel", [c_void_p, c_ulonglong], _STATUS, True),
    # processes (teardown_ex is checked by hand: its receipt comes back with GG_ETIMEDOUT too)
    ("gg_spawn_options_init", [POINTER(SpawnOptions)], None, False),
    ("gg_proc_spawn", [c_void_p, POINTER(c_char_p), POINTER(SpawnOptions), POINTER(c_int)], _STATUS, True),
    ("gg_proc_adopt_ex", [c_void_p, c_int, c_ulonglong], _STATUS, True),
    ("gg_proc_pid_ns_probe", [], _STATUS, False),  # 1 or 2 when available: not an error code
    ("gg_proc_arm_child", [], _STATUS, True),
    ("gg_proc_set_subreaper", [c_int], _STATUS, True),
    ("gg_proc_close_device_fds", [], _STATUS, True),
    ("gg_proc_teardown_ex", [c_void_p, c_int, POINTER(c_void_p)], _STATUS, False),
    ("gg_proc_receipt_json", [c_void_p, c_char_p, c_size_t, POINTER(c_size_t)], _STATUS, False),
    ("gg_proc_receipt_free", [c_void_p], None, False),
    ("gg_registry_list", [POINTER(SessionRecord), c_size_t, POINTER(c_size_t)], _STATUS, True),
    ("gg_registry_register", [c_char_p], _STATUS, True),
    ("gg_registry_unregister", [], _STATUS, True),
    ("gg_registry_session", [c_char_p, c_size_t], _STATUS, True),
    ("gg_orphan_list", [POINTER(Process), c_size_t, POINTER(c_size_t)], _STATUS, True),
    ("gg_arena_reset_peak", [c_void_p], _STATUS, True),
    # stream-ordered arena calls (what gpuguard's PyTorch backend uses; cudaMallocAsync-like)
    ("gg_alloc_on", [c_void_p, c_size_t, c_void_p, POINTER(c_void_p)], _STATUS, True),
    ("gg_free_on", [c_void_p, c_void_p, c_void_p], _STATUS, True),
    ("gg_arena_join_stream", [c_void_p, c_void_p], _STATUS, True),
]


def _missing(name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        from .errors import NotSupportedError
        raise NotSupportedError(f"{path} has no {name}(): the library is older than this binding", GG_ENOTSUP,
                                "GG_ENOTSUP")
    return call


class _Functions:
    """Attribute access to the declared functions; a symbol the library lacks raises when called."""

    if TYPE_CHECKING:  # set from FUNCTIONS below: any name, as far as the type checker knows

        def __getattr__(self, name: str) -> Any: ...


C = _Functions()
for _name, _args, _res, _checked in FUNCTIONS:
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        setattr(C, _name, _missing(_name))
        continue
    _fn.argtypes = _args
    _fn.restype = _res
    if _checked:
        _fn.errcheck = _check
    setattr(C, _name, _fn)


# The calls on the per-allocation path, without errcheck: the caller tests the status itself, which
# saves a Python-level call per C call (the binding's overhead per alloc+free and per scope is the cost
# users see). Separate function objects (lib[name]), so the checked ones above stay as they are.
_HOT = ("gg_alloc_ex", "gg_free", "gg_scope_begin", "gg_scope_end")


class _Raw:
    """Unchecked hot-path functions: each returns the raw status; use raise_for() on a negative one."""

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


RAW = _Raw()
for _name, _args, _res, _checked in FUNCTIONS:
    if _name in _HOT:
        try:
            _fn = lib[_name]
        except AttributeError:
            setattr(RAW, _name, _missing(_name))
            continue
        _fn.argtypes, _fn.restype = _args, _res
        setattr(RAW, _name, _fn)


def raise_for(rc: int) -> None:
    """Raises the exception for a negative status, with this thread's detail message."""
    raise error_for(rc, lib.gg_last_error().decode(errors="replace"), lib.gg_err_name(rc).decode())


def enc(s: Optional[str]) -> Optional[bytes]:
    """str → bytes for char* arguments (None stays NULL); TypeError for anything else."""
    if s is None:
        return None
    if not isinstance(s, str):
        raise TypeError(f"gpuguard: a str or None expected, not {type(s).__name__}")
    return s.encode(errors="surrogateescape")


def version() -> str:
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return lib.gg_version().decode()
