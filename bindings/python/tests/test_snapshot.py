"""gpuguard.diagnostics.snapshot: a GPUGUARD_PLUGIN_TRACE recording (the format gpuguard's PyTorch
backend writes, to PATH.PID; its writer is tested in tests/test_torch_adapter.cpp) turned into a
PyTorch memory snapshot."""
from __future__ import annotations

import gzip
import pickle

import pytest

from gpuguard.diagnostics import snapshot as S

# What the backend writes for three allocations and two frees on the default stream.
TRACE = """# gpuguard plugin trace, pid 4242
a 0x7f0000000000 1000 (nil)
a 0x7f0000100000 1048576 (nil)
a 0x7f0000200000 4096 (nil)
f 0x7f0000000000 (nil)
f 0x7f0000200000 (nil)
"""


def test_a_backend_trace_becomes_a_snapshot(tmp_path) -> None:
    trace = tmp_path / "plugin.trace.4242"
    trace.write_text(TRACE)
    still_live = 0x7f0000100000
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
