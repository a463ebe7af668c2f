"""gpuguard.arena — arenas of device memory with scopes, trim and statistics, as context managers."""
from __future__ import annotations

import ctypes
import itertools
import os
import threading
import weakref
from ctypes import byref, c_void_p
from typing import Any, Dict, List, Optional, Union, cast

from . import _lib
from ._lib import C, RAW, ArenaOptions, ArenaStats, BlockInfo, Scope as _CScope, StatsBuffer, enc, raise_for
from .errors import GG_ESTATE, INT_MAX, SIZE_MAX, StateError, check_int, check_str

NO_STREAM = 0x1
"""Flag: do not track a stream; released memory is reusable at once."""
TRIM_ON_SCOPE_EXIT = 0x2
"""Flag: trim whenever the outermost scope ends."""

_STATS_FIELDS = [field[0] for field in ArenaStats._fields_ if field[0] != "reserved_"]

# The per-allocation path, bound once. Out-pointers for gg_alloc_ex are pooled: list.pop and append are
# atomic under the GIL, so each call, in any thread, has one of its own while the C call runs.
_gg_alloc_ex, _gg_free = RAW.gg_alloc_ex, RAW.gg_free
_outs: List[Any] = []
_new_allocation = object.__new__
_generation = itertools.count(1)


def _addr(call: str, block: Any) -> int:
    """A device address from an Allocation or an int, range-checked (ctypes would wrap 2**64 + p to p)."""
    if type(block) is Allocation:
        return block.ptr
    return check_int(call, "address", block, 0, SIZE_MAX)


def _freed(arena: "Arena", ptr: int) -> None:
    """The block at ptr is gone: holders() must not list its Allocation any more."""
    arena._gens.pop(ptr, None)


def _destroy(handle: int, owner_pid: int) -> None:
    # A forked child must not tear down its parent's arena; the library would refuse anyway.
    if os.getpid() == owner_pid:
        try:
            C.gg_arena_destroy(handle)
        except Exception:  # at interpreter exit nothing useful can be done with the error
            pass


class Allocation:
    """One block of device memory. ``ptr`` is the device address as an int, ``size`` the bytes asked
    for, ``tag`` the label given (or None). ``free()`` releases it; so does the end of the scope it was
    allocated in."""

    __slots__ = ("ptr", "size", "tag", "_arena", "_gen")

    def __init__(self, arena: "Arena", ptr: int, size: int, tag: Optional[str]) -> None:
        self.ptr, self.size, self.tag, self._arena, self._gen = ptr, size, tag, arena, 0

    def free(self) -> None:
        """Releases the block (GG_EINVAL → InvalidArgumentError when it was released already)."""
        h = self._arena._h
        if h is None:
            self._arena._handle()  # raises StateError
        rc = _gg_free(h, self.ptr)
        if rc < 0:
            raise_for(rc)
        _freed(self._arena, self.ptr)

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"Allocation(ptr={self.ptr:#x}, size={self.size}, tag={self.tag!r})"


class ArenaScope:
    """A scope of an arena: every block allocated inside it and still live is released when it ends,
    also when an exception (KeyboardInterrupt included) leaves the ``with`` block; the exception then
    propagates unchanged."""

    __slots__ = ("_arena", "_scope", "_open", "_used")

    def __init__(self, arena: "Arena") -> None:
        if not isinstance(arena, Arena):
            raise TypeError(f"gpuguard.ArenaScope: an Arena expected, not {type(arena).__name__}")
        self._arena = arena
        self._scope = _CScope()
        self._open = False
        self._used = False

    def __enter__(self) -> "ArenaScope":
        # One C scope per object: entering it again would overwrite the open one, and its blocks would
        # never be released. Use arena.scope() for each (nested) scope.
        if self._open or self._used:
            raise StateError("gpuguard.ArenaScope: this scope was entered already; use arena.scope() for "
                             "each scope", GG_ESTATE, "GG_ESTATE")
        rc = RAW.gg_scope_begin(self._arena._handle(), self._scope)
        if rc < 0:
            raise_for(rc)
        self._open = self._used = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._open:
            rc = RAW.gg_scope_end(self._scope)
            if rc < 0:  # still open: a retry ends it once the cause is gone
                raise_for(rc)
            self._open = False  # ended: only now


class Arena:
    """An arena of device memory: one reserved range (``capacity`` bytes; None: the device's memory
    size), physical memory mapped as it grows, scopes that release what they allocated, and ``trim``
    that gives wholly free memory back to the driver.

    ``backend`` is "cuda", "host" or None (GPUGUARD_BACKEND, else auto). ``stream`` is an int handle
    (a CUstream, e.g. ``torch.cuda.current_stream().cuda_stream``) whose queued work may still use
    released memory. Use as a context manager, or call ``close()``; a forgotten arena is destroyed when
    garbage-collected."""

    def __init__(self, device: int = 0, capacity: Optional[int] = None, backend: Optional[str] = None,
                 chunk_size: Optional[int] = None, stream: Optional[int] = None, flags: int = 0,
                 name: Optional[str] = None) -> None:
        call = "gpuguard.Arena"
        check_int(call, "device", device, 0, INT_MAX)
        check_str(call, "backend", backend)
        check_str(call, "name", name)
        if stream is not None:
            check_int(call, "stream", stream, 0, SIZE_MAX)
        check_int(call, "capacity", capacity or 0, 0, SIZE_MAX)
        check_int(call, "chunk_size", chunk_size or 0, 0, SIZE_MAX)
        check_int(call, "flags", flags, 0, (1 << 32) - 1)
        opts = ArenaOptions()
        C.gg_arena_options_init(byref(opts))
        keep = (enc(backend), enc(name))  # the bytes must outlive the create call
        opts.device, opts.backend, opts.name = device, keep[0], keep[1]
        opts.capacity = capacity or 0
        opts.chunk_size = chunk_size or 0
        opts.stream = stream
        opts.flags = flags
        h = c_void_p()
        C.gg_arena_create(byref(h), byref(opts))
        self._h: Optional[int] = h.value
        self.device = device
        """The device ordinal."""
        self.stream = stream or 0
        """The stream the arena tracks, as an int (0: the default stream)."""
        self.flags = flags
        """The GG_ARENA_* flags it was created with."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # The generation of the Allocation that owns each address, set by alloc and dropped by free:
        # holders() lists an Allocation only while the arena has its block and the generation is its own
        # (a block freed by its scope's end, whose address a new block reuses, is not it).
        self._gens: Dict[int, int] = {}
        self._finalizer = weakref.finalize(self, _destroy, cast(int, h.value), os.getpid())

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise StateError("gpuguard.Arena: the arena is closed", GG_ESTATE, "GG_ESTATE")
        return h

    def close(self) -> None:
        """Destroys the arena: every block is released and all memory goes back to the driver. Safe to
        call twice."""
        with self._lock:
            h, self._h = self._h, None
        if h is not None:
            self._finalizer.detach()
            if os.getpid() == self._pid:
                C.gg_arena_destroy(h)

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._h is None

    @property
    def name(self) -> str:
        """The arena's name."""
        return C.gg_arena_name(self._handle()).decode(errors="replace")

    @property
    def backend(self) -> str:
        """"cuda" or "host"."""
        return C.gg_arena_backend(self._handle()).decode()

    def alloc(self, size: int, tag: Optional[str] = None, align: int = 0) -> Allocation:
        """Allocates ``size`` bytes (256-byte aligned, or ``align``, a power of two). Raises
        OutOfMemoryError with the arena's figures when it does not fit."""
        h = self._h
        if h is None:
            self._handle()  # raises StateError
        if type(size) is not int or type(align) is not int or not (0 <= size <= SIZE_MAX and 0 <= align <= SIZE_MAX):
            check_int("gpuguard.Arena.alloc", "size", size, 0, SIZE_MAX)  # ctypes would wrap it silently
            check_int("gpuguard.Arena.alloc", "align", align, 0, SIZE_MAX)
        if tag is not None and type(tag) is not str:
            check_str("gpuguard.Arena.alloc", "tag", tag)
        try:  # a reusable out-pointer: making one per call costs more than the C call it serves
            out = _outs.pop()
        except IndexError:
            p = c_void_p()
            out = (p, byref(p))
        rc = _gg_alloc_ex(h, size, align, None if tag is None else tag.encode(), out[1])
        ptr = out[0].value or 0
        _outs.append(out)
        if rc < 0:
            raise_for(rc)
        a = _new_allocation(Allocation)
        a.ptr, a.size, a.tag, a._arena = ptr, size, tag, self
        a._gen = self._gens[ptr] = next(_generation)
        return a

    def free(self, block: Union[Allocation, int]) -> None:
        """Releases a block (an Allocation or a device address)."""
        h = self._h
        if h is None:
            self._handle()  # raises StateError
        ptr = _addr("gpuguard.Arena.free", block)
        rc = _gg_free(h, ptr)
        if rc < 0:
            raise_for(rc)
        _freed(self, ptr)

    def scope(self) -> ArenaScope:
        """A scope, for ``with``: blocks allocated inside are released when it ends."""
        return ArenaScope(self)

    def trim(self, keep: int = 0) -> None:
        """Unmaps wholly free memory beyond ``keep`` bytes and gives it back to the driver."""
        check_int("gpuguard.Arena.trim", "keep", keep, 0, SIZE_MAX)
        C.gg_arena_trim(self._handle(), keep)

    def stats(self) -> Dict[str, Any]:
        """The arena's statistics, with the C field names (bytes_in_use, bytes_mapped, ...)."""
        buf = StatsBuffer()
        C.gg_arena_stats(self._handle(), byref(buf))
        return {name: getattr(buf.stats, name) for name in _STATS_FIELDS}

    def blocks(self) -> List[Dict[str, Any]]:
        """The live blocks in address order: ptr, size, tag, scope_depth."""
        out: List[Dict[str, Any]] = []

        def visit(info: Any, user: Any) -> int:
            b: BlockInfo = info.contents
            out.append({"ptr": b.ptr or 0, "size": b.size, "tag": (b.tag or b"").decode(errors="replace"),
                        "scope_depth": b.scope_depth})
            return 0

        C.gg_arena_foreach_block(self._handle(), _lib.BLOCK_VISITOR(visit), None)
        return out

    def write(self, dst: Union[Allocation, int], data: bytes) -> None:
        """Copies host bytes into device memory of this arena (synchronous)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"gpuguard.Arena.write: data must be bytes, not {type(data).__name__}")
        data = bytes(data)
        ptr = _addr("gpuguard.Arena.write", dst)
        buf = ctypes.create_string_buffer(data, len(data))
        C.gg_arena_copy_to_device(self._handle(), ptr, buf, len(data))

    def read(self, src: Union[Allocation, int], n: int) -> bytes:
        """Copies n bytes of this arena's device memory to the host (synchronous)."""
        ptr = _addr("gpuguard.Arena.read", src)
        h = self._handle()
        # No larger than the arena's reservation: a bigger read cannot succeed, and the host buffer
        # would be allocated first.
        check_int("gpuguard.Arena.read", "n", n, 0, self.stats()["bytes_reserved"])
        buf = ctypes.create_string_buffer(n)
        C.gg_arena_copy_from_device(h, buf, ptr, n)
        return buf.raw

    def fill(self, dst: Union[Allocation, int], value: int, n: int) -> None:
        """Sets n bytes of this arena's device memory to value (synchronous)."""
        ptr = _addr("gpuguard.Arena.fill", dst)
        check_int("gpuguard.Arena.fill", "value", value, 0, 255)
        check_int("gpuguard.Arena.fill", "n", n, 0, SIZE_MAX)
        C.gg_arena_memset(self._handle(), ptr, value, n)
