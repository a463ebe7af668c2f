"""%load_ext gpuguard in a real IPython shell (InteractiveShell, in a child interpreter), and
gpuguard.monitor's sinks: callback, JSON lines, the Prometheus textfile (parsed with prometheus_client,
replaced atomically, a planted symlink not followed) and the HTTP endpoint on 127.0.0.1, stopped by its
guard's teardown."""
import json
import importlib.util
import os
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))
sys.path.insert(0, PKG)


def child(body):
    src = f"import sys\nsys.path[:0] = [{HERE!r}, {PKG!r}]\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return r.stdout


def test_notebook_session():
    pytest.importorskip("IPython")
    out = child("""
        import io, contextlib
        from IPython.core.interactiveshell import InteractiveShell
        import fakecuda
        sh = InteractiveShell.instance(colors="NoColor")
        used = {"v": 100 << 20}
        sh.user_ns["used"] = used
        def cell(code):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                sh.run_cell(code)
            return buf.getvalue()
        cell("%load_ext gpuguard")
        import gpuguard.diagnostics.notebook as nb
        nb._state.read = lambda: {"in_use": fakecuda.STATE.allocated, "used": used["v"], "total": 1 << 30}
        assert "more than 64 MiB" in cell("%gpuguard threshold 64M")
        quiet = cell("from fakecuda import FakeTensor\\nsmall = FakeTensor((256, 256))")
        assert "gpuguard:" not in quiet, quiet                  # below the threshold: nothing
        big = cell("big = FakeTensor((8192, 4096))\\nused['v'] += 128 << 20")
        assert "gpuguard: +128 MiB this cell" in big and "in use 128 MiB" in big, big
        err = cell("def step():\\n    act = FakeTensor((4096, 4096))\\n    raise RuntimeError('boom')\\nstep()")
        assert "gpuguard: +64 MiB" not in err                  # +64 MiB is not more than 64 MiB
        table = cell("%gpuguard holders")
        assert "stored traceback" in table and "act" in table and "notebook variable" in table, table
        assert " big" in table
        trimmed = cell("%gpuguard trim")
        assert "sys.last_traceback" in trimmed and "in use 192 MiB -> 128 MiB" in trimmed, trimmed
        table = cell("%gpuguard holders")
        assert "stored traceback" not in table and " big" in table, table
        assert "every 0.05 s" in cell("%gpuguard watch 0.05")
        watched = cell("import time\\nfor i in range(6):\\n    used['v'] += 1 << 20\\n    time.sleep(0.05)")
        assert "\\rgpuguard: device used" in watched, repr(watched)
        cell("%gpuguard watch off")
        assert "device 0 used" in cell("%gpuguard")
        assert "usage:" in cell("%gpuguard nonsense")
        print("OK")
    """)
    assert "OK" in out


@pytest.fixture
def lib_env():
    if not os.environ.get("GPUGUARD_LIBRARY"):
        pytest.skip("GPUGUARD_LIBRARY is not set")


def test_monitor_sinks_and_guard(tmp_path, lib_env):
    parser = pytest.importorskip("prometheus_client.parser")
    import gpuguard
    prom, log = tmp_path / "gg.prom", tmp_path / "gg.jsonl"
    # a symlink planted where a careless writer would put its temporary file is never followed
    victim = tmp_path / "victim"
    victim.write_text("keep")
    got = []
    with gpuguard.Arena(capacity=64 << 20, name="watched") as arena:
        block = arena.alloc(3 << 20)
        with gpuguard.Guard() as guard:
            mon = gpuguard.monitor(interval=0.02, to=[got.append, str(prom), str(log), "http://127.0.0.1:0"],
                                   guard=guard)
            deadline = time.time() + 20
            while mon.samples < 3 and time.time() < deadline:
                time.sleep(0.01)
            body = urllib.request.urlopen(f"http://127.0.0.1:{mon.port}/metrics", timeout=10).read().decode()
            js = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{mon.port}/json", timeout=10).read())
        assert mon._stop.is_set(), "the guard's teardown stops the monitor"
        n = mon.samples
        time.sleep(0.1)
        assert mon.samples == n and mon.errors == 0, mon.last_error
        block.free()
    assert victim.read_text() == "keep"
    fams = {f.name: f for f in parser.text_string_to_metric_families(prom.read_text())}
    inuse = [s for s in fams["gpuguard_arena_in_use_bytes"].samples if s.labels.get("arena") == "watched"]
    assert inuse and inuse[0].value == 3 << 20
    # No NVML here: the simulated host device is never exported as a GPU; gpuguard_devices says none.
    assert "gpuguard_device_memory_used_bytes" not in fams and fams["gpuguard_devices"].samples[0].value == 0
    assert "gpuguard_arena_in_use_bytes" in body and js["arenas"]
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert len(lines) == n and all("devices" in ln and "time" in ln for ln in lines)
    assert got and any(a["name"] == "watched" and a["bytes_in_use"] == 3 << 20 for a in got[0]["arenas"])
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    with pytest.raises(TypeError):
        gpuguard.monitor(to=42)


def test_monitor_never_initialises_cuda_in_a_child(lib_env):
    # the thread reads through gg_report only: a process that imports gpuguard and monitors has no
    # CUDA context (on the host backend: the backend is never opened for a CUDA device)
    child("""
        import time, gpuguard
        m = gpuguard.monitor(interval=0.01, processes=False)
        time.sleep(0.1)
        m.stop(); m.stop()
        assert m.samples >= 2 and m.errors == 0, m.last_error
        assert "torch" not in sys.modules
        print("OK")
    """)
