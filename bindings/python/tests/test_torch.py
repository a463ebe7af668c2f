"""PyTorch drawing from an arena. Everything but the import check needs torch and a CUDA device and is
skipped (with the reason) without them; on a GPU machine each case runs in its own interpreter, because
PyTorch's global allocator can be chosen only once per process, before CUDA is initialised."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_import_without_torch_says_what_is_missing():
    if HAVE_TORCH:
        pytest.skip("torch is installed here, so `import gpuguard.torch` succeeds")
    with pytest.raises(ImportError, match="gpuguard.torch needs PyTorch"):
        import gpuguard.torch  # noqa: F401


@pytest.fixture(scope="module")
def cuda_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False: no CUDA device")
    return torch


def run(body: str, timeout: int = 300) -> str:
    """Runs body in a fresh interpreter on the CUDA backend; it must print OK last."""
    src = textwrap.dedent(f"""
        import gc, os, sys
        sys.path.insert(0, {PKG!r})
        import torch
        import gpuguard, gpuguard.torch as ggt
        MiB = 1 << 20
    """) + textwrap.dedent(body)
    env = dict(os.environ, GPUGUARD_BACKEND="cuda")
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return r.stdout


def test_global_allocator_draws_from_the_arena(cuda_torch):
    run("""
        arena = gpuguard.Arena(capacity=8 << 30, name="torch-global")
        ggt.use_arena(arena)
        x = torch.empty(1 << 20, device="cuda")                # 4 MiB
        assert arena.stats()["bytes_in_use"] >= 4 * MiB, arena.stats()
        assert [b["tag"] for b in arena.blocks()] == ["torch"]
        x.fill_(2.0); y = (x * 3).sum().item()
        assert y == 6.0 * (1 << 20)
        s = ggt.memory_stats(arena)
        assert s["allocated_bytes.all.current"] >= 4 * MiB and s["num_alloc_retries"] == 0
        try:
            torch.cuda.memory_allocated()
            print("memory_allocated works under the pluggable allocator")
        except RuntimeError as e:
            assert "getDeviceStats" in str(e)
        e = torch.empty(0, device="cuda")                     # size 0: no block, no error
        assert e.numel() == 0
        in_use = arena.stats()["bytes_in_use"]
        del x, e
        assert arena.stats()["bytes_in_use"] <= in_use - 4 * MiB, arena.blocks()  # straight back
        try:
            ggt.use_arena(arena)
            raise SystemExit("second use_arena was accepted")
        except gpuguard.StateError as err:
            assert "mem_pool" in str(err)
        print("OK")
    """)


def test_global_allocator_refused_after_cuda_init(cuda_torch):
    run("""
        torch.zeros(1, device="cuda")
        arena = gpuguard.Arena(capacity=1 << 30)
        try:
            ggt.use_arena(arena)
            raise SystemExit("accepted after CUDA init")
        except gpuguard.StateError as e:
            assert "before any CUDA tensor" in str(e) and "mem_pool" in str(e), e
        print("OK")
    """)


def test_side_stream_alloc_and_free_wait(cuda_torch):
    run("""
        arena = gpuguard.Arena(capacity=4 << 30)
        ggt.use_arena(arena)
        before = ggt.plugin_counters(0)["n_stream_syncs"]
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.ones(16 << 20, device="cuda")            # for stream s: waits for the arena's first
            x.mul_(2)
        assert ggt.plugin_counters(0)["n_stream_syncs"] == before + 1
        del x                                                  # freed with stream s: waits for s first
        after = ggt.plugin_counters(0)
        assert after["n_stream_syncs"] == before + 2, after
        y = torch.ones(1 << 20, device="cuda"); del y          # default stream: stream-ordered, no wait
        assert ggt.plugin_counters(0)["n_stream_syncs"] == before + 2
        print("OK")
    """)


def test_mem_pool_after_init_returns_segments_and_trim_gives_memory_back(cuda_torch):
    run("""
        keep_default = torch.ones(1 << 20, device="cuda")      # CUDA initialised; PyTorch's own allocator
        w = keep_default.view(1024, 1024)
        (w @ w).sum().item()   # cuBLAS's workspace now comes from PyTorch's allocator, not from the pool
        arena = gpuguard.Arena(capacity=16 << 30, name="pool")
        with ggt.mem_pool(arena):
            a = torch.randn(4096, 4096, device="cuda")
            b = a @ a
            inside = arena.stats()["bytes_in_use"]
            assert inside >= 2 * 64 * MiB, arena.stats()
            torch.cuda.synchronize()
            del a, b
        assert arena.stats()["bytes_in_use"] == 0, arena.blocks()  # the pool's segments came back
        mapped = arena.stats()["bytes_mapped"]
        assert mapped > 0
        free_before = torch.cuda.mem_get_info()[0]
        returned = ggt.trim(arena)
        free_after = torch.cuda.mem_get_info()[0]
        assert returned == mapped and arena.stats()["bytes_mapped"] == 0
        assert free_after - free_before >= returned - 4 * MiB, (free_before, free_after, returned)
        assert keep_default.sum().item() == float(1 << 20)
        print("OK")
    """)


def test_trim_keeps_live_tensors_elsewhere(cuda_torch):
    run("""
        arena = gpuguard.Arena(capacity=16 << 30, chunk_size=64 * MiB)
        with ggt.mem_pool(arena):
            keep = torch.full((16 << 20,), 7.0, device="cuda")   # 64 MiB that outlives the pool
            big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            big.fill_(1)
            del big
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        returned = ggt.trim(arena)
        free_after = torch.cuda.mem_get_info()[0]
        assert returned >= 1 << 30, (returned, arena.stats())
        assert free_after - free_before >= (1 << 30) - 64 * MiB, (free_before, free_after)
        assert keep.sum().item() == 7.0 * (16 << 20)          # the survivor's memory is intact
        s = ggt.memory_stats(arena)
        assert s["allocated_bytes.all.current"] >= 64 * MiB and s["reserved_bytes.all.peak"] >= 1 << 30
        print("freed to driver:", free_after - free_before)
        print("OK")
    """)


def test_mem_pool_out_of_memory_is_torch_oom(cuda_torch):
    run("""
        torch.zeros(1, device="cuda")
        arena = gpuguard.Arena(capacity=256 * MiB)
        try:
            with ggt.mem_pool(arena):
                torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            raise SystemExit("no OOM")
        except torch.OutOfMemoryError:
            pass
        assert ggt.memory_stats(arena)["num_ooms"] >= 1
        print("OK")
    """)


def test_guard_tears_down_a_torch_run_on_sigterm(cuda_torch, tmp_path):
    log = tmp_path / "log"
    src = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {PKG!r})
        import torch, gpuguard, gpuguard.torch as ggt
        g = gpuguard.Guard()
        arena = gpuguard.Arena(capacity=4 << 30)
        ggt.use_arena(arena)
        x = torch.ones(64 << 20, device="cuda")
        g.on_teardown(lambda: open({str(log)!r}, "a").write("cleanup\\n"))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    """)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPUGUARD_BACKEND="cuda"))
    assert r.returncode == -15, r.stderr
    assert log.read_text().splitlines() == ["cleanup"]
