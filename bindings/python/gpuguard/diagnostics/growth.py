"""gpuguard.diagnostics.growth — ``rounds``: memory that grows a little every round of a training or evaluation
loop, caught with a name. After each round, memory in use is compared with the first round's; growth
beyond a threshold gives one ``MemoryGrowthWarning`` (through ``warnings.warn``) naming what survived
since then (the device buffers alive now that were not after round 1, with their chains from
``holders``), once per new culprit. Nothing is said while memory is flat.

Costs: one reading per round; one ``gc`` scan (no chains) at the end of the first round; when growth
crosses the threshold, one more scan, and a ``holders`` walk a round later (then again only after the
growth rose by another threshold)."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ._memread import default_reader
from .holding import Holder, buffer_keys, format_bytes, holders

__all__ = ["rounds", "Rounds", "MemoryGrowthWarning"]

_FIX = {
    "autograd graph": "keep numbers, not tensors, across rounds (loss.item(), or .detach())",
    "stored traceback": "del sys.last_traceback (in a notebook: %gpuguard trim)",
    "optimizer state": "delete the optimizer with its model",
    "cache": "bound the cache or call cache_clear()",
    "gradient": "zero_grad(set_to_none=True) or del the .grad",
}


class MemoryGrowthWarning(RuntimeWarning):
    """Memory in use grew across rounds beyond the threshold; the message names what holds the growth."""


class Rounds:
    """``with rounds(name="epoch") as r:`` ... ``r.step()`` at the end of each round (or
    ``for batch in r.each(loader):``). ``reader()`` returns the bytes in use (default: PyTorch's
    ``memory_allocated``, an arena's bytes in use under ``use_arena``, else the device's used memory);
    ``threshold`` is the growth in bytes that is worth a word (default: 5% of the first round's, at least
    16 MiB). ``on_growth(report)`` receives each report as a dict; ``warn=False`` silences the warning.
    ``history`` holds the bytes in use after each round; ``reports`` the reports given."""

    def __init__(self, name: str = "round", threshold: Optional[int] = None,
                 reader: Optional[Callable[[], Optional[int]]] = None, device: int = 0, top: int = 5,
                 on_growth: Optional[Callable[[Dict[str, Any]], Any]] = None, warn: bool = True,
                 arena: Any = None) -> None:
        self.name = name
        self.threshold = threshold
        self.device = device
        self.top = top
        self.on_growth = on_growth
        self.warn = warn
        self._reader = reader
        self._arena = arena
        self.reader_name = "in use"
        self.round = 0
        self.history: List[int] = []
        self.reports: List[Dict[str, Any]] = []
        self._baseline: Optional[int] = None
        self._base_keys: Dict[Tuple[str, int], int] = {}
        self._warned: set = set()
        self._pending: Optional[Dict[Tuple[str, int], int]] = None
        self._checked_at = 0

    def _read(self) -> Optional[int]:
        if self._reader is None:  # chosen at the first reading: CUDA may be initialised by then
            self._reader, self.reader_name = default_reader(self.device, self._arena)
        v = self._reader()
        return None if v is None else int(v)

    def __enter__(self) -> "Rounds":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def each(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yields each item; the round ends (``step()``) when the loop body is done with it."""
        for item in iterable:
            yield item
            self.step()

    def step(self) -> Optional[Dict[str, Any]]:
        """Ends a round: reads memory in use, compares it with the first round's, and warns when it grew
        beyond the threshold and a new culprit holds the growth. Returns the report, or None."""
        self.round += 1
        mem = self._read()
        _timeline_round(self.name, self.round)
        if mem is None:
            return None
        self.history.append(mem)
        if self._baseline is None:
            self._baseline = mem
            self._base_keys = buffer_keys()
            return None
        growth = mem - self._baseline
        limit = self.threshold if self.threshold is not None else max(16 << 20, self._baseline // 20)
        if growth <= max(limit, self._checked_at + limit):
            return None
        if self._pending is None:
            # A buffer counts once it survived a whole round: the current batch is new in every round,
            # a leak's buffers stay. So look again after the next round.
            self._pending = buffer_keys()
            return None
        base, pending = self._base_keys, self._pending
        self._pending, self._checked_at = None, growth
        new = holders(top=0, only=lambda k: k not in base and k in pending)
        culprits: Dict[Tuple[str, str], List[Holder]] = {}
        for h in new:
            culprits.setdefault((h.culprit, h.via), []).append(h)
        fresh = {c: hs for c, hs in culprits.items() if c not in self._warned}
        if not culprits:
            fresh = {} if ("", "outside Python") in self._warned else {("", "outside Python"): []}
        if not fresh:
            return None
        self._warned.update(fresh)
        report = self._report(mem, growth, fresh, new.total_bytes)
        self.reports.append(report)
        if self.on_growth is not None:
            self.on_growth(report)
        if self.warn:
            warnings.warn(report["message"], MemoryGrowthWarning, stacklevel=2)
        return report

    def _report(self, mem: int, growth: int, fresh: Dict[Tuple[str, str], List[Holder]],
                new_bytes: int) -> Dict[str, Any]:
        n = self.round
        per_round = growth / max(1, n - 1)
        head = (f"gpuguard: {self.name} {n}: memory in use grew by {format_bytes(growth)} since {self.name} 1 "
                f"({format_bytes(per_round)} per {self.name}; {self.reader_name} {format_bytes(mem)})")
        lines = [head]
        rows: List[Any] = []
        for (culprit, via), hs in sorted(fresh.items(), key=lambda kv: -sum(h.bytes for h in kv[1])):
            if not hs:
                lines.append("  no buffer held by a Python object is new since then: the growth is held "
                             "outside Python (an allocator's cache, C/C++ code)")
                continue
            total = sum(h.bytes for h in hs)
            lines.append(f"  {culprit} ({via}) holds {len(hs)} new buffer{'s' if len(hs) != 1 else ''}, "
                         f"{format_bytes(total)}: e.g. {hs[0].chain}")
            if via in _FIX:
                lines.append(f"    fix: {_FIX[via]}")
            rows.extend(h.as_dict() for h in hs[:self.top])
        return {"round": n, "name": self.name, "in_use": mem, "growth": growth, "baseline": self._baseline,
                "new_bytes": new_bytes, "culprits": [{"culprit": c, "via": v} for c, v in fresh],
                "rows": rows, "message": "\n".join(lines)}


def rounds(name: str = "round", threshold: Optional[int] = None,
           reader: Optional[Callable[[], Optional[int]]] = None, **kw: Any) -> Rounds:
    """``with gpuguard.rounds(name="epoch") as r:`` — see ``Rounds``."""
    return Rounds(name=name, threshold=threshold, reader=reader, **kw)


def _timeline_round(name: str, n: int) -> None:
    """Marks a round boundary on the active timeline recorders, if any."""
    import sys
    tl = sys.modules.get("gpuguard.diagnostics.timeline")
    if tl is not None:
        tl._round_boundary(name, n)
