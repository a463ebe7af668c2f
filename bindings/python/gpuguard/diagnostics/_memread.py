"""gpuguard.diagnostics._memread — readers of "memory in use" for rounds, the notebook line and the timeline, best
first: PyTorch's ``memory_allocated``/``memory_reserved`` (when torch is already imported and CUDA already
initialised: a reader never initialises CUDA), else the arenas serving PyTorch under ``use_arena`` (where
``memory_allocated`` raises), else the driver's used memory of the device (NVML: no context created)."""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Optional, Tuple

Reader = Callable[[], Optional[int]]


def _torch_cuda() -> Any:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda
    except Exception:
        pass
    return None


def _plugin_arenas(device: int) -> list:
    ggt = sys.modules.get("gpuguard.torch")
    arenas = getattr(ggt, "_global_arenas", None) or {}
    a = arenas.get(device)
    return [a] if a is not None and not a.closed else []


def torch_readers(device: int = 0) -> Dict[str, Reader]:
    """``in_use``/``reserved`` from PyTorch's allocator, or from the arena behind ``use_arena``; empty
    when PyTorch has not initialised CUDA."""
    cuda = _torch_cuda()
    if cuda is None:
        return {}
    try:
        cuda.memory_allocated(device)
        return {"in_use": lambda: cuda.memory_allocated(device),
                "reserved": lambda: cuda.memory_reserved(device)}
    except Exception:  # the global pluggable allocator: PyTorch has no statistics, the arena does
        pass
    arenas = _plugin_arenas(device)
    if arenas:
        return {"in_use": lambda: sum(a.stats()["bytes_in_use"] for a in arenas if not a.closed),
                "reserved": lambda: sum(a.stats()["bytes_mapped"] for a in arenas if not a.closed)}
    return {}


def driver_used(device: int = 0) -> Optional[int]:
    """The device's used memory as the driver reports it (all processes), None when it cannot be read."""
    try:
        from ..query import device_info
        return int(device_info(device)["used_bytes"])
    except Exception:
        return None


def series(device: int = 0, arena: Any = None) -> Dict[str, Reader]:
    """Every reader available now: ``in_use``, ``reserved`` (PyTorch or an arena) and ``driver_used``."""
    out: Dict[str, Reader] = {}
    if arena is not None:
        out = {"in_use": lambda: arena.stats()["bytes_in_use"], "reserved": lambda: arena.stats()["bytes_mapped"]}
    else:
        out = torch_readers(device)
    out["driver_used"] = lambda: driver_used(device)
    return out


def default_reader(device: int = 0, arena: Any = None) -> Tuple[Reader, str]:
    """The best "memory in use" reader and its name: PyTorch's allocated bytes, an arena's bytes in use,
    else the driver's used memory."""
    s = series(device, arena)
    if "in_use" in s:
        return s["in_use"], ("arena in use" if arena is not None else "in use")
    return s["driver_used"], "device used"
