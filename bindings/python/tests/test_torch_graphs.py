"""CUDA graphs under ``gpuguard.torch.use_arena`` (PyTorch's global pluggable allocator): capture and
replay give eager results, memory a live graph uses is never handed to another tensor (a long kernel of
the graph writes it while the user frees the graph's output and allocates more), the memory comes back
once the graph is deleted, and ``torch.compile(mode="reduce-overhead")`` matches eager. Needs torch and a
CUDA device (skipped, with the reason, without them); each case runs in its own interpreter, since
PyTorch's global allocator can be chosen only once per process, before CUDA is initialised."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))

# Reads gg_plugin_graph_stats (include/gpuguard/plugin.h) straight from the library.
PRELUDE = f"""
import ctypes, gc, os, sys, time
sys.path.insert(0, {PKG!r})
import torch
import gpuguard, gpuguard.torch as ggt
from gpuguard import _lib
MiB = 1 << 20

class GraphStats(ctypes.Structure):
    _fields_ = [("bytes_in_use", ctypes.c_size_t), ("bytes_mapped", ctypes.c_size_t),
                ("n_pools", ctypes.c_ulonglong), ("n_blocks_held", ctypes.c_ulonglong),
                ("bytes_held", ctypes.c_size_t), ("n_captures", ctypes.c_ulonglong),
                ("n_unowned", ctypes.c_ulonglong), ("n_deferred", ctypes.c_ulonglong),
                ("n_stream_waits", ctypes.c_ulonglong), ("reserved_", ctypes.c_ulonglong * 8)]

LIB = ctypes.CDLL(_lib.path)

def gstats():
    s = GraphStats()
    assert LIB.gg_plugin_graph_stats(0, ctypes.byref(s)) == 0
    return s

def overlaps(t, ranges):
    lo = t.data_ptr(); hi = lo + t.untyped_storage().nbytes()
    return any(lo < b and a < hi for a, b in ranges)

def span(t):
    return (t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes())
"""


@pytest.fixture(scope="module")
def cuda_torch():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False: no CUDA device")
    return torch


def run(body: str, timeout: int = 300) -> str:
    """Runs body in a fresh interpreter on the CUDA backend; it prints OK last, or SKIP: why."""
    env = dict(os.environ, GPUGUARD_BACKEND="cuda")
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    out = r.stdout.strip()
    if r.returncode == 0 and out.splitlines() and out.splitlines()[-1].startswith("SKIP:"):
        pytest.skip(out.splitlines()[-1][5:].strip())
    assert r.returncode == 0 and out.endswith("OK"), r.stdout + r.stderr
    return r.stdout


def test_capture_replay_keeps_graph_memory_and_gives_it_back(cuda_torch):
    run("""
        arena = gpuguard.Arena(capacity=16 << 30, name="torch-graphs")
        ggt.use_arena(arena)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).cuda()
        static_x = torch.randn(64, 256, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                      # warm-up on the capture stream: cuBLAS's
            for _ in range(3):                             # workspace for it is made outside the capture
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

        # 1. Capture and replay give the eager result; nothing invalidated the capture.
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            static_y = model(static_x)
        for _ in range(5):
            x = torch.randn(64, 256, device="cuda")
            static_x.copy_(x)
            g.replay()
            torch.testing.assert_close(static_y, model(x))
        s = gstats()
        assert s.n_captures >= 1 and s.n_pools >= 1 and s.bytes_in_use > 0, (s.n_captures, s.n_pools)

        # 2. A graph whose replay sleeps, then writes a temporary and two outputs. While it runs on a side
        #    stream, the user drops one output and allocates (outside any capture and in a new capture):
        #    no new tensor may alias the graph's blocks, and none is overwritten by the replay.
        a_in = torch.ones(1 << 20, device="cuda")
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, stream=side):
            torch.cuda._sleep(int(2e8))
            tmp = a_in * 2
            held = [span(tmp)]
            out_keep = tmp + 1
            out_drop = tmp + 5
            del tmp
        held += [span(out_keep), span(out_drop)]
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            g2.replay()
        del out_drop                                       # the replay still writes it
        fresh = [torch.empty(n, device="cuda") for n in [1 << 20] * 16 + [1 << 18, 1 << 22, (1 << 20) + 7]]
        for t in fresh:
            t.fill_(7.0)
        bad = [t.data_ptr() for t in fresh if overlaps(t, held)]
        assert not bad, ("aliases a live graph's block", bad, held)
        g3 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g3, stream=side):            # another capture, while g2 lives
            inner = [a_in * 3 for _ in range(8)]
        bad = [t.data_ptr() for t in inner if overlaps(t, held)]
        assert not bad, ("a new capture got a live graph's block", bad, held)
        torch.cuda.synchronize()
        assert bool((out_keep == 3).all()), "the replay's output is wrong"
        for t in fresh:
            assert bool((t == 7).all()), "a fresh tensor was overwritten by the replay"

        # 3. Graphs deleted: their memory comes back (the driver marks the graphs dead on its own thread;
        #    the next plugin call or stats read gives it back).
        del g, g2, g3, static_y, out_keep, inner, fresh
        gc.collect()
        torch.cuda.synchronize()
        deadline = time.time() + 20
        while True:
            torch.empty(256, device="cuda")                  # a plugin call
            s = gstats()
            if s.n_pools == 0 and s.bytes_in_use == 0:
                break
            assert time.time() < deadline, ("graph memory not back", s.n_pools, s.n_blocks_held, s.bytes_in_use)
            time.sleep(0.05)
        released = ctypes.c_size_t()
        assert LIB.gg_plugin_trim(0, ctypes.c_size_t(0), ctypes.byref(released)) == 0
        assert gstats().bytes_mapped == 0 and released.value > 0, released.value
        print("captures", gstats().n_captures, "released", released.value)
        print("OK")
    """)


def test_compile_reduce_overhead_matches_eager(cuda_torch):
    run("""
        if not hasattr(torch, "compile"):
            print("SKIP: this torch has no torch.compile"); sys.exit(0)
        arena = gpuguard.Arena(capacity=16 << 30, name="torch-compile")
        ggt.use_arena(arena)            # before has_triton(), which initialises CUDA
        try:
            from torch.utils._triton import has_triton
            if not has_triton():
                print("SKIP: torch.compile needs Triton, which is not usable here"); sys.exit(0)
        except ImportError:
            pass
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda()
        f = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(6):                             # the first calls record, later ones replay
                x = torch.randn(32, 128, device="cuda")
                y = f(x).clone()
                torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-4)
        s = gstats()
        assert s.n_captures >= 1, "reduce-overhead captured nothing through the plugin"
        print("captures", s.n_captures)
        print("OK")
    """, timeout=900)
