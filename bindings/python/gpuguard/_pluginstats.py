"""gpuguard._pluginstats — an arena's statistics under the key names of ``torch.cuda.memory_stats()``, with
no torch import (so it is usable, and testable, without PyTorch)."""
from __future__ import annotations

from ctypes import byref
from typing import Any, Dict

from ._lib import C, PluginGraphStats, PluginStat, PluginStats
from .arena import Arena


def plugin_counters(device: int) -> Dict[str, int]:
    """The allocator plugin's counters for one device: n_allocs, n_frees, n_failed_allocs, n_failed_frees,
    n_stream_waits (calls on another stream that ordered one stream after the other, on the device;
    process-wide, since start)."""
    s = PluginStats()
    C.gg_plugin_stats(device, byref(s))
    return {name: int(getattr(s, name)) for name in ("n_allocs", "n_frees", "n_failed_allocs", "n_failed_frees",
                                                     "n_stream_waits")}


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


def _stat(s: PluginStat) -> Dict[str, int]:
    return {"current": int(s.current), "peak": int(s.peak), "allocated": int(s.allocated), "freed": int(s.freed)}


def _pools(all_: Dict[str, int], small: Dict[str, int], large: Dict[str, int]) -> Dict[str, Dict[str, int]]:
    return {"all": all_, "small_pool": small, "large_pool": large}


def torch_nested_stats(device: int, arena: Any = None) -> Dict[str, Any]:
    """What ``torch.cuda.memory_stats_as_nested_dict(device)`` returns, from the plugin's counters of
    ``device`` (the blocks PyTorch holds: bytes rounded as the arena rounds, bytes requested, blocks — each
    with current, peak, allocated, freed, split at 1 MiB into PyTorch's small and large pools) and the
    arena's (memory mapped = "reserved", its chunks = "segments", mapped but free = "inactive split").
    Segment counts are current only. ``gpuguard`` holds the arena's own figures."""
    p = PluginStats()
    C.gg_plugin_stats(device, byref(p))
    zero = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    out: Dict[str, Any] = {}
    for key, arr in (("allocated_bytes", p.bytes), ("active_bytes", p.bytes), ("requested_bytes", p.requested),
                     ("allocation", p.blocks), ("active", p.blocks)):
        out[key] = _pools(_stat(arr[0]), _stat(arr[1]), _stat(arr[2]))
    g = PluginGraphStats()
    C.gg_plugin_graph_stats(device, byref(g))
    s = arena.stats() if arena is not None and not arena.closed else None
    if s is not None:  # the CUDA-graph arena's memory is PyTorch's too
        reserved = {"current": s["bytes_mapped"] + g.bytes_mapped, "peak": s["peak_mapped"],
                    "allocated": s["bytes_mapped"] + s["bytes_trimmed"], "freed": s["bytes_trimmed"]}
        segments = {"current": s["n_chunks"], "peak": s["n_chunks"], "allocated": 0, "freed": 0}
        inactive = dict(zero, current=s["bytes_mapped"] - s["bytes_in_use"])
        extra = {k: s[k] for k in ("bytes_in_use", "bytes_mapped", "bytes_pending", "largest_free_block",
                                   "fragmentation", "n_stream_waits", "n_trims", "bytes_trimmed")}
    else:
        reserved, segments, inactive, extra = dict(zero), dict(zero), dict(zero), {}
    out["reserved_bytes"] = _pools(reserved, dict(zero), dict(reserved))
    out["segment"] = _pools(segments, dict(zero), dict(segments))
    out["inactive_split_bytes"] = _pools(inactive, dict(zero), dict(inactive))
    out["inactive_split"] = _pools(dict(zero), dict(zero), dict(zero))
    out["oversize_allocations"] = dict(zero)
    out["oversize_segments"] = dict(zero)
    out.update(num_alloc_retries=0, num_ooms=int(p.n_failed_allocs), num_sync_all_streams=0,
               num_device_alloc=int(s["n_chunks"]) if s else 0, num_device_free=int(s["n_trims"]) if s else 0,
               max_split_size=-1)
    extra.update({k: int(getattr(p, k)) for k in ("n_allocs", "n_frees", "n_failed_allocs", "n_failed_frees",
                                                  "n_stream_waits")})
    extra.update({"graph_" + k: int(getattr(g, k)) for k in ("bytes_in_use", "bytes_mapped", "n_pools",
                                                           "n_blocks_held", "n_captures")})
    out["gpuguard"] = extra
    return out
