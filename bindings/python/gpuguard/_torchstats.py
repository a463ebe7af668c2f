"""gpuguard._torchstats — an arena's statistics under the key names of ``torch.cuda.memory_stats()``, with
no torch import (so it is usable, and testable, without PyTorch)."""
from __future__ import annotations

from ctypes import byref
from typing import Any, Dict

from ._lib import C, PluginStats
from .arena import Arena


def plugin_counters(device: int) -> Dict[str, int]:
    """The allocator plugin's counters for one device: n_allocs, n_frees, n_failed_allocs, n_failed_frees,
    n_stream_syncs (process-wide, since start)."""
    s = PluginStats()
    C.gg_plugin_stats(device, byref(s))
    return {name: int(getattr(s, name)) for name, _ in PluginStats._fields_ if name != "arena"}


def torch_style_stats(arena: Arena) -> Dict[str, Any]:
    """The arena's figures as ``torch.cuda.memory_stats()`` names them. "allocated" is the arena's bytes in
    live blocks (what PyTorch handed to tensors with the global allocator; whole cached segments under a
    MemPool), "reserved" the physical memory mapped, "active" the live blocks. ``num_alloc_retries`` is 0:
    the arena never flushes a cache to retry. ``num_ooms`` counts the plugin's failed allocations on the
    arena's device. Keys under ``gpuguard.`` are the arena's own."""
    s = arena.stats()
    p = plugin_counters(arena.device) if 0 <= arena.device < 64 else {}
    inactive = s["bytes_mapped"] - s["bytes_in_use"]
    out: Dict[str, Any] = {
        "allocated_bytes.all.current": s["bytes_in_use"],
        "allocated_bytes.all.peak": s["peak_in_use"],
        "reserved_bytes.all.current": s["bytes_mapped"],
        "reserved_bytes.all.peak": s["peak_mapped"],
        "active_bytes.all.current": s["bytes_in_use"],
        "active_bytes.all.peak": s["peak_in_use"],
        "active.all.current": s["n_live"],
        "allocation.all.current": s["n_live"],
        "allocation.all.allocated": s["n_allocs"],
        "allocation.all.freed": s["n_frees"],
        "segment.all.current": s["n_chunks"],
        "inactive_split_bytes.all.current": inactive,
        "num_alloc_retries": 0,
        "num_ooms": p.get("n_failed_allocs", 0),
        "num_device_free": s["n_trims"],
        "gpuguard.bytes_reserved": s["bytes_reserved"],
        "gpuguard.bytes_pending": s["bytes_pending"],
        "gpuguard.bytes_trimmed": s["bytes_trimmed"],
        "gpuguard.largest_free_block": s["largest_free_block"],
        "gpuguard.fragmentation": s["fragmentation"],
        "gpuguard.scope_depth": s["scope_depth"],
        "gpuguard.n_stream_waits": s["n_stream_waits"],
    }
    for k, v in p.items():
        out["gpuguard.plugin." + k] = v
    return out
