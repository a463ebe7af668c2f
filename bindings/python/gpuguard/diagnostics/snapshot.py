"""gpuguard.diagnostics.snapshot — a recording of gpuguard's allocator turned into a PyTorch memory snapshot,
the pickle ``torch.cuda.memory._dump_snapshot`` writes and PyTorch's memory_viz page
(https://pytorch.org/memory_viz) and ``torch.cuda._memory_viz`` draw.

    python -m gpuguard.diagnostics.snapshot TRACE -o snapshot.pickle [--device N]

TRACE is what ``GPUGUARD_PLUGIN_TRACE=FILE`` records (the plugin's calls: ``a PTR SIZE STREAM``,
``f PTR STREAM``; gzip-compressed files are read too). The snapshot's ``device_traces`` hold one ``alloc``
per allocation and a ``free_requested`` + ``free_completed`` pair per free, in order; the trace has no
clock, so ``time_us`` is the event's position. Its ``segments`` are the blocks still live at the end, one
segment each (the trace does not say how the arena laid them out). With gpuguard's PyTorch backend
(``GPUGUARD_TORCH=1``) use PyTorch's own ``torch.cuda.memory._record_memory_history()`` and
``_dump_snapshot()`` instead: they hold the real segments and stacks. No torch import."""
from __future__ import annotations

import argparse
import gzip
import pickle
import sys
from typing import Any, Dict, IO, List, Optional


class TraceError(ValueError):
    """A line of the trace that is not a gpuguard plugin trace line (the message names the line)."""


def _open(path: str) -> IO[str]:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="ascii", errors="replace")
    return open(path, "rt", encoding="ascii", errors="replace")


def _int(text: str, what: str, lineno: int) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise TraceError(f"line {lineno}: {what} {text!r} is not a number") from None


def _stream(text: str) -> int:
    return 0 if text in ("(nil)", "0", "0x0") else int(text, 16)


def from_plugin_trace(path: str, device: int = 0) -> Dict[str, Any]:
    """The snapshot dict for a ``GPUGUARD_PLUGIN_TRACE`` file (see the module's description). TraceError
    for a malformed line; frees of addresses the trace never allocated are left out and counted under
    ``gpuguard.unmatched_frees``."""
    events: List[Dict[str, Any]] = []
    live: Dict[int, Dict[str, Any]] = {}
    unmatched = 0
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            op = parts[0]
            if op == "a" and len(parts) == 4:
                addr = _int(parts[1], "address", lineno)
                size = _int(parts[2], "size", lineno)
                if size < 0:
                    raise TraceError(f"line {lineno}: negative size {size}")
                try:
                    stream = _stream(parts[3])
                except ValueError:
                    raise TraceError(f"line {lineno}: stream {parts[3]!r} is not a pointer") from None
                ev = {"action": "alloc", "addr": addr, "size": size, "stream": stream, "frames": [],
                      "time_us": len(events)}
                events.append(ev)
                live[addr] = ev
            elif op == "f" and len(parts) == 3:
                addr = _int(parts[1], "address", lineno)
                got = live.pop(addr, None)
                if got is None:
                    unmatched += 1
                    continue
                for action in ("free_requested", "free_completed"):
                    events.append({"action": action, "addr": addr, "size": got["size"], "stream": got["stream"],
                                   "frames": [], "time_us": len(events)})
            else:
                raise TraceError(f"line {lineno}: {line.strip()[:80]!r} is not an 'a PTR SIZE STREAM' or "
                                 "'f PTR STREAM' line of a gpuguard plugin trace")
    segments = []
    for addr, ev in sorted(live.items()):
        segments.append({"device": device, "address": addr, "total_size": ev["size"], "stream": ev["stream"],
                         "segment_type": "large", "allocated_size": ev["size"], "active_size": ev["size"],
                         "requested_size": ev["size"], "frames": [],
                         "blocks": [{"address": addr, "size": ev["size"], "requested_size": ev["size"],
                                     "state": "active_allocated", "frames": []}]})
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(device + 1)]
    traces[device] = events
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"backend": "gpuguard"},
            "gpuguard": {"source": path, "unmatched_frees": unmatched}}


def write(snapshot: Dict[str, Any], out: str) -> None:
    """Writes ``snapshot`` as the pickle memory_viz opens."""
    with open(out, "wb") as f:
        pickle.dump(snapshot, f)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuguard.diagnostics.snapshot",
                                 description="GPUGUARD_PLUGIN_TRACE file -> PyTorch memory snapshot (memory_viz)")
    ap.add_argument("trace", help="the file GPUGUARD_PLUGIN_TRACE wrote (plain or gzip)")
    ap.add_argument("-o", "--output", default="snapshot.pickle", help="where to write (default snapshot.pickle)")
    ap.add_argument("--device", type=int, default=0, help="the device the trace was recorded on (default 0)")
    args = ap.parse_args(argv)
    if args.device < 0 or args.device > 1023:
        ap.error(f"--device {args.device}: a device ordinal 0..1023 expected")
    try:
        snap = from_plugin_trace(args.trace, args.device)
        write(snap, args.output)
    except (OSError, TraceError) as e:
        print(f"gpuguard.diagnostics.snapshot: {e}", file=sys.stderr)
        return 1
    n = len(snap["device_traces"][args.device])
    print(f"gpuguard.diagnostics.snapshot: wrote {args.output} ({n} trace entries, {len(snap['segments'])} "
          "live blocks at the end); open it at https://pytorch.org/memory_viz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
