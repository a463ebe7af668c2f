"""gpuguard.torch — PyTorch's CUDA memory drawn from a gpuguard arena, through
``torch.cuda.memory.CUDAPluggableAllocator`` over the library's ``gg_torch_alloc``/``gg_torch_free``.

Two forms:

- ``use_arena(arena)``: the global allocator. Every CUDA tensor comes from the arena, with no cache on
  top. PyTorch refuses to swap its allocator once CUDA is initialised, so call it before the first CUDA
  allocation (StateError otherwise). A drop-in: an allocation that does not fit raises
  ``torch.OutOfMemoryError`` (a RuntimeError starting "CUDA out of memory." where no C++ compiler could
  build the typed entry point) with the arena's detail; ``torch.cuda.memory_allocated()``,
  ``memory_reserved()``, ``max_memory_*``, ``reset_peak_memory_stats()``, ``memory_stats()`` and
  ``memory_summary()`` report the arena's figures; ``torch.cuda.empty_cache()`` trims the arena, so the
  memory goes back to the driver; CUDA graphs capture and replay (``torch.cuda.graph``,
  ``torch.compile(mode="reduce-overhead")``). Sending a CUDA tensor to another process
  (``torch.multiprocessing``) raises at once in the sender: the arena's memory has no CUDA IPC handle.
- ``mem_pool(arena)``: a region, usable after CUDA is initialised: a ``torch.cuda.MemPool`` whose segments
  come from the arena, with PyTorch's caching allocator on top. Allocations inside the ``with`` block go to
  the pool; at its end the pool is deleted and the cache emptied, so its segments go back to the arena
  (segments still holding live tensors stay until those die and the cache is emptied again).

Arena scopes must not end under memory PyTorch still holds (a tensor would point at memory handed out
again): with PyTorch, the pool of ``mem_pool`` is the scope. Importing this module does not import torch
(that happens at the first call); it raises ImportError at once when torch is not installed."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import os
from typing import Any, Dict, Iterator, Optional

from .. import _lib
from .._lib import C
from .._pluginstats import plugin_counters, torch_nested_stats, torch_style_stats
from ..arena import Arena
from ..diagnostics import holders, record, rounds  # noqa: F401  (gpuguard.torch.holders & co.)
from ..errors import GG_EINVAL, GG_ESTATE, InvalidArgumentError, StateError

if importlib.util.find_spec("torch") is None:
    raise ImportError("gpuguard.torch needs PyTorch, which is not installed in this interpreter "
                      "(pip install torch); the rest of gpuguard works without it")

__all__ = ["use_native", "native_available", "backend", "oom_snapshot", "use_arena", "mem_pool", "memory_stats", "trim",
           "pluggable_allocator", "plugin_counters", "shim_kind", "holders", "rounds", "record"]

GG_ARENA_NO_STREAM = 0x1

_allocator: Any = None  # the global one (raises on failure); PyTorch keeps the library loaded
_pool_allocator: Any = None  # for MemPools: NULL on failure, so the caching allocator frees and retries
_global_arenas: Dict[int, Arena] = {}  # kept alive while PyTorch's global allocator uses them


def _torch() -> Any:
    import torch  # the real one: this module's own name does not shadow it (absolute import)
    return torch


def _shim_path() -> "tuple[str, str, str]":
    """(library path, alloc symbol, free symbol) for PyTorch: the entry point that raises on failure —
    typed (torch.OutOfMemoryError) when it can be built against this PyTorch, else the generic one built
    with the library — or, when neither exists, the plain C entry points (NULL on failure)."""
    from . import _shim as _torchshim
    path = _torchshim.find(_torch())
    if path:
        return path, "gg_torch_malloc", "gg_torch_mfree"
    import warnings
    warnings.warn("gpuguard.torch: libgpuguard_torch.so was not found beside the library and could not be "
                  "built; an allocation that does not fit will give a tensor at address 0 instead of raising",
                  RuntimeWarning, stacklevel=3)
    return _lib.path, "gg_torch_alloc", "gg_torch_free"


def shim_kind() -> str:
    """Which allocation entry point PyTorch uses: "torch.OutOfMemoryError" (built against this PyTorch),
    "RuntimeError" (the generic one) or "NULL" (none could be loaded); "" before the first use."""
    from . import _shim as _torchshim
    return _torchshim.kind()


def use_native(capacity: Optional[int] = None, chunk_size: Optional[int] = None, captures: str = "announced") -> None:
    """Makes gpuguard PyTorch's CUDA allocator backend: a third backend beside PyTorch's ``native`` and
    ``cudaMallocAsync`` that implements PyTorch's whole allocator interface over gpuguard arenas, one per
    device, made at the first allocation there (``torch.cuda.get_allocator_backend()`` then returns
    "gpuguard"). Every ``torch.cuda.memory_*`` function, ``empty_cache``, ``cudnn.benchmark``, CUDA graphs
    and their shared pools, ``MemPool``, memory fractions, memory history and snapshots work as with
    PyTorch's own allocators (docs/python.md lists each and its cost). ``capacity`` bounds each arena
    (default: the device's memory), ``chunk_size`` is the arena's growth step. Must run before the first
    CUDA tensor (StateError otherwise); ``GPUGUARD_TORCH=1`` in the environment does it for every Python
    process without editing the script. Builds the backend against this PyTorch on first use
    (NativeUnavailable, a RuntimeError saying what is missing, when it cannot).

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
    if _global_arenas:
        raise StateError("gpuguard.torch.use_native: use_arena() already installed the plugin allocator in "
                         "this process", GG_ESTATE, "GG_ESTATE")
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
    """Which allocator serves PyTorch here: "gpuguard" (the native backend), "plugin" (``use_arena``'s
    pluggable allocator), or PyTorch's own backend name ("native", "cudaMallocAsync")."""
    from . import _native
    if _native.active():
        return "gpuguard"
    if _global_arenas:
        return "plugin"
    return str(_torch().cuda.get_allocator_backend())


def pluggable_allocator() -> Any:
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over this process's libgpuguard (created once)."""
    global _allocator
    if _allocator is None:
        torch = _torch()
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(*_shim_path())
    return _allocator


def _register(arena: Arena) -> None:
    """Makes ``arena`` the plugin's arena for its device; another live arena there is an error."""
    from ctypes import byref, c_void_p
    if arena.flags & GG_ARENA_NO_STREAM:
        raise InvalidArgumentError(
            "gpuguard.torch: this arena was made with GG_ARENA_NO_STREAM: it hands a freed block out again at "
            "once, while PyTorch's kernels may still use it (an illegal memory access); give PyTorch an arena "
            "with stream tracking (the default flags)", GG_EINVAL, "GG_EINVAL")
    current = c_void_p()
    C.gg_plugin_get_arena(arena.device, byref(current))
    if current.value not in (None, arena._handle()):
        raise StateError(f"gpuguard.torch: another arena already serves PyTorch on device {arena.device}; "
                         "one arena per device at a time (close the other one first)", GG_ESTATE, "GG_ESTATE")
    C.gg_plugin_set_arena(arena.device, arena._handle())


def use_arena(arena: Arena, memory_api: bool = True) -> Any:
    """Makes every PyTorch CUDA allocation on ``arena.device`` come from ``arena`` (the global pluggable
    allocator; it cannot be undone in this process). Must run before PyTorch's first CUDA allocation:
    raises StateError otherwise (use ``mem_pool(arena)`` then). Keep the arena open for as long as PyTorch
    runs; closing it makes later allocations fail. An arena made with GG_ARENA_NO_STREAM is refused
    (InvalidArgumentError). ``memory_api`` (default on) makes PyTorch's memory functions
    (``torch.cuda.memory_allocated`` and the rest, ``empty_cache``) work on the arena's figures; see
    ``gpuguard.torch._api``. Returns the CUDAPluggableAllocator."""
    torch = _torch()
    hint = ("call gpuguard.torch.use_arena() before any CUDA tensor is created (PyTorch cannot swap an "
            "initialised allocator), or use `with gpuguard.torch.mem_pool(arena):`, which works after")
    if torch.cuda.is_initialized():
        raise StateError("gpuguard.torch.use_arena: PyTorch's CUDA allocator is already initialised; " + hint,
                         GG_ESTATE, "GG_ESTATE")
    from . import _native
    if _native.active():
        raise StateError("gpuguard.torch.use_arena: gpuguard's PyTorch backend (GPUGUARD_TORCH=1 or "
                         "use_native) serves this process already: its arenas are made per device on first "
                         "use; use mem_pool(arena) for a region of your own", GG_ESTATE, "GG_ESTATE")
    _register(arena)
    alloc = pluggable_allocator()
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        if "already initialized" in str(e):
            raise StateError(f"gpuguard.torch.use_arena: {e}; " + hint, GG_ESTATE, "GG_ESTATE") from e
        raise
    _global_arenas[arena.device] = arena
    from . import _api as _torchapi
    if memory_api:
        _torchapi.install(torch, _global_arenas)
    _torchapi.install_ipc_guard(torch)
    _torchapi.install_record_stream(torch)
    # PyTorch frees its last tensors (cuBLAS workspaces, module globals) after atexit handlers run: the
    # arena must not be destroyed at exit then; the process's end gives its memory back.
    arena._finalizer.atexit = False
    return alloc


@contextlib.contextmanager
def mem_pool(arena: Arena, empty_cache: bool = True) -> Iterator[Arena]:
    """``with mem_pool(arena):`` — CUDA allocations on ``arena.device`` inside the block come from a
    ``torch.cuda.MemPool`` whose segments the arena provides. Works after CUDA is initialised. At the end,
    the pool is deleted and (``empty_cache``) ``torch.cuda.empty_cache()`` runs, which is when PyTorch
    frees the pool's segments back into the arena; the arena keeps the memory mapped for the next pool
    until ``trim``. Tensors that outlive the block keep their segment until they die."""
    torch = _torch()
    _register(arena)
    # PyTorch frees cached segments of dead pools as late as its own exit: the arena stays until then (or
    # until arena.close()); one per device, as for use_arena.
    arena._finalizer.atexit = False
    held = _global_arenas.get(arena.device)
    if held is None or held.closed:
        _global_arenas[arena.device] = arena
    global _pool_allocator
    if _pool_allocator is None:
        _pool_allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib.path, "gg_torch_alloc", "gg_torch_free")
    pool = torch.cuda.MemPool(_pool_allocator.allocator())
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
    ``.peak``, ``reserved_bytes.all.current``, ``.peak``, ``active.all.current``, ``num_alloc_retries``,
    ``num_ooms``, ...), for code that reads those: under the global pluggable allocator PyTorch's own
    ``memory_allocated()``/``memory_stats()`` raise."""
    return torch_style_stats(arena)


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
    graph = ctypes.c_size_t(0)
    if 0 <= arena.device < 64:
        C.gg_plugin_trim(arena.device, 0, ctypes.byref(graph))  # what dead CUDA graphs held
    return before - arena.stats()["bytes_mapped"] + graph.value
