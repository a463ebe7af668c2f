"""gpuguard.torch — PyTorch's CUDA memory from gpuguard arenas, through gpuguard's PyTorch allocator
backend (``use_native``; ``GPUGUARD_TORCH=1`` installs it in every Python process): PyTorch's whole
allocator interface over one arena per device, its C++ part in ``gpuguard/torch/native/``.

Two ways to name the arena yourself, both on that backend (installed first when it is not yet, which
must happen before the first CUDA tensor: StateError otherwise, saying why):

- ``use_arena(arena)``: PyTorch's allocations on ``arena.device`` come from ``arena`` (instead of an
  arena the backend makes there at the first allocation). Every ``torch.cuda`` memory function,
  ``empty_cache``, CUDA graphs, snapshots and CUDA IPC work as with the backend's own arenas.
- ``mem_pool(arena)``: a region: a ``torch.cuda.MemPool`` whose blocks come from ``arena``; allocations
  inside the ``with`` block go to it. At its end the pool is deleted and the cache emptied.

Arena scopes must not end under memory PyTorch still holds (a tensor would point at memory handed out
again). Importing this module does not import torch (that happens at the first call); it raises
ImportError at once when torch is not installed."""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
from typing import Any, Dict, Iterator, Optional

from ..arena import Arena
from ..diagnostics import holders, record, rounds  # noqa: F401  (gpuguard.torch.holders & co.)
from ..errors import GG_EINVAL, GG_ESTATE, InvalidArgumentError, StateError

if importlib.util.find_spec("torch") is None:
    raise ImportError("gpuguard.torch needs PyTorch, which is not installed in this interpreter "
                      "(pip install torch); the rest of gpuguard works without it")

__all__ = ["use_native", "native_available", "backend", "oom_snapshot", "use_arena", "mem_pool", "memory_stats", "trim",
           "holders", "rounds", "record"]

GG_ARENA_NO_STREAM = 0x1

_global_arenas: Dict[int, Arena] = {}  # kept alive while PyTorch's allocator uses them


def _torch() -> Any:
    import torch  # the real one: this module's own name does not shadow it (absolute import)
    return torch


def use_native(capacity: Optional[int] = None, chunk_size: Optional[int] = None, captures: str = "announced") -> None:
    """Makes gpuguard PyTorch's CUDA allocator backend: a third backend beside PyTorch's ``native`` and
    ``cudaMallocAsync`` that implements PyTorch's whole allocator interface over gpuguard arenas, one per
    device, made at the first allocation there (``torch.cuda.get_allocator_backend()`` then returns
    "gpuguard"). Every ``torch.cuda.memory_*`` function, ``empty_cache``, ``cudnn.benchmark``, CUDA graphs
    and their shared pools, ``MemPool``, memory fractions, memory history and snapshots work as with
    PyTorch's own allocators (docs/python.md lists each and its cost). ``capacity`` bounds each arena
    (default: the device's memory), ``chunk_size`` is the arena's growth step. Must run before the first
    CUDA tensor (StateError otherwise); ``GPUGUARD_TORCH=1`` in the environment does it for every Python
    process without editing the script. Loads the backend the wheel carries prebuilt for this PyTorch, or
    builds it against this PyTorch on first use (NativeUnavailable, a RuntimeError saying what is missing,
    when it cannot).

    ``captures`` says which CUDA graph captures the backend looks for. "announced" (the default): the
    captures PyTorch makes (``torch.cuda.graph``, ``make_graphed_callables``, ``torch.compile``'s
    "reduce-overhead"), which it announces to its allocator before they begin; outside them no call asks the
    driver, as PyTorch's own allocator does not. "any": every allocation and free outside those also asks the
    driver whether its stream captures (~0.2 µs a call), so a capture begun on a PyTorch stream by other code
    (a raw ``cudaStreamBeginCapture``) keeps the blocks its graph uses too. May be called again to change it."""
    from . import _native
    if captures not in _native.CAPTURES:
        raise InvalidArgumentError(f"gpuguard.torch.use_native: captures={captures!r}: use 'announced' or 'any'",
                                   GG_EINVAL, "GG_EINVAL")
    torch = _torch()
    if _native.active():
        _native.install(torch, captures=captures)
        return
    if torch.cuda.is_initialized():
        raise StateError("gpuguard.torch.use_native: PyTorch's CUDA allocator is already initialised; call it "
                         "before any CUDA tensor is created, or set GPUGUARD_TORCH=1 in the environment",
                         GG_ESTATE, "GG_ESTATE")
    _native.install(torch, int(capacity or 0), int(chunk_size or 0), captures)
    path = os.environ.get("GPUGUARD_OOM_SNAPSHOT")
    if path:
        oom_snapshot(path)


def oom_snapshot(path: str) -> None:
    """Writes a memory snapshot (``torch.cuda.memory._dump_snapshot``'s format, which PyTorch's memory_viz
    page opens) to ``path`` at the first out-of-memory error of this process, for a bug report; later
    ones do not overwrite it. ``GPUGUARD_OOM_SNAPSHOT=PATH`` does this at ``use_native``. With memory
    history on (``torch.cuda.memory._record_memory_history()``) the snapshot holds the trace and stacks
    too."""
    torch = _torch()
    if not path:
        raise InvalidArgumentError("gpuguard.torch.oom_snapshot: path is empty", GG_EINVAL, "GG_EINVAL")
    written = []

    def observer(device: int, allocated: int, total: int, free: int) -> None:
        if written:
            return
        written.append(path)
        try:
            torch.cuda.memory._dump_snapshot(path)
            import sys
            sys.stderr.write(f"gpuguard: out of memory on device {device}: memory snapshot written to {path}\n")
        except Exception as e:  # the out-of-memory error itself must reach the program
            import sys
            sys.stderr.write(f"gpuguard: out of memory on device {device}: the snapshot {path} could not "
                             f"be written: {e}\n")

    torch._C._cuda_attach_out_of_memory_observer(observer)


def native_available() -> bool:
    """Whether gpuguard's PyTorch backend can be built and loaded here (builds it once, ~10 s, cached);
    ``gpuguard.torch._native.why_not()`` says why not."""
    from . import _native
    try:
        _native.load(_torch())
    except _native.NativeUnavailable:
        return False
    return True


def backend() -> str:
    """Which allocator serves PyTorch here: "gpuguard" (the native backend, also under ``use_arena``) or
    PyTorch's own backend name ("native", "cudaMallocAsync")."""
    from . import _native
    if _native.active():
        return "gpuguard"
    return str(_torch().cuda.get_allocator_backend())


def _refuse_no_stream(arena: Arena) -> None:
    if arena.flags & GG_ARENA_NO_STREAM:
        raise InvalidArgumentError(
            "gpuguard.torch: this arena was made with GG_ARENA_NO_STREAM: it hands a freed block out again at "
            "once, while PyTorch's kernels may still use it (an illegal memory access); give PyTorch an arena "
            "with stream tracking (the default flags)", GG_EINVAL, "GG_EINVAL")


def _ensure_native(call: str) -> Any:
    """The backend's module, the backend installed first when it is not yet (before any CUDA tensor)."""
    from . import _native
    if _native.active():
        return _native
    torch = _torch()
    if torch.cuda.is_initialized():
        raise StateError(f"gpuguard.torch.{call}: PyTorch's CUDA allocator is already initialised by another "
                         "allocator, so gpuguard's backend cannot be installed: call it before any CUDA tensor is "
                         "created, or set GPUGUARD_TORCH=1 in the environment", GG_ESTATE, "GG_ESTATE")
    try:
        _native.install(torch)
    except _native.NativeUnavailable as e:
        raise StateError(f"gpuguard.torch.{call}: gpuguard's PyTorch backend cannot serve this PyTorch: {e}",
                         GG_ESTATE, "GG_ESTATE") from e
    return _native


def use_arena(arena: Arena, memory_api: bool = True) -> None:
    """Makes every PyTorch CUDA allocation on ``arena.device`` come from ``arena`` (it cannot be undone in
    this process), through gpuguard's PyTorch backend, installed first when it is not yet: that must happen
    before the first CUDA tensor (StateError otherwise; use ``mem_pool(arena)`` then, under
    ``GPUGUARD_TORCH=1``). StateError too when PyTorch already allocated on that device or another arena
    serves it. Keep the arena open for as long as PyTorch runs. An arena made with GG_ARENA_NO_STREAM is
    refused (InvalidArgumentError); make it with GG_ARENA_KEEP_HOLES, as the backend makes its own, for the
    same fragmentation. ``memory_api`` is kept for old callers: PyTorch's memory functions work on the
    backend anyway."""
    del memory_api
    _refuse_no_stream(arena)
    native = _ensure_native("use_arena")
    rc = native.use_arena(arena.device, arena._handle())
    if rc == GG_ESTATE:
        raise StateError(f"gpuguard.torch.use_arena: another arena already serves PyTorch on device {arena.device} "
                         "(one made at its first allocation, or one given before): call use_arena before any CUDA "
                         "tensor is created there", GG_ESTATE, "GG_ESTATE")
    if rc < 0:
        raise InvalidArgumentError(f"gpuguard.torch.use_arena: the arena cannot serve PyTorch (code {rc})",
                                   GG_EINVAL, "GG_EINVAL")
    _global_arenas[arena.device] = arena
    # PyTorch frees its last tensors (cuBLAS workspaces, module globals) after atexit handlers run: the
    # arena must not be destroyed at exit then; the process's end gives its memory back.
    arena._finalizer.atexit = False


@contextlib.contextmanager
def mem_pool(arena: Arena, empty_cache: bool = True) -> Iterator[Arena]:
    """``with mem_pool(arena):`` — CUDA allocations on ``arena.device`` inside the block come from a
    ``torch.cuda.MemPool`` that draws from the arena, on gpuguard's PyTorch backend (installed first when it
    is not yet: before the first CUDA tensor, or ``GPUGUARD_TORCH=1``; StateError otherwise). At the end the
    pool is deleted and (``empty_cache``) ``torch.cuda.empty_cache()`` runs. Tensors that outlive the block
    keep their memory in the arena until they die."""
    _refuse_no_stream(arena)
    native = _ensure_native("mem_pool")
    torch = _torch()
    arena._finalizer.atexit = False  # blocks of the pool may be freed as late as PyTorch's own exit
    with torch.cuda.device(arena.device):
        pool = torch.cuda.MemPool()
    if native.pool_arena(tuple(pool.id), arena.device, arena._handle()) < 0:
        raise StateError("gpuguard.torch.mem_pool: the pool cannot draw from this arena", GG_ESTATE, "GG_ESTATE")
    try:
        with torch.cuda.use_mem_pool(pool, device=torch.device("cuda", arena.device)):
            yield arena
    finally:
        del pool
        gc.collect()
        if empty_cache:
            torch.cuda.empty_cache()


def memory_stats(arena: Arena) -> Dict[str, Any]:
    """The arena's statistics under ``torch.cuda.memory_stats()`` key names (``allocated_bytes.all.current``,
    ``.peak``, ``reserved_bytes.all.current``, ``.peak``, ``active.all.current``, ...), for code that reads
    those per arena. Keys under ``gpuguard.`` are the arena's own."""
    s = arena.stats()
    return {
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
        "inactive_split_bytes.all.current": s["bytes_mapped"] - s["bytes_in_use"],
        "num_alloc_retries": 0,
        "num_device_free": s["n_trims"],
        "gpuguard.bytes_reserved": s["bytes_reserved"],
        "gpuguard.bytes_pending": s["bytes_pending"],
        "gpuguard.bytes_trimmed": s["bytes_trimmed"],
        "gpuguard.largest_free_block": s["largest_free_block"],
        "gpuguard.fragmentation": s["fragmentation"],
        "gpuguard.scope_depth": s["scope_depth"],
        "gpuguard.n_stream_waits": s["n_stream_waits"],
    }


def trim(arena: Arena, keep: int = 0, empty_cache: Optional[bool] = None) -> int:
    """Gives the arena's wholly free memory back to the driver, beyond ``keep`` bytes, while tensors
    elsewhere in the arena stay alive. First lets PyTorch release what it keeps for itself (when CUDA is
    initialised; ``empty_cache=False`` skips this): garbage is collected, the device synchronised, the
    cuBLAS workspaces PyTorch caches per handle and stream are dropped (they come back at the next
    matmul) and ``torch.cuda.empty_cache()`` releases what dead pools cached. Returns the bytes given
    back."""
    torch = _torch()
    if empty_cache is None:
        empty_cache = torch.cuda.is_initialized()
    if empty_cache:
        gc.collect()
        torch.cuda.synchronize(arena.device)
        clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    before = arena.stats()["bytes_mapped"]
    arena.trim(keep)
    return before - arena.stats()["bytes_mapped"]
