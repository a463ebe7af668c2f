"""gpuguard.diagnostics.plot — draws a memory timeline (``gpuguard.record``'s JSON lines) as one self-contained HTML
file with an inline SVG chart: no script, no font or style fetched, so it opens anywhere, offline, and
can be attached to a bug report.

    python -m gpuguard.diagnostics.plot run.jsonl -o memory.html [--x time|step] [--title TEXT]

The chart shows every series (in use, reserved/mapped, the driver's used memory) over time or steps,
round boundaries as dashed lines, out-of-memory errors in red, the peak of ``in_use`` marked, and under
it the table of the top holders at that peak. Hovering a mark shows its label (SVG ``<title>``)."""
from __future__ import annotations

import argparse
import html
import math
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .holding import format_bytes
from .timeline import load

__all__ = ["render_html", "render_svg", "main"]

_COLORS = {"in_use": "#1f6fb4", "reserved": "#e8801a", "driver_used": "#2b9a3c"}
_PALETTE = ["#8c4bb5", "#8b5a2b", "#d6479b", "#6b6b6b", "#17a2b8"]
_NAMES = {"in_use": "in use", "reserved": "reserved / mapped", "driver_used": "driver: device used"}
_W, _H, _L, _R, _T, _B = 960, 400, 78, 20, 34, 46  # size and margins of the SVG


def _nice_step(span: float, n: int = 6) -> float:
    raw = span / max(1, n)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _unit(vmax: float) -> Tuple[float, str]:
    for div, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if vmax >= div:
            return float(div), name
    return 1.0, "B"


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any) -> str:
    """A step or time from the file, as page text: numbers only (the page promises no script; a file may
    carry anything). Anything else shows as "?"."""
    return _fmt(v) if _is_num(v) else "?"


def _numbers_only(data: Dict[str, Any]) -> Dict[str, Any]:
    """The timeline with every value that is drawn or printed a number: samples whose t or step is not
    one, and series values that are not, are left out."""
    def placed(r: Any) -> bool:
        return isinstance(r, dict) and all(_is_num(r[k]) for k in ("t", "step") if k in r and r[k] is not None)

    samples = [{k: v for k, v in s.items() if k in ("type", "t", "step") or v is None or _is_num(v)}
               for s in data.get("samples", []) if placed(s)]
    return dict(data, samples=samples, marks=[m for m in data.get("marks", []) if placed(m)],
                holders=[h for h in data.get("holders", []) if placed(h)])


def _series_names(data: Dict[str, Any]) -> List[str]:
    """The series with at least one value (a series may join after the start: PyTorch's counters once
    it initialises CUDA), in a fixed order."""
    names = set(data.get("meta", {}).get("series") or [])
    for s in data["samples"]:
        names.update(k for k, v in s.items() if k not in ("type", "t", "step") and v is not None)
    have = [n for n in names if any(s.get(n) is not None for s in data["samples"])]
    return sorted(have, key=lambda n: (list(_COLORS).index(n) if n in _COLORS else 9, n))


def _text_at(x: float, right: float) -> Tuple[float, str]:
    """Where a label beside a mark at ``x`` goes: right of it, or left when it would leave the chart."""
    return (x + 5, "start") if x < right - 90 else (x - 5, "end")


def render_svg(data: Dict[str, Any], x: str = "t") -> str:
    """The chart alone, as an SVG document (``x``: "t" for seconds, "step" for steps)."""
    data = _numbers_only(data)
    samples = data["samples"]
    names = _series_names(data)
    xs = [float(s.get(x) or 0) for s in samples] or [0.0]
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1
    vmax = max([s[n] for s in samples for n in names if s.get(n) is not None] or [1])
    div, unit = _unit(vmax)
    ystep = _nice_step(vmax / div)
    ytop = max(ystep, math.ceil(vmax / div / ystep) * ystep)
    pw, ph = _W - _L - _R, _H - _T - _B

    def px(v: float) -> float:
        return _L + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return _T + ph - (v / div) / ytop * ph

    out: List[str] = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
                      f'viewBox="0 0 {_W} {_H}" role="img" aria-label="GPU memory over {"time" if x == "t" else "steps"}">',
                      '<style>text{font:12px sans-serif;fill:#333}.grid{stroke:#e4e4e4}.axis{stroke:#666}'
                      '.series{fill:none;stroke-width:2}.round{stroke:#999;stroke-dasharray:4 3}'
                      '.oom{stroke:#d62728;stroke-width:2}.oomtext{fill:#d62728;font-weight:bold}'
                      '.peak{fill:#1f6fb4}</style>',
                      f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    # grid and axes
    v = 0.0
    while v <= ytop + 1e-9:
        y = py(v * div)
        out.append(f'<line class="grid" x1="{_L}" x2="{_L + pw}" y1="{_fmt(y)}" y2="{_fmt(y)}"/>')
        out.append(f'<text x="{_L - 6}" y="{_fmt(y + 4)}" text-anchor="end">{_fmt(v)} {unit}</text>')
        v += ystep
    xstep = _nice_step(x1 - x0, 8)
    v = math.ceil(x0 / xstep) * xstep
    while v <= x1 + 1e-9:
        X = px(v)
        out.append(f'<line class="grid" x1="{_fmt(X)}" x2="{_fmt(X)}" y1="{_T}" y2="{_T + ph}"/>')
        out.append(f'<text x="{_fmt(X)}" y="{_T + ph + 16}" text-anchor="middle">{_fmt(v)}</text>')
        v += xstep
    out.append(f'<text x="{_L + pw / 2}" y="{_H - 8}" text-anchor="middle">'
               f'{"seconds since the start" if x == "t" else "step"}</text>')
    # marks
    for m in data.get("marks", []):
        X = px(float(m.get(x) or 0))
        label = html.escape(f'{m.get("kind")}: {m.get("label", "")}'.strip(": "))
        if m.get("kind") == "oom":
            tx, anchor = _text_at(X, _L + pw)
            out.append(f'<g class="mark oom-mark"><title>{label}</title><line class="oom" x1="{_fmt(X)}" '
                       f'x2="{_fmt(X)}" y1="{_T}" y2="{_T + ph}"/><text class="oomtext" x="{_fmt(tx)}" '
                       f'y="{_T + 14}" text-anchor="{anchor}">OOM</text></g>')
        else:
            out.append(f'<g class="mark round-mark"><title>{label}</title><line class="round" x1="{_fmt(X)}" '
                       f'x2="{_fmt(X)}" y1="{_T}" y2="{_T + ph}"/></g>')
    # series: a path per series, broken where a value is missing
    for i, n in enumerate(names):
        color = _COLORS.get(n, _PALETTE[i % len(_PALETTE)])
        d: List[str] = []
        pen = "M"
        for s, X in zip(samples, xs):
            val = s.get(n)
            if val is None:
                pen = "M"
                continue
            d.append(f"{pen}{_fmt(px(X))} {_fmt(py(val))}")
            pen = "L"
        out.append(f'<path class="series {html.escape(n)}" data-series="{html.escape(n)}" stroke="{color}" '
                   f'd="{" ".join(d)}"><title>{html.escape(_NAMES.get(n, n))}</title></path>')
    # the peak of in_use
    use = [(s["in_use"], X) for s, X in zip(samples, xs) if s.get("in_use") is not None]
    if use:
        pv, pxv = max(use, key=lambda t: t[0])
        tx, anchor = _text_at(px(pxv), _L + pw)
        out.append(f'<g class="peak-mark"><title>peak in use: {format_bytes(pv)}</title><circle class="peak" '
                   f'cx="{_fmt(px(pxv))}" cy="{_fmt(py(pv))}" r="4"/><text x="{_fmt(tx)}" '
                   f'y="{_fmt(py(pv) - 6)}" text-anchor="{anchor}">peak {format_bytes(pv)}</text></g>')
    # legend
    lx = _L
    for i, n in enumerate(names):
        color = _COLORS.get(n, _PALETTE[i % len(_PALETTE)])
        label = html.escape(_NAMES.get(n, n))
        out.append(f'<g class="legend"><rect x="{lx}" y="10" width="14" height="4" fill="{color}"/>'
                   f'<text x="{lx + 18}" y="16">{label}</text></g>')
        lx += 30 + 7 * len(_NAMES.get(n, n))
    out.append("</svg>")
    return "\n".join(out)


def _holders_table(recs: Sequence[Dict[str, Any]]) -> str:
    if not recs:
        return "<p class=note>No holders were recorded (record(holders_at_peak=False), or nothing in use).</p>"
    h = max(recs, key=lambda r: r.get("in_use") or 0)
    rows = []
    for r in h.get("rows", []):
        shape = r.get("shape")
        what = ("x".join(str(s) for s in shape) or "scalar") if shape is not None else "-"
        if r.get("dtype"):
            what += f" {r['dtype']}"
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            format_bytes(r.get("bytes")), r.get("device", ""), what, r.get("via", ""))) +
            f"<td><code>{html.escape(r.get('chain', ''))}</code></td></tr>")
    return (f"<h2>Top holders at the peak</h2><p class=note>At step {_num(h.get('step'))} (t = {_num(h.get('t'))} s), "
            f"{format_bytes(h.get('in_use'))} in use; the buffers below held {format_bytes(h.get('total_bytes'))} "
            "in all.</p><table><tr><th>size</th><th>device</th><th>what</th><th>via</th><th>held by</th></tr>"
            + "".join(rows) + "</table>")


def render_html(data: Dict[str, Any], x: str = "t", title: Optional[str] = None) -> str:
    """The whole page: a summary, the chart, the marks and the holders at the peak."""
    data = _numbers_only(data)
    samples = data["samples"]
    meta = data.get("meta", {})
    title = str(title or meta.get("name") or "GPU memory timeline")
    names = _series_names(data)
    peaks = ", ".join(f"{_NAMES.get(n, n)} {format_bytes(max(s[n] for s in samples if s.get(n) is not None))}"
                      for n in names)
    dur = samples[-1].get("t", 0) if samples else 0
    ooms = [m for m in data.get("marks", []) if m.get("kind") == "oom"]
    rounds = [m for m in data.get("marks", []) if m.get("kind") == "round"]
    summary = (f"{len(samples)} samples over {dur:.1f} s, {len(rounds)} round boundaries, "
               f"{len(ooms)} out-of-memory error{'s' if len(ooms) != 1 else ''}. Peaks: {peaks or 'none'}.")
    oom_list = "".join(f"<li>step {_num(m.get('step'))}, t = {_num(m.get('t'))} s: {html.escape(str(m.get('label', '')))}</li>"
                       for m in ooms)
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>{html.escape(title)}</title><style>body{{font:14px sans-serif;margin:24px;color:#222}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}"
            "th{background:#f4f4f4}.note{color:#555}code{font-size:13px}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class=note>{html.escape(summary)}</p>\n"
            + render_svg(data, x) + "\n"
            + (f"<h2>Out-of-memory errors</h2><ul>{oom_list}</ul>" if ooms else "")
            + _holders_table(data.get("holders", []))
            + "<p class=note>Made by gpuguard.diagnostics.plot from a gpuguard.record() timeline.</p></body></html>\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuguard.diagnostics.plot",
                                 description="Draw a gpuguard memory timeline (JSON lines) as a self-contained HTML file.")
    ap.add_argument("file", help="the timeline written by gpuguard.record(path)")
    ap.add_argument("-o", "--output", default="memory.html", help="the HTML file to write (default memory.html)")
    ap.add_argument("--x", choices=("time", "step"), default="time", help="horizontal axis (default time)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    try:
        data = load(args.file)
    except OSError as e:
        print(f"gpuguard.diagnostics.plot: {e}", file=sys.stderr)
        return 1
    data = _numbers_only(data)
    if not data["samples"]:
        print(f"gpuguard.diagnostics.plot: {args.file} holds no samples (is it a gpuguard.record() timeline?)", file=sys.stderr)
        return 1
    try:
        page = render_html(data, "t" if args.x == "time" else "step", args.title)
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # a record of the wrong shape
        print(f"gpuguard.diagnostics.plot: {args.file}: not a timeline this can draw ({e})", file=sys.stderr)
        return 1
    # A new file of our own beside the output, renamed over it: a planted OUT.tmp (a symlink to another
    # user's file) is never written through.
    out_dir = os.path.dirname(os.path.abspath(args.output))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix="." + os.path.basename(args.output) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o644 & ~mask)
        os.replace(tmp, args.output)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    print(f"gpuguard.diagnostics.plot: wrote {args.output} ({len(data['samples'])} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
