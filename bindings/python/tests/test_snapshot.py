"""gpuguard.diagnostics.snapshot: a GPUGUARD_PLUGIN_TRACE recording (made here by the real plugin on the
host backend, in a child process) turned into a PyTorch memory snapshot."""
from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from gpuguard.diagnostics import snapshot as S

CHILD = textwrap.dedent("""
    import ctypes, gpuguard
    from gpuguard._lib import C
    a = gpuguard.Arena(capacity=64 << 20)
    C.gg_plugin_set_arena(0, a._handle())
    lib = ctypes.CDLL(gpuguard._lib.path)
    lib.gg_torch_alloc.restype = ctypes.c_void_p
    lib.gg_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.gg_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    p = [lib.gg_torch_alloc(n, 0, None) for n in (1000, 1 << 20, 4096)]
    lib.gg_torch_free(p[0], 1000, 0, None)
    lib.gg_torch_free(p[2], 4096, 0, None)
    print(p[1])
""")


def test_a_real_plugin_trace_becomes_a_snapshot(tmp_path) -> None:
    trace = tmp_path / "plugin.trace"
    import gpuguard
    here = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))
    env = dict(os.environ, GPUGUARD_PLUGIN_TRACE=str(trace),
               PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    still_live = int(r.stdout.split()[-1])
    snap = S.from_plugin_trace(str(trace))
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions == ["alloc"] * 3 + ["free_requested", "free_completed"] * 2
    assert [e["size"] for e in snap["device_traces"][0][:3]] == [1000, 1 << 20, 4096]
    assert [e["time_us"] for e in snap["device_traces"][0]] == list(range(7))
    assert len(snap["segments"]) == 1 and snap["segments"][0]["address"] == still_live
    blk = snap["segments"][0]["blocks"][0]
    assert blk["state"] == "active_allocated" and blk["size"] == 1 << 20
    out = tmp_path / "snap.pickle"
    rc = S.main([str(trace), "-o", str(out)])
    assert rc == 0
    with open(out, "rb") as f:
        again = pickle.load(f)
    assert again["device_traces"] == snap["device_traces"]
    gz = tmp_path / "plugin.trace.gz"
    gz.write_bytes(gzip.compress(trace.read_bytes()))
    assert S.from_plugin_trace(str(gz))["device_traces"] == snap["device_traces"]
    try:  # where PyTorch is installed, its own viewer draws it
        from torch.cuda import _memory_viz
    except ImportError:
        return
    assert len(_memory_viz.trace_plot(again)) > 1000


@pytest.mark.parametrize("line,needle", [
    ("a 0x10 big (nil)", "size 'big'"),
    ("a 0x10 -5 (nil)", "negative size"),
    ("x 1 2", "is not an 'a PTR SIZE STREAM'"),
    ("a 0x10 256 zz", "stream 'zz'"),
    ("f nope (nil)", "address 'nope'"),
])
def test_bad_lines_name_the_line(tmp_path, line: str, needle: str) -> None:
    trace = tmp_path / "bad.trace"
    trace.write_text("# gpuguard plugin trace\na 0x100 512 (nil)\n" + line + "\n")
    with pytest.raises(S.TraceError, match="line 3") as e:
        S.from_plugin_trace(str(trace))
    assert needle in str(e.value)
    assert S.main([str(trace), "-o", str(tmp_path / "o.pickle")]) == 1
    assert not (tmp_path / "o.pickle").exists()


def test_unmatched_frees_are_counted_not_invented(tmp_path) -> None:
    trace = tmp_path / "t.trace"
    trace.write_text("f 0x500 (nil)\na 0x100 512 0x7f00\nf 0x100 0x7f00\n")
    snap = S.from_plugin_trace(str(trace), device=2)
    assert snap["gpuguard"]["unmatched_frees"] == 1
    assert len(snap["device_traces"]) == 3 and snap["device_traces"][0] == []
    assert [e["action"] for e in snap["device_traces"][2]] == ["alloc", "free_requested", "free_completed"]
    assert snap["device_traces"][2][0]["stream"] == 0x7F00
    assert snap["segments"] == []
    with pytest.raises(SystemExit):
        S.main([str(trace), "--device", "-1"])
