"""holders(), rounds(), record() and the plot, on stand-in CUDA tensors (tests/fakecuda.py) whose
autograd graph and gradients are hidden from the garbage collector as PyTorch's C++ side hides them.
Each case runs in a child interpreter with its own __main__, so the roots are what a user would have."""
import json
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))

PRELUDE = f"""
import gc, sys, json, warnings
sys.path[:0] = [{HERE!r}, {PKG!r}]
import gpuguard
from fakecuda import FakeTensor, FakeUntypedStorage, CudaArray, STATE
from gpuguard.diagnostics.holding import holders

class Module:
    def __init__(self):
        self._parameters, self._buffers, self._modules = {{}}, {{}}, {{}}
        self.training = True
    def named_parameters(self): return iter(())
    def _apply(self, fn): return self

class Linear(Module):
    def __init__(self, i, o):
        super().__init__()
        self._parameters["weight"] = FakeTensor((o, i), requires_grad=True)
        self._buffers["scale"] = FakeTensor((o,))

class Net(Module):
    def __init__(self):
        super().__init__()
        self._modules["fc"] = Linear(256, 128)

class Adam:
    def __init__(self, params):
        self.param_groups = [{{"params": list(params), "lr": 1e-3}}]
        self.state = {{}}
    def step(self):
        for p in self.param_groups[0]["params"]:
            self.state[p] = {{"step": 1, "exp_avg": FakeTensor(p.shape), "exp_avg_sq": FakeTensor(p.shape)}}

def rows():
    return {{r.chain: r for r in holders(top=0)}}
"""


def run(body, env=None):
    src = PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return r


def test_names_each_kind_of_holder():
    run("""
        model = Net()
        opt = Adam([model._modules["fc"]._parameters["weight"]])
        opt.step()
        x = FakeTensor((64, 256))
        view = x.detach()                      # a second tensor on the same storage: one buffer
        arr = CudaArray(1000)                  # __cuda_array_interface__
        cpu = FakeTensor((4096, 4096), device="cpu")   # not device memory: not listed
        def make():
            kept = FakeTensor((100, 100))
            return lambda: kept
        fn = make()
        import functools
        @functools.lru_cache(maxsize=8)
        def cached(n):
            return FakeTensor((n, 3))
        cached(77)
        def local_holder():
            loc = FakeTensor((5, 5))
            return rows()
        r = local_holder()
        want = {
            "model.fc.weight": "module parameter",
            "model.fc.scale": "module buffer",
            "x": "global variable",
            "arr": "global variable",
            "fn (closure variable 'kept')": "closure",
            "cached (lru_cache entry)": "cache",
            "loc": "local in local_holder()",
        }
        for chain, via in want.items():
            assert chain in r, (chain, sorted(r))
            assert r[chain].via == via, (chain, r[chain].via)
        assert r["x"].objects == 2 and r["x"].shape == (64, 256) and r["x"].bytes == 64 * 256 * 4
        exp = [c for c in r if c.startswith("opt.state[") and c.endswith("['exp_avg']")]
        assert exp and r[exp[0]].via == "optimizer state", sorted(r)
        assert r["arr"].bytes == 8000 and r["arr"].kind == "cuda array"
        assert not any(h.shape == (4096, 4096) for h in r.values())
        table = str(holders())
        assert "model.fc.weight" in table and "module parameter" in table
        d = holders().as_dict()
        json.dumps(d)
        assert d["count"] == len(r) - 1  # `loc` died with its function
        assert d["rows"][0]["bytes"] >= d["rows"][-1]["bytes"]
        print("OK")
    """)


def test_the_three_classic_cases():
    run("""
        # 1. a stored traceback keeps a frame's tensors
        def step():
            act = FakeTensor((2048, 1024))
            raise RuntimeError("CUDA out of memory")
        try:
            step()
        except RuntimeError:
            sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        r = rows()
        tb = [c for c in r if c.startswith("sys.last_") and c.endswith(" act")]
        assert tb and r[tb[0]].via == "stored traceback" and "step()" in tb[0], sorted(r)
        sys.last_type = sys.last_value = sys.last_traceback = None
        assert not any(c.endswith(" act") for c in rows())

        # 2. a returned tensor keeps its graph, which keeps the activations (hidden from gc)
        w = FakeTensor((1024, 64), requires_grad=True)
        def forward():
            hidden = FakeTensor((32, 1024))
            return hidden.matmul(w).sum()
        out = forward()
        r = rows()
        saved = [c for c in r if c.startswith("out.grad_fn") and "_saved_self" in c]
        assert saved and r[saved[0]].via == "autograd graph" and r[saved[0]].shape == (32, 1024), sorted(r)
        assert "MmBackward0" in saved[0]
        del out
        assert not any(c.startswith("out.grad_fn") for c in rows())

        # 3. the optimizer of a deleted model keeps its parameters and its state
        model = Net()
        opt = Adam([model._modules["fc"]._parameters["weight"]])
        opt.step()
        del model
        r = rows()
        assert "opt.param_groups[0]['params'][0]" in r, sorted(r)
        assert sum(1 for c in r if c.startswith("opt.state[")) == 2
        assert r["opt.param_groups[0]['params'][0]"].via == "optimizer parameter"
        assert all(r[c].via == "optimizer state" for c in r if c.startswith("opt.state"))
        print("OK")
    """)


def test_gradient_and_unreachable_buffers():
    run("""
        import fakecuda
        p = FakeTensor((10, 10), requires_grad=True)
        p.set_grad(FakeTensor((10, 10)))       # .grad lives in C++ in PyTorch
        fakecuda._incref(FakeTensor((7, 7)))    # a reference nobody can name (C code)
        r = rows()
        assert "p.grad" in r and r["p.grad"].via == "gradient", sorted(r)
        lost = [h for h in r.values() if h.via == "unreachable"]
        assert len(lost) == 1 and lost[0].shape == (7, 7)
        print("OK")
    """)


def test_arena_blocks_are_buffers_too():
    run("""
        arena = gpuguard.Arena(capacity=64 << 20, name="t")
        blk = arena.alloc(3 << 20, tag="kv-cache")
        r = rows()
        assert "blk" in r and r["blk"].bytes == 3 << 20 and r["blk"].kind == "arena block", sorted(r)
        assert r["blk"].dtype == "kv-cache" and r["blk"].device.startswith("host:")
        print("OK")
    """)


def test_import_gpuguard_does_not_import_the_diagnostics_or_torch():
    run("""
        for m in ("torch", "cupy", "IPython", "gpuguard.diagnostics.monitoring", "gpuguard.diagnostics.notebook"):
            assert m not in sys.modules, m
        assert gpuguard.holders is holders and callable(gpuguard.rounds) and callable(gpuguard.monitor)
        print("OK")
    """)


LEAK = textwrap.dedent("""
    from gpuguard.diagnostics.growth import rounds, MemoryGrowthWarning
    w = FakeTensor((1024, 64), requires_grad=True)
    caught = []
    def loop(keep_tensor, n=8):
        total = 0
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with rounds(name="epoch", threshold=300 << 10, reader=lambda: STATE.allocated) as r:
                for x in r.each(FakeTensor((64, 1024)) for _ in range(n)):
                    loss = x.matmul(w).sum()
                    total += loss if keep_tensor else loss.item()
        return r, [w for w in ws if issubclass(w.category, MemoryGrowthWarning)]
""")


def test_rounds_names_the_loss_accumulation_leak_once():
    run(LEAK + textwrap.dedent("""
        r, ws = loop(keep_tensor=True, n=10)
        assert len(ws) == 1, [str(w.message) for w in ws]
        msg = str(ws[0].message)
        assert "total (autograd graph)" in msg and "total.grad_fn" in msg and "loss.item()" in msg, msg
        assert "epoch" in msg and r.reports[0]["culprits"] == [{"culprit": "total", "via": "autograd graph"}]
        assert r.history[-1] > r.history[0]
        print("OK")
    """))


def test_rounds_is_silent_when_flat():
    run(LEAK + textwrap.dedent("""
        r, ws = loop(keep_tensor=False, n=10)
        assert ws == [] and r.reports == [] and len(set(r.history)) == 1, (r.history, ws)
        print("OK")
    """))


def test_rounds_growth_outside_python_is_said_once():
    run("""
        from gpuguard.diagnostics.growth import rounds, MemoryGrowthWarning
        used = [0]
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            with rounds(threshold=10, reader=lambda: used[0]) as r:
                for i in range(6):
                    used[0] += 100
                    r.step()
        msgs = [str(w.message) for w in ws if issubclass(w.category, MemoryGrowthWarning)]
        assert len(msgs) == 1 and "outside Python" in msgs[0], msgs
        print("OK")
    """)


def _svg(html):
    m = re.search(r"<svg.*</svg>", html, re.S)
    assert m, html[:500]
    return ET.fromstring(m.group(0))


def test_record_and_plot(tmp_path):
    path, out = tmp_path / "run.jsonl", tmp_path / "memory.html"
    run(f"""
        from gpuguard.diagnostics.growth import rounds
        from gpuguard.diagnostics.timeline import record
        w = FakeTensor((1024, 64), requires_grad=True)
        total = 0
        readers = {{"in_use": lambda: STATE.allocated, "reserved": lambda: STATE.allocated + (8 << 20),
                    "driver_used": lambda: STATE.allocated + (500 << 20)}}
        class OutOfMemoryError(RuntimeError):
            pass
        try:
            with record({str(path)!r}, readers=readers, name="leak demo") as rec:
                with rounds(name="epoch", threshold=1 << 30, reader=lambda: STATE.allocated) as r:
                    for ep in range(3):
                        for i in range(5):
                            x = FakeTensor((64, 1024))
                            total += x.matmul(w).sum()
                            rec.step()
                        r.step()
                raise OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        except OutOfMemoryError:
            pass
        print("OK")
    """)
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert lines[0]["type"] == "meta" and lines[0]["series"] == ["driver_used", "in_use", "reserved"]
    marks = [ln for ln in lines if ln["type"] == "mark"]
    assert [m["kind"] for m in marks].count("round") == 3 and marks[-1]["kind"] == "oom"
    peak = [ln for ln in lines if ln["type"] == "holders"]
    assert len(peak) == 1 and peak[0]["rows"] and peak[0]["rows"][0]["chain"]
    r = subprocess.run([sys.executable, "-m", "gpuguard.diagnostics.plot", str(path), "-o", str(out), "--x", "step"],
                       capture_output=True, text=True, cwd=PKG, timeout=60)
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    svg = _svg(page)
    ns = "{http://www.w3.org/2000/svg}"
    series = {p.get("data-series") for p in svg.iter(ns + "path")}
    assert series == {"in_use", "reserved", "driver_used"}, series
    for p in svg.iter(ns + "path"):
        assert len(re.findall(r"[ML]", p.get("d"))) == sum(1 for ln in lines if ln["type"] == "sample")
    groups = [g.get("class") for g in svg.iter(ns + "g")]
    assert groups.count("mark round-mark") == 3 and groups.count("mark oom-mark") == 1
    assert "peak-mark" in groups
    assert "Top holders at the peak" in page and "total.grad_fn" in page and "out-of-memory" in page


def test_plot_refuses_a_file_without_samples(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"type": "meta"}\n')
    r = subprocess.run([sys.executable, "-m", "gpuguard.diagnostics.plot", str(bad), "-o", str(tmp_path / "o.html")],
                       capture_output=True, text=True, cwd=PKG, timeout=60)
    assert r.returncode == 1 and "no samples" in r.stderr


@pytest.mark.parametrize("text,value", [("64M", 64 << 20), ("1.5G", 3 << 29), ("512MiB", 512 << 20),
                                        ("4096", 4096), ("2k", 2048)])
def test_parse_size(text, value):
    sys.path.insert(0, PKG)
    from gpuguard.diagnostics.notebook import parse_size
    assert parse_size(text) == value


def test_plot_draws_a_series_that_joined_late():
    # PyTorch's counters join a recording once PyTorch initialises CUDA: absent from the meta record
    sys.path.insert(0, PKG)
    from gpuguard.diagnostics.plot import render_html
    data = {"meta": {"series": ["driver_used"]}, "marks": [], "holders": [],
            "samples": [{"t": 0, "step": 0, "driver_used": 5 << 20},
                        {"t": 1, "step": 1, "driver_used": 9 << 20, "in_use": 3 << 20, "reserved": None},
                        {"t": 2, "step": 2, "driver_used": 9 << 20, "in_use": 4 << 20, "reserved": None}]}
    svg = _svg(render_html(data))
    ns = "{http://www.w3.org/2000/svg}"
    paths = {p.get("data-series"): p.get("d") for p in svg.iter(ns + "path")}
    assert set(paths) == {"in_use", "driver_used"}  # reserved never had a value
    assert paths["in_use"].count("M") == 1 and paths["in_use"].count("L") == 1
