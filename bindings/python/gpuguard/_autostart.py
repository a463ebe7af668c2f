"""gpuguard._autostart — ``GPUGUARD_TORCH=1`` without editing the script, as ``PYTORCH_CUDA_ALLOC_CONF`` works.

The wheel installs ``gpuguard_torch.pth`` into site-packages; Python runs its one line at every start, and
that line loads this module (through ``gpuguard/_pth.py``, without the package's ``__init__``) only when
``GPUGUARD_TORCH`` or ``GPUGUARD_WORKERS`` is set (so an interpreter without them pays for two dictionary
lookups), and runs :func:`run` once per process. Then:

- the values are checked at once: a bad one stops the process with exit status 2 and a message naming
  the variable and the value;
- when ``torch`` is first imported, right after its own import finishes (before any CUDA tensor can
  exist), gpuguard becomes PyTorch's CUDA allocator backend (``gpuguard.torch.use_native``), with an
  arena made per device at its first allocation: a DataLoader worker that never touches CUDA makes none;
  a process that never imports torch never loads it;
- a PyTorch without CUDA (CPU-only, ROCm) is left as it is, with one line on stderr; one older than the
  backend's oldest keeps its own allocator, with one line;
- worker processes (``multiprocessing`` children, DataLoader workers) die with the process that started
  them and drop the device descriptors they inherited (``gpuguard._workers``), armed when
  ``multiprocessing`` is first imported: with ``GPUGUARD_WORKERS=1`` in any Python program (torch or
  not, the allocator untouched), and with ``GPUGUARD_TORCH=1`` unless ``GPUGUARD_WORKERS=0`` or the
  option ``workers=off`` says no (``GPUGUARD_WORKERS``, when set, decides).

``GPUGUARD_TORCH`` and ``GPUGUARD_WORKERS``: ``1``/``on``/``true``/``yes`` or ``0``/``off``/``false``/``no``
(or empty: off; unset).
``GPUGUARD_TORCH_OPTIONS``: comma-separated ``key=value``:
  ``capacity=SIZE`` (bytes per device arena; K/M/G/T suffixes; default the device's memory),
  ``chunk=SIZE`` (the arena's growth step), ``backend=native`` (the only one: ``plugin``, the pluggable
  allocator that was removed, is accepted with one line on stderr and the native backend is used),
  ``fallback=none|torch``
  (when the native backend cannot be built here: ``none``, the default, stops the process saying why;
  ``torch`` leaves PyTorch's own allocator in place with one line on stderr), ``workers=on|off``."""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~2 ms at interpreter start: for the checker only
    from typing import Any, Dict, Optional, Tuple

VAR = "GPUGUARD_TORCH"
OPTIONS = "GPUGUARD_TORCH_OPTIONS"
WORKERS = "GPUGUARD_WORKERS"
_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ConfigError(ValueError):
    """A value of GPUGUARD_TORCH or GPUGUARD_TORCH_OPTIONS that is not understood."""


def _split_size(text: str) -> Tuple[str, str]:
    """"64 MiB" -> ("64", "M"): the digits and the unit letter (without the regular expressions module:
    ~3 ms at interpreter start)."""
    t = text.strip().upper()
    if t.endswith("B"):
        t = t[:-2] if t.endswith("IB") else t[:-1]
    unit = t[-1:] if t[-1:] in ("K", "M", "G", "T") else ""
    return t[:len(t) - len(unit)].strip(), unit


def parse_size(text: str, what: str) -> int:
    digits, unit = _split_size(text)
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise ConfigError(f"{OPTIONS}: {what}={_clip(text)!r} is not a size (bytes, or a number with K, M, G or T)")
    if len(digits.lstrip("0")) > 19:  # int() refuses 4300 digits and more (a ValueError, not ours)
        raise ConfigError(f"{OPTIONS}: {what}={_clip(text)!r} is out of range")
    value = int(digits) * _UNITS[unit]
    if value <= 0 or value >= 1 << 62:
        raise ConfigError(f"{OPTIONS}: {what}={_clip(text)!r} is out of range")
    return value


def parse(value: Optional[str], options: Optional[str]) -> Optional[Dict[str, Any]]:
    """The configuration, or None when gpuguard is off; ConfigError for a bad value."""
    v = (value or "").strip().lower()
    if v in _OFF:
        return None
    if v not in _ON:
        raise ConfigError(f"{VAR}={_clip(value)!r} is not understood: use 1 (or on, true, yes) to make gpuguard "
                          "PyTorch's CUDA allocator, 0 (or off) for PyTorch's own")
    cfg: Dict[str, Any] = {"capacity": 0, "chunk": 0, "backend": "native", "fallback": "none", "workers": True,
                           "captures": "announced"}
    for item in (options or "").split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        key = key.strip().lower()
        val = val.strip()
        if not sep:
            raise ConfigError(f"{OPTIONS}={_clip(options)!r}: {_clip(item.strip())!r} is not key=value")
        if key in ("capacity", "chunk"):
            cfg[key] = parse_size(val, key)
        elif key == "backend" and val == "plugin":
            sys.stderr.write(f"gpuguard: {OPTIONS}: backend=plugin is gone (the pluggable allocator was removed); "
                             "using the native backend\n")
        elif key == "backend" and val == "native":
            cfg[key] = val
        elif key == "fallback" and val in ("none", "torch"):
            cfg[key] = val
        elif key == "workers" and val.lower() in ("on", "off", "1", "0"):
            cfg[key] = val.lower() in ("on", "1")
        elif key == "captures" and val.lower() in ("announced", "any"):
            cfg[key] = val.lower()
        else:
            raise ConfigError(f"{OPTIONS}={_clip(options)!r}: {_clip(item.strip())!r} is not understood (keys: capacity=SIZE, "
                              "chunk=SIZE, backend=native, fallback=none|torch, workers=on|off, "
                              "captures=announced|any)")
    return cfg


def parse_workers(value: Optional[str]) -> Optional[bool]:
    """GPUGUARD_WORKERS: True or False, None when unset or empty; ConfigError for a bad value."""
    v = (value or "").strip().lower()
    if not v:
        return None
    if v in _ON or v in _OFF:
        return v in _ON
    raise ConfigError(f"{WORKERS}={_clip(value)!r} is not understood: use 1 (or on, true, yes) for worker "
                      "processes that die with their parent, 0 (or off) to leave them as they are")


def workers_wanted(workers: Optional[bool], cfg: Optional[Dict[str, Any]]) -> bool:
    """Whether to arm workers: GPUGUARD_WORKERS when set, else GPUGUARD_TORCH=1 (unless workers=off)."""
    if workers is not None:
        return workers
    return bool(cfg and cfg["workers"])


def _clip(text: Optional[str]) -> Optional[str]:
    """A value short enough to quote in one line."""
    return text if text is None or len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def _fatal(msg: str) -> None:
    sys.stderr.write(f"gpuguard: {msg}\n")
    sys.stderr.flush()
    os._exit(2)  # a .pth line's exception would only be printed, and the script would run on without gpuguard


def _unserved(torch: Any) -> str:
    """Why gpuguard leaves this PyTorch as it is ("" when it serves it): a ROCm or CPU-only build (nothing
    to do), or one older than the oldest PyTorch the backend is written for."""
    version = getattr(torch, "version", None)
    name = f"PyTorch {getattr(torch, '__version__', '(unknown version)')}"
    if getattr(version, "hip", None):
        return f"{name} is a ROCm build and gpuguard serves CUDA: left as it is"
    if not getattr(version, "cuda", None):
        return f"{name} has no CUDA (a CPU-only build): left as it is"
    asked = _conf_backend()
    if asked:
        return (f"{asked[0]} asks for PyTorch's {asked[1]} backend: it serves this process (unset that "
                "setting for gpuguard's)")
    from gpuguard.torch import _native
    floor = getattr(_native, "MIN_TORCH", None)
    if floor and _native._torch_version(torch) < tuple(floor):
        return (f"{name} is older than {'.'.join(map(str, floor))}, the oldest gpuguard's backend serves: "
                "PyTorch's own allocator stays in place")
    return ""


def _conf_backend() -> Optional[Tuple[str, str]]:
    """(variable, backend) when PyTorch's own allocator settings name a backend other than its default,
    read as PyTorch's CUDA allocator reads them (PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF): the user chose
    that allocator for this process, so gpuguard steps aside rather than override the choice."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = os.environ.get(var)
        if conf is None:
            continue
        chosen = ""
        for item in conf.split(","):  # a key named twice: the last one counts, as in PyTorch
            key, _, val = item.partition(":")
            if key.strip() == "backend":
                chosen = val.strip()
        return (var, chosen) if chosen not in ("", "native") else None
    return None


def _on_torch(torch: Any, cfg: Dict[str, Any]) -> None:
    why = _unserved(torch)
    if why:
        sys.stderr.write(f"gpuguard: {VAR}=1: {why}\n")
        return
    import gpuguard.torch as ggt
    from gpuguard.torch import _native
    try:
        ggt.use_native(cfg["capacity"] or None, cfg["chunk"] or None, cfg["captures"])
    except _native.NativeUnavailable as e:
        # A PyTorch older than the backend serves is no error of the setup: the script runs on torch's own.
        if cfg["fallback"] != "torch" and not isinstance(e, _native.Unsupported):
            _fatal(f"{VAR}=1: {e}\n(set {OPTIONS}=fallback=torch to run on PyTorch's own allocator instead)")
        sys.stderr.write(f"gpuguard: {VAR}=1: {e}; PyTorch's own allocator stays in place\n")


_ran = False


def run() -> None:
    """Called by gpuguard_torch.pth (through gpuguard/_pth.py) when GPUGUARD_TORCH or GPUGUARD_WORKERS is
    set; once per process: a second call (site-packages processed twice) does nothing."""
    global _ran
    if _ran:
        return
    _ran = True
    try:
        cfg = parse(os.environ.get(VAR), os.environ.get(OPTIONS))
        workers = workers_wanted(parse_workers(os.environ.get(WORKERS)), cfg)
    except ConfigError as e:
        _fatal(str(e))
        return
    except Exception as e:  # a bug of the parser must still stop the process, as a bad value does
        _fatal(f"{VAR}={_clip(os.environ.get(VAR))!r}, {OPTIONS}={_clip(os.environ.get(OPTIONS))!r}, "
               f"{WORKERS}={_clip(os.environ.get(WORKERS))!r}: not understood ({type(e).__name__}: {e})")
        return
    after_import = _sibling("_postimport").after_import
    if cfg is not None:
        after_import("torch", lambda torch: _on_torch(torch, cfg))
    if workers:
        _sibling("_workers").arm_if_rank()
        # Armed once multiprocessing is imported: a program that never imports it pays nothing.
        after_import("multiprocessing.process", lambda _: _sibling("_workers").install())


def _sibling(name: str) -> Any:
    """gpuguard.<name>: as _pth.py loaded it (without the package's __init__), else imported."""
    import importlib
    return sys.modules.get("gpuguard." + name) or importlib.import_module("gpuguard." + name)
