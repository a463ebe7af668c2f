"""gpuguard.cupy — CuPy's device memory drawn from a gpuguard arena, through ``cupy.cuda.set_allocator``.

``use_arena(arena)`` installs the allocator at once and returns a handle that also works as a context
manager: ``with gpuguard.cupy.use_arena(arena): ...`` restores the previous allocator at the end. Each
allocation is an ``UnownedMemory`` whose owner frees the block back into the arena when CuPy drops it.
A block allocated on another stream than the arena's is freed after the arena's stream is made to wait,
on the device, for that stream's work so far (an event; the host does not wait), so the arena hands it
out again only once that work is done. An allocation
that does not fit raises ``cupy.cuda.memory.OutOfMemoryError`` with the arena's detail. Importing this
module does not import cupy; it raises ImportError at once when cupy is not installed."""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable, Optional

from .arena import Arena
from .errors import OutOfMemoryError

if importlib.util.find_spec("cupy") is None:
    raise ImportError("gpuguard.cupy needs CuPy, which is not installed in this interpreter "
                      "(pip install cupy-cuda13x); the rest of gpuguard works without it")

__all__ = ["use_arena", "allocator"]


def _cupy() -> Any:
    import cupy
    return cupy


class _Block:
    """Owner of one arena block: frees it when CuPy drops the memory (never in a forked child, never after
    the arena closed: its destroy has released everything)."""

    __slots__ = ("arena", "ptr", "stream", "pid", "__weakref__")

    def __init__(self, arena: Arena, ptr: int, stream: Any) -> None:
        self.arena, self.ptr, self.stream, self.pid = arena, ptr, stream, os.getpid()

    def __del__(self) -> None:
        a = self.arena
        if a.closed or os.getpid() != self.pid:
            return
        try:
            if self.stream is not None and not (a.flags & 0x1) and int(self.stream.ptr) != a.stream:
                _order_after(self.stream, a.stream)  # the arena tracks its own stream only
            a.free(self.ptr)
        except Exception:  # a finalizer must not raise; the arena still owns the block
            pass


def _order_after(side: Any, arena_stream: int) -> None:
    """Makes the arena's stream wait, on the device, for the work queued on ``side`` so far."""
    cupy = _cupy()
    ev = cupy.cuda.Event(block=False, disable_timing=True)
    ev.record(side)
    target = cupy.cuda.Stream.null if arena_stream == 0 else cupy.cuda.ExternalStream(arena_stream)
    target.wait_event(ev)


def allocator(arena: Arena) -> Callable[[int], Any]:
    """The function ``cupy.cuda.set_allocator`` takes: ``size -> cupy.cuda.MemoryPointer`` from ``arena``."""
    cupy = _cupy()

    def malloc(size: int) -> Any:
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, arena.device), 0)
        stream = cupy.cuda.get_current_stream()
        try:
            block = arena.alloc(size, tag="cupy")
        except OutOfMemoryError as e:  # CuPy's own type, as its pool raises, with the arena's detail
            err = cupy.cuda.memory.OutOfMemoryError(size, arena.stats()["bytes_in_use"])
            err.args = (f"{err.args[0] if err.args else ''} [gpuguard arena: {e}]",)
            raise err from e
        owner = _Block(arena, block.ptr, stream)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.ptr, size, owner, arena.device), 0)

    return malloc


class use_arena:
    """Installs ``arena`` as CuPy's allocator now; as a context manager, restores the previous allocator
    at the end of the ``with`` block (``restore()`` does it too)."""

    def __init__(self, arena: Arena) -> None:
        cupy = _cupy()
        self.arena = arena
        self._previous: Optional[Callable[[int], Any]] = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(allocator(arena))

    def restore(self) -> None:
        """Puts the allocator that was current before back."""
        _cupy().cuda.set_allocator(self._previous)

    def __enter__(self) -> Arena:
        return self.arena

    def __exit__(self, *exc: Any) -> None:
        self.restore()
