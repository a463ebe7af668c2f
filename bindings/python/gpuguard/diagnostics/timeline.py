"""gpuguard.diagnostics.timeline — ``record()``: a memory timeline of a run, as JSON lines that ``python -m
gpuguard.diagnostics.plot FILE -o memory.html`` draws.

Each line is one record: ``{"type": "meta", "version": 1, "start": <unix time>, "device": 0,
"series": [...]}`` first, then ``sample`` records (``t`` seconds since the start, ``step``, one field per
series: ``in_use``, ``reserved``, ``driver_used``, in bytes or null), ``mark`` records (``kind``:
``round`` or ``oom``, ``label``) and at the end one ``holders`` record: the top holders seen at the peak
of ``in_use`` (``rows`` as ``Holder.as_dict()``).

Samples are taken at each ``step()`` (and every ``interval`` seconds on a thread, when given; that
thread only reads counters and never walks the heap). ``rounds`` marks its round boundaries on the active
recorders. The holders at the peak are taken in ``step()`` whenever ``in_use`` passes the last peak
whose holders were taken by a quarter, so a run that grows to N bytes pays for a few walks, not one per
step."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, Any, Dict, List, Optional

from ..errors import check_interval
from ._memread import Reader, series as _default_series
from .holding import holders

__all__ = ["record", "Recorder", "load"]

_active: List["Recorder"] = []
_active_lock = threading.Lock()


def _is_oom(exc: Optional[BaseException]) -> bool:
    return exc is not None and "OutOfMemory" in type(exc).__name__


class Recorder:
    """A recording in progress; see ``record``. ``records`` keeps everything written."""

    def __init__(self, path: Optional[str] = None, interval: Optional[float] = None, device: int = 0,
                 readers: Optional[Dict[str, Reader]] = None, holders_at_peak: bool = True, top: int = 8,
                 arena: Any = None, name: str = "") -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):  # an int would be a descriptor
            raise TypeError(f"gpuguard.record: path must be a str or path, not {type(path).__name__}")
        self.path = path
        self.interval = None if interval is None else check_interval("gpuguard.record", interval)
        self.device = device
        self.holders_at_peak = holders_at_peak
        self.top = top
        self.name = name
        self._readers = readers
        self._arena = arena
        self.records: List[Dict[str, Any]] = []
        self._file: Optional[IO[str]] = None
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._step = 0
        self._peak = -1
        self._peak_taken = 0
        self._peak_holders: Optional[Dict[str, Any]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._num_ooms: Optional[int] = None
        self._auto = readers is None

    # ---- lifetime ----------------------------------------------------------------------------------

    def start(self) -> "Recorder":
        """Opens the file, writes the meta record and starts the interval thread (if any)."""
        self._auto = self._readers is None
        if self._readers is None:
            self._readers = _default_series(self.device, self._arena)
        self._t0 = time.monotonic()
        if self.path is not None:
            self._file = open(self.path, "w", encoding="utf-8")
        self._write({"type": "meta", "version": 1, "start": time.time(), "device": self.device,
                     "name": self.name, "series": sorted(self._readers)})
        with _active_lock:
            _active.append(self)
        self.sample()
        if self.interval:
            self._thread = threading.Thread(target=self._run, name="gpuguard-timeline", daemon=True)
            self._thread.start()
        return self

    def stop(self, exc: Optional[BaseException] = None) -> None:
        """Marks an OOM when ``exc`` is one, takes a last sample, writes the holders at the peak, closes."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with _active_lock:
            if self in _active:
                _active.remove(self)
        if _is_oom(exc):
            self.mark("oom", str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        self.sample()
        if self._peak_holders is not None:
            self._write(self._peak_holders)
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample(walk=False)
            except Exception:
                pass

    # ---- records -----------------------------------------------------------------------------------

    def _write(self, rec: Dict[str, Any]) -> None:
        with self._lock:
            self.records.append(rec)
            if self._file is not None:
                self._file.write(json.dumps(rec, separators=(",", ":")) + "\n")
                self._file.flush()

    def _now(self) -> float:
        return round(time.monotonic() - self._t0, 6)

    def sample(self, step: Optional[int] = None, walk: bool = True) -> Dict[str, Any]:
        """Reads every series now and writes a sample. ``walk``: may take the holders at a new peak."""
        if self._auto and "in_use" not in (self._readers or {}):
            # PyTorch may initialise CUDA after the recording began: its counters join then
            self._readers = _default_series(self.device, self._arena)
        rec: Dict[str, Any] = {"type": "sample", "t": self._now(), "step": self._step if step is None else step}
        for name, read in (self._readers or {}).items():
            try:
                v = read()
                rec[name] = None if v is None else int(v)
            except Exception:
                rec[name] = None
        self._write(rec)
        self._check_ooms()
        v = rec.get("in_use")
        if v is not None and v > self._peak:
            self._peak = v
            if walk and self.holders_at_peak and v > self._peak_taken * 1.25:
                self._peak_taken = v
                h = holders(top=self.top)
                self._peak_holders = {"type": "holders", "t": rec["t"], "step": rec["step"], "in_use": v,
                                      "total_bytes": h.total_bytes, "rows": [r.as_dict() for r in h.rows]}
        return rec

    def _check_ooms(self) -> None:
        """PyTorch counts the OOMs it raised: one new since the last sample is a mark."""
        import sys
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_initialized():
                return
            n = int(torch.cuda.memory_stats(self.device).get("num_ooms", 0))
        except Exception:
            return
        if self._num_ooms is not None and n > self._num_ooms:
            self.mark("oom", f"{n - self._num_ooms} out-of-memory error(s) in PyTorch")
        self._num_ooms = n

    def step(self) -> Dict[str, Any]:
        """Advances the step counter and takes a sample."""
        self._step += 1
        return self.sample()

    def mark(self, kind: str, label: str = "") -> None:
        """A mark on the timeline: ``round`` (rounds does it), ``oom``, or any word of your own."""
        self._write({"type": "mark", "t": self._now(), "step": self._step, "kind": kind, "label": label})


def record(path: Optional[str] = None, interval: Optional[float] = None, **kw: Any) -> Recorder:
    """``with gpuguard.record("run.jsonl") as rec:`` ... ``rec.step()`` — a memory timeline (see the
    module's doc). ``readers`` maps series names to callables returning bytes (default: PyTorch's
    allocated and reserved bytes, or the arena's under ``use_arena``, and the driver's used memory);
    ``arena`` reads an arena instead; ``holders_at_peak=False`` skips the holders walk."""
    return Recorder(path, interval, **kw)


def _round_boundary(name: str, n: int) -> None:
    """Called by rounds at the end of round ``n``: a mark and a sample on every active recorder."""
    with _active_lock:
        recs = list(_active)
    for r in recs:
        r.mark("round", f"{name} {n}")
        r.sample()


def load(path: str) -> Dict[str, Any]:
    """Reads a timeline file: {"meta", "samples", "marks", "holders"} (unknown record types are kept
    under "other"; a truncated last line, from a run that died, is skipped)."""
    out: Dict[str, Any] = {"meta": {}, "samples": [], "marks": [], "holders": [], "other": []}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind = rec.get("type")
            if kind == "meta":
                out["meta"] = rec
            elif kind in ("sample", "mark", "holders"):
                out[kind + "s" if kind != "holders" else "holders"].append(rec)
            else:
                out["other"].append(rec)
    return out

