"""gpuguard.torch._api — PyTorch's memory functions made to work under ``gpuguard.torch.use_arena``.

Under a global ``CUDAPluggableAllocator`` PyTorch's own ``torch.cuda.memory_allocated()``,
``memory_reserved()``, ``max_memory_*``, ``memory_stats()``, ``memory_summary()`` and
``reset_peak_memory_stats()`` raise ("does not yet support getDeviceStats"), and ``empty_cache()`` gives
nothing back. All of them reach the allocator through a handful of ``torch._C`` functions, looked up at
each call; ``install`` replaces those with ones that answer from the arena and the plugin's counters, so
logging and monitoring code runs unchanged:

- ``_cuda_memoryStats`` → the nested dict ``memory_stats_as_nested_dict`` returns (``torch_nested_stats``);
- ``_cuda_resetPeakMemoryStats`` / ``_cuda_resetAccumulatedMemoryStats`` → the plugin's and arena's peaks
  and totals;
- ``_cuda_emptyCache`` → trims the arena and the CUDA-graph arena: the memory goes back to the driver;
- ``_cuda_checkPoolLiveAllocations`` (CUDA-graph trees' consistency check) → True: graph-owned blocks are
  kept by the plugin itself for as long as the graph lives;
- ``_cuda_getCheckpointState`` → an opaque None; ``_cuda_setCheckpointPoolState`` (rewinding the allocator
  when graph trees record a second path) → a RuntimeError that says so.

``use_arena(arena, memory_api=False)`` leaves PyTorch's functions as they are."""
from __future__ import annotations

from typing import Any, Dict

from .._lib import C
from .._pluginstats import torch_nested_stats

_installed: Dict[str, Any] = {}


def _index(device: Any) -> int:
    return int(device) if device is not None else 0


def install(torch: Any, arenas: Dict[int, Any]) -> None:
    """Replaces the ``torch._C`` memory functions (once per process); ``arenas`` maps device → Arena and is
    read at each call, so arenas registered later are seen."""
    if _installed:
        return
    tc = torch._C

    def memory_stats(device: Any = None) -> Dict[str, Any]:
        return torch_nested_stats(_index(device), arenas.get(_index(device)))

    def reset_peak(device: Any = None) -> None:
        d = _index(device)
        C.gg_plugin_reset_peak(d)
        if d in arenas and not arenas[d].closed:
            C.gg_arena_reset_peak(arenas[d]._handle())

    def reset_totals(device: Any = None) -> None:
        C.gg_plugin_reset_totals(_index(device))

    def empty_cache(*args: Any) -> None:
        for device, arena in list(arenas.items()):
            if not arena.closed:
                arena.trim(0)
            C.gg_plugin_trim(device, 0, None)  # the CUDA-graph arena: what dead graphs held

    def check_pool_live(*args: Any) -> bool:
        return True

    def checkpoint_state(*args: Any) -> Any:
        return None  # opaque to CUDA-graph trees: they hand it back only to set_checkpoint_state

    def set_checkpoint_state(*args: Any) -> Any:
        raise RuntimeError("gpuguard.torch.use_arena: CUDA-graph trees asked to rewind the allocator to a "
                           "checkpoint (torch.compile(mode='reduce-overhead') recording a second path, e.g. new "
                           "input shapes), which the arena cannot do: keep shapes static, or mark them dynamic")

    for name, fn in (("_cuda_memoryStats", memory_stats), ("_cuda_resetPeakMemoryStats", reset_peak),
                     ("_cuda_resetAccumulatedMemoryStats", reset_totals), ("_cuda_emptyCache", empty_cache),
                     ("_cuda_checkPoolLiveAllocations", check_pool_live),
                     ("_cuda_getCheckpointState", checkpoint_state),
                     ("_cuda_setCheckpointPoolState", set_checkpoint_state)):
        _installed[name] = getattr(tc, name, None)
        setattr(tc, name, fn)


IPC_MESSAGE = ("gpuguard.torch.use_arena: a CUDA tensor cannot be sent to another process here: its memory comes "
               "from a gpuguard arena (CUDA virtual memory), which has no CUDA IPC handle. Send `t.cpu()` and "
               "move it to the GPU in the receiver, or let the receiver create it; or do not use use_arena in "
               "the sending process.")


def _is_cuda(obj: Any) -> bool:
    dev = getattr(obj, "device", None)
    return getattr(dev, "type", None) == "cuda" or bool(getattr(obj, "is_cuda", False))


def install_record_stream(torch: Any) -> None:
    """``Tensor.record_stream(s)`` tells the plugin too (PyTorch's pluggable allocator drops the call): the
    block's free then waits for ``s`` first, so work queued there never sees it handed out again."""
    if "record_stream" in _installed:
        return
    original = torch.Tensor.record_stream

    def record_stream(self: Any, stream: Any) -> None:
        original(self, stream)
        if self.is_cuda:
            ptr = self.untyped_storage().data_ptr()
            if ptr:
                C.gg_plugin_record_stream(self.device.index or 0, ptr, int(stream.cuda_stream) or None)

    record_stream.__doc__ = original.__doc__
    torch.Tensor.record_stream = record_stream
    _installed["record_stream"] = original


def install_ipc_guard(torch: Any) -> None:
    """Makes sending a CUDA tensor or storage to another process fail at once, in the sender, with
    ``IPC_MESSAGE`` — instead of an error printed by a queue's feeder thread while the receiver waits
    forever. Wraps PyTorch's own reducers (CPU tensors are sent as before) and checks what
    ``multiprocessing`` queues are given in ``put``, in the caller's thread."""
    if "ipc" in _installed:
        return
    import io
    import multiprocessing.queues
    import pickle
    import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)
    from multiprocessing.reduction import ForkingPickler

    def guarded(fn: Any) -> Any:
        def reduce(obj: Any) -> Any:
            if _is_cuda(obj):
                raise RuntimeError(IPC_MESSAGE)
            return fn(obj)
        return reduce

    table = ForkingPickler._extra_reducers
    for cls, fn in list(table.items()):
        if getattr(fn, "__module__", "").startswith("torch.multiprocessing"):
            table[cls] = guarded(fn)

    tensor_types = (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)

    class _Probe(pickle.Pickler):
        """Walks what would be pickled without pickling tensors: raises on a CUDA one."""

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, tensor_types):
                if _is_cuda(obj):
                    raise RuntimeError(IPC_MESSAGE)
                return (int, ())
            return NotImplemented

    original_put = multiprocessing.queues.Queue.put

    def put(self: Any, obj: Any, block: bool = True, timeout: Any = None) -> None:
        try:
            _Probe(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except RuntimeError as e:
            if str(e) == IPC_MESSAGE:
                raise
        except Exception:  # anything else is the feeder's business, as before
            pass
        original_put(self, obj, block, timeout)

    multiprocessing.queues.Queue.put = put
    _installed["ipc"] = original_put
