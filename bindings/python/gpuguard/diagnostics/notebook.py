"""gpuguard.diagnostics.notebook — ``%load_ext gpuguard`` for IPython and Jupyter.

After each cell, one line when device memory changed by more than a threshold (default 64 MiB; nothing
otherwise)::

    gpuguard: +1.5 GiB this cell (device used 3.2 GiB of 140 GiB; in use 2.9 GiB, +1.4 GiB)

and the line magic ``%gpuguard``:

- ``%gpuguard holders [N]`` — who holds device memory (``gpuguard.holders``), biggest N first;
- ``%gpuguard trim`` — gives back what nothing needs: drops the stored traceback (``sys.last_*``, which
  keeps every frame of the last error alive), collects garbage, empties PyTorch's cache, trims the arenas
  serving PyTorch, and says how much went back to the driver;
- ``%gpuguard watch [on|off] [SECONDS]`` — a live line during long cells (a thread that reads counters);
- ``%gpuguard threshold SIZE`` (``64M``, ``1G``, bytes), ``%gpuguard on|off`` (the per-cell line),
  ``%gpuguard`` alone: where memory stands now.

Readers never initialise CUDA: PyTorch's counters are read only once PyTorch has initialised it, and the
device's used memory comes from NVML through the C library."""
from __future__ import annotations

import gc
import re
import sys
import threading
from typing import Any, Dict, Optional

from ..errors import check_interval
from . import _memread
from .holding import format_bytes, holders

__all__ = ["load_ipython_extension", "unload_ipython_extension", "parse_size", "trim"]

_state: Optional["_Extension"] = None


def parse_size(text: str) -> int:
    """``64M``, ``1.5G``, ``512MiB``, ``4096`` → bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"gpuguard: not a size: {text!r} (examples: 64M, 1.5G, 4096)")
    return int(float(m.group(1)) * (1 << (10 * ("_KMGT".index(m.group(2).upper() or "_")))))


def _reading(device: int) -> Dict[str, Optional[int]]:
    out: Dict[str, Optional[int]] = {"in_use": None, "used": _memread.driver_used(device), "total": None}
    rd = _memread.torch_readers(device)
    if "in_use" in rd:
        try:
            out["in_use"] = rd["in_use"]()
        except Exception:
            pass
    try:
        from ..query import device_info
        out["total"] = device_info(device)["total_bytes"]
    except Exception:
        pass
    return out


def trim(device: int = 0) -> Dict[str, Any]:
    """What ``%gpuguard trim`` does, as a function: returns {"before", "after", "returned"} in bytes of
    the device's used memory, and what it dropped."""
    before = _memread.driver_used(device)
    dropped = []
    for name in ("last_traceback", "last_value", "last_type", "last_exc"):
        if getattr(sys, name, None) is not None:
            setattr(sys, name, None)
            dropped.append(f"sys.{name}")
    gc.collect()
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            dropped.append("torch.cuda.empty_cache()")
    except Exception:
        pass
    ggt: Any = sys.modules.get("gpuguard.torch")
    for dev, arena in list((getattr(ggt, "_global_arenas", None) or {}).items()):
        try:
            ggt.trim(arena)
            dropped.append(f"arena on device {dev} trimmed")
        except Exception:
            pass
    after = _memread.driver_used(device)
    back = (before - after) if before is not None and after is not None else None
    return {"before": before, "after": after, "returned": back, "actions": dropped}


class _Extension:
    def __init__(self, shell: Any, device: int = 0) -> None:
        self.shell = shell
        self.device = device
        self.threshold = 64 << 20
        self.enabled = True
        self.watch_interval: Optional[float] = None
        self._before: Dict[str, Optional[int]] = {}
        self._watch_stop: Optional[threading.Event] = None
        self._watch_thread: Optional[threading.Thread] = None
        self.read = lambda: _reading(self.device)  # {"in_use", "used", "total"}; tests put their own

    # ---- the per-cell line -------------------------------------------------------------------------

    def pre_run_cell(self, *args: Any) -> None:
        if self.enabled or self.watch_interval:
            self._before = self.read()
        if self.watch_interval:
            self._start_watch()

    def post_run_cell(self, *args: Any) -> None:
        self._stop_watch()
        if not self.enabled or not self._before:
            return
        line = self.delta_line(self._before, self.read())
        if line:
            print(line)

    def delta_line(self, before: Dict[str, Optional[int]], now: Dict[str, Optional[int]]) -> Optional[str]:
        """The one-line summary, or None when nothing moved by more than the threshold."""
        nu, bu, ni, bi = now.get("used"), before.get("used"), now.get("in_use"), before.get("in_use")
        du = nu - bu if nu is not None and bu is not None else 0
        di = ni - bi if ni is not None and bi is not None else 0
        if abs(du) <= self.threshold and abs(di) <= self.threshold:
            return None
        main = du if abs(du) > self.threshold else di
        parts = [f"gpuguard: {'+' if main >= 0 else ''}{format_bytes(main)} this cell"]
        detail = []
        if now.get("used") is not None:
            of = f" of {format_bytes(now['total'])}" if now.get("total") else ""
            detail.append(f"device used {format_bytes(now['used'])}{of}")
        if now.get("in_use") is not None:
            detail.append(f"in use {format_bytes(now['in_use'])}, {'+' if di >= 0 else ''}{format_bytes(di)}")
        if detail:
            parts.append(f"({'; '.join(detail)})")
        return " ".join(parts)

    # ---- watch -------------------------------------------------------------------------------------

    def _start_watch(self) -> None:
        self._stop_watch()
        stop = threading.Event()
        before = dict(self._before)
        interval = self.watch_interval or 1.0
        out = sys.stdout

        def run() -> None:
            while not stop.wait(interval):
                r = self.read()
                used = r.get("used")
                if used is None:
                    continue
                d = used - (before.get("used") or used)
                text = f"\rgpuguard: device used {format_bytes(used)} ({'+' if d >= 0 else ''}{format_bytes(d)} this cell)"
                if r.get("in_use") is not None:
                    text += f", in use {format_bytes(r['in_use'])}"
                try:
                    out.write(text + "   ")
                    out.flush()
                except Exception:
                    return

        self._watch_stop = stop
        self._watch_thread = threading.Thread(target=run, name="gpuguard-watch", daemon=True)
        self._watch_thread.start()

    def _stop_watch(self) -> None:
        if self._watch_stop is not None:
            self._watch_stop.set()
            if self._watch_thread is not None:
                self._watch_thread.join()
            self._watch_stop = self._watch_thread = None

    # ---- %gpuguard ---------------------------------------------------------------------------------

    def magic(self, line: str) -> Any:
        if not isinstance(line, str):
            raise TypeError(f"%gpuguard: a line of text expected, not {type(line).__name__}")
        words = line.split()
        cmd = words[0] if words else ""
        if cmd == "holders":
            top = int(words[1]) if len(words) > 1 else 20
            h = holders(top=top)
            print(h.table())
            return None
        if cmd == "trim":
            before = self.read()
            tb: Any = getattr(self.shell, "InteractiveTB", None)
            if getattr(tb, "tb", None) is not None:
                tb.tb = None  # IPython keeps the last traceback here too
            r = trim(self.device)
            if r["returned"] is None or not r["returned"]:
                after = self.read()
                if before.get("in_use") is not None and after.get("in_use") is not None:
                    print(f"gpuguard trim: in use {format_bytes(before['in_use'])} -> {format_bytes(after['in_use'])}")
            what = ", ".join(r["actions"]) or "nothing to drop"
            back = format_bytes(r["returned"]) if r["returned"] is not None else "unknown (no device reading)"
            print(f"gpuguard trim: {what}; returned to the driver: {back}")
            if r["after"] is not None:
                print(f"gpuguard trim: device used now {format_bytes(r['after'])}")
            return None
        if cmd == "watch":
            arg = words[1] if len(words) > 1 else "on"
            if arg == "off":
                self.watch_interval = None
            else:
                text = words[2] if len(words) > 2 else (arg if arg != "on" else "1")
                try:
                    value = float(text)
                except ValueError:
                    raise ValueError(f"%gpuguard watch {text}: a number of seconds expected") from None
                self.watch_interval = check_interval("%gpuguard watch", value)
            print(f"gpuguard watch: {'off' if self.watch_interval is None else f'every {self.watch_interval:g} s during each cell'}")
            return None
        if cmd == "threshold":
            if len(words) > 1:
                self.threshold = parse_size(words[1])
            print(f"gpuguard: a line after a cell that moved memory by more than {format_bytes(self.threshold)}")
            return None
        if cmd in ("on", "off"):
            self.enabled = cmd == "on"
            print(f"gpuguard: per-cell line {cmd}")
            return None
        if cmd in ("", "status"):
            r = self.read()
            print(f"gpuguard: device {self.device} used {format_bytes(r['used'])}"
                  + (f" of {format_bytes(r['total'])}" if r.get("total") else "")
                  + (f"; in use {format_bytes(r['in_use'])}" if r.get("in_use") is not None else ""))
            return None
        print("usage: %gpuguard [status|holders [N]|trim|watch [on|off|SECONDS]|threshold SIZE|on|off]")
        return None


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext gpuguard``: registers the per-cell line and the ``%gpuguard`` magic."""
    global _state
    if _state is not None and _state.shell is shell:
        return
    _state = _Extension(shell)
    shell.events.register("pre_run_cell", _state.pre_run_cell)
    shell.events.register("post_run_cell", _state.post_run_cell)
    shell.register_magic_function(_state.magic, magic_kind="line", magic_name="gpuguard")


def unload_ipython_extension(shell: Any) -> None:
    """``%unload_ext gpuguard``: the per-cell line stops (the magic stays, as IPython keeps magics)."""
    global _state
    if _state is None:
        return
    _state._stop_watch()
    for ev, fn in (("pre_run_cell", _state.pre_run_cell), ("post_run_cell", _state.post_run_cell)):
        try:
            shell.events.unregister(ev, fn)
        except ValueError:
            pass
    _state = None
