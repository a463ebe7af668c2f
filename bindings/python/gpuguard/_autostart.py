"""gpuguard._autostart — ``GPUGUARD_TORCH=1`` without editing the script, as ``PYTORCH_CUDA_ALLOC_CONF`` works.

The wheel installs ``gpuguard_torch.pth`` into site-packages; Python runs its one line at every start, and
that line imports this module only when ``GPUGUARD_TORCH`` is set (so an interpreter without the variable
pays for one dictionary lookup). Then:

- the values are checked at once: a bad one stops the process with exit status 2 and a message naming
  the variable and the value;
- when ``torch`` is first imported, right after its own import finishes (before any CUDA tensor can
  exist), gpuguard becomes PyTorch's CUDA allocator backend (``gpuguard.torch.use_native``), with an
  arena made per device at its first allocation: a DataLoader worker that never touches CUDA makes none;
  a process that never imports torch never loads it;
- worker processes (``multiprocessing`` children, DataLoader workers) die with the process that started
  them and drop the device descriptors they inherited (``gpuguard._workers``).

``GPUGUARD_TORCH``: ``1``/``on``/``true``/``yes`` or ``0``/``off``/``false``/``no`` (or empty: off).
``GPUGUARD_TORCH_OPTIONS``: comma-separated ``key=value``:
  ``capacity=SIZE`` (bytes per device arena; K/M/G/T suffixes; default the device's memory),
  ``chunk=SIZE`` (the arena's growth step), ``backend=native`` (the only one: ``plugin``, the pluggable
  allocator that was removed, is accepted with one line on stderr and the native backend is used),
  ``fallback=none|torch``
  (when the native backend cannot be built here: ``none``, the default, stops the process saying why;
  ``torch`` leaves PyTorch's own allocator in place with one line on stderr), ``workers=on|off``."""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, Optional

VAR = "GPUGUARD_TORCH"
OPTIONS = "GPUGUARD_TORCH_OPTIONS"
_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ConfigError(ValueError):
    """A value of GPUGUARD_TORCH or GPUGUARD_TORCH_OPTIONS that is not understood."""


def parse_size(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ConfigError(f"{OPTIONS}: {what}={text!r} is not a size (bytes, or a number with K, M, G or T)")
    value = int(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0 or value >= 1 << 62:
        raise ConfigError(f"{OPTIONS}: {what}={text!r} is out of range")
    return value


def parse(value: Optional[str], options: Optional[str]) -> Optional[Dict[str, Any]]:
    """The configuration, or None when gpuguard is off; ConfigError for a bad value."""
    v = (value or "").strip().lower()
    if v in _OFF:
        return None
    if v not in _ON:
        raise ConfigError(f"{VAR}={value!r} is not understood: use 1 (or on, true, yes) to make gpuguard "
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
            raise ConfigError(f"{OPTIONS}={options!r}: {item.strip()!r} is not key=value")
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
            raise ConfigError(f"{OPTIONS}={options!r}: {item.strip()!r} is not understood (keys: capacity=SIZE, "
                              "chunk=SIZE, backend=native, fallback=none|torch, workers=on|off, "
                              "captures=announced|any)")
    return cfg


def _fatal(msg: str) -> None:
    sys.stderr.write(f"gpuguard: {msg}\n")
    sys.stderr.flush()
    os._exit(2)  # a .pth line's exception would only be printed, and the script would run on without gpuguard


def _on_torch(torch: Any, cfg: Dict[str, Any]) -> None:
    import gpuguard.torch as ggt
    from gpuguard.torch import _native
    try:
        ggt.use_native(cfg["capacity"] or None, cfg["chunk"] or None, cfg["captures"])
    except _native.NativeUnavailable as e:
        # A PyTorch older than the backend serves is no error of the setup: the script runs on torch's own.
        if cfg["fallback"] != "torch" and not isinstance(e, _native.Unsupported):
            _fatal(f"{VAR}=1: {e}\n(set {OPTIONS}=fallback=torch to run on PyTorch's own allocator instead)")
        sys.stderr.write(f"gpuguard: {VAR}=1: {e}; PyTorch's own allocator stays in place\n")


class _TorchFinder:
    """Finds ``torch`` through the other finders and runs ``_on_torch`` once its module has executed."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        self.cfg = cfg

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module
        cfg = self.cfg

        def exec_module(module: Any) -> None:
            original(module)
            _on_torch(module, cfg)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def run() -> None:
    """Called by gpuguard_torch.pth when GPUGUARD_TORCH is set."""
    try:
        cfg = parse(os.environ.get(VAR), os.environ.get(OPTIONS))
    except ConfigError as e:
        _fatal(str(e))
        return
    if cfg is None:
        return
    if "torch" in sys.modules:
        _on_torch(sys.modules["torch"], cfg)
    else:
        sys.meta_path.insert(0, _TorchFinder(cfg))
    if cfg["workers"]:
        try:
            from . import _workers  # type: ignore[attr-defined]
        except ImportError:
            return
        _workers.install()
