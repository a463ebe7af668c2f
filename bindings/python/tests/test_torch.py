"""PyTorch drawing from an arena the caller made (use_arena, mem_pool), on gpuguard's native backend.
Everything but the import check needs torch and a CUDA device and is skipped (with the reason) without
them; on a GPU machine each case runs in its own interpreter, because PyTorch's allocator can be chosen
only once per process, before CUDA is initialised."""
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
        assert len(arena.blocks()) == 1
        x.fill_(2.0); y = (x * 3).sum().item()
        assert y == 6.0 * (1 << 20)
        s = ggt.memory_stats(arena)
        assert s["allocated_bytes.all.current"] >= 4 * MiB and s["num_alloc_retries"] == 0
        assert torch.cuda.memory_allocated() >= 4 * MiB          # PyTorch's own API, the arena's figures
        e = torch.empty(0, device="cuda")                     # size 0: no block, no error
        assert e.numel() == 0
        in_use = arena.stats()["bytes_in_use"]
        del x, e
        assert arena.stats()["bytes_in_use"] <= in_use - 4 * MiB, arena.blocks()  # straight back
        ggt.use_arena(arena)                                  # again: the same one, accepted
        try:
            ggt.use_arena(gpuguard.Arena(capacity=1 << 30))
            raise SystemExit("a second arena was accepted")
        except gpuguard.StateError as err:
            assert "another arena already serves" in str(err), err
        assert ggt.backend() == "gpuguard"
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
            assert "before any CUDA tensor" in str(e) and "already initialised" in str(e), e
        print("OK")
    """)


def test_side_stream_alloc_free_and_record_stream_are_ordered_on_the_device(cuda_torch):
    # Each case hands a block from one stream to another while a long kernel (torch.cuda._sleep) still
    # has the old owner's read queued, then overwrites the block on the new stream. The library makes
    # the new stream wait for the old one on the device (no host-side wait: the arena's own count of
    # host waits stays 0); without that, the overwrite would run during the sleep, before the read.
    run("""
        arena = gpuguard.Arena(capacity=4 << 30)
        ggt.use_arena(arena)
        n, nap = 16 << 20, 200_000_000  # 64 MiB blocks; a sleep of ~0.1 s
        s = torch.cuda.Stream()
        # 1. Freed on the default stream, allocated for a side stream.
        x = torch.full((n,), 3.0, device="cuda")
        torch.cuda._sleep(nap)
        y = x * 1.0                      # reads x after the sleep
        px = x.data_ptr(); del x         # stream-ordered: reusable at once
        with torch.cuda.stream(s):
            z = torch.empty(n, device="cuda")
            assert z.data_ptr() == px    # the same block: the case tests something
            z.fill_(-1.0)
        torch.cuda.synchronize()
        assert y.min().item() == 3.0 and y.max().item() == 3.0, "overwritten before it was read"
        del z
        # 2. Allocated and freed on a side stream, allocated again on the default stream.
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            w = torch.full((n,), 5.0, device="cuda")
            torch.cuda._sleep(nap)
            v = w * 1.0
        pw = w.data_ptr(); del w         # freed with stream s
        u = torch.empty(n, device="cuda")
        assert u.data_ptr() == pw
        u.fill_(-1.0)
        torch.cuda.synchronize()
        assert v.min().item() == 5.0 and v.max().item() == 5.0, "overwritten before it was read"
        del u, v
        # 3. Tensor.record_stream: made on the default stream, read late on s, freed on the default one.
        torch.cuda.synchronize()
        a = torch.full((n,), 7.0, device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(nap)
            b = a * 1.0
        a.record_stream(s)
        pa = a.data_ptr(); del a
        c = torch.empty(n, device="cuda")
        # As PyTorch's own allocator (its test_record_stream): a block recorded on a stream that is
        # still busy is not handed out again until that stream's work is done.
        assert c.data_ptr() != pa
        c.fill_(-1.0)
        torch.cuda.synchronize()
        assert b.min().item() == 7.0 and b.max().item() == 7.0, "overwritten before it was read"
        assert arena.stats()["n_stream_waits"] == 0       # the host never waited
        print("OK")
    """)


def test_mem_pool_after_init_returns_segments_and_trim_gives_memory_back(cuda_torch):
    run("""
        ggt.use_native()
        keep_default = torch.ones(1 << 20, device="cuda")      # CUDA initialised; the backend's own arena
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
        ggt.use_native()
        torch.zeros(1, device="cuda")
        arena = gpuguard.Arena(capacity=256 * MiB)
        try:
            with ggt.mem_pool(arena):
                torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            raise SystemExit("no OOM")
        except torch.OutOfMemoryError:
            pass
        assert torch.cuda.memory_stats()["num_ooms"] >= 1
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


def test_out_of_memory_raises_and_training_goes_on(cuda_torch):
    # Before: a tensor at data_ptr() == 0, and the first kernel on it killed the CUDA context.
    out = run("""
        arena = gpuguard.Arena(capacity=1 << 30, name="small")
        ggt.use_arena(arena)
        x = torch.ones(64 << 20, device="cuda")                  # 256 MiB
        try:
            y = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
            raise SystemExit(f"no exception: data_ptr {y.data_ptr()}")
        except RuntimeError as e:                                 # torch.OutOfMemoryError is one
            msg = str(e)
            kind = ggt.backend()
            assert isinstance(e, torch.OutOfMemoryError), type(e)
            assert "CUDA out of memory." in msg and "2147483648 bytes" in msg and "capacity" in msg, msg
            print("raised", type(e).__name__, "via", kind)
            print("message:", msg.splitlines()[0][:300])
        assert torch.cuda.memory_stats()["num_ooms"] == 1
        z = (x * 2).sum().item()                                  # training goes on
        assert z == 2.0 * (64 << 20)
        print("OK")
    """)
    print(out)


def test_pytorch_memory_api_reports_the_arena(cuda_torch):
    out = run("""
        arena = gpuguard.Arena(capacity=16 << 30, name="api")
        ggt.use_arena(arena)
        a = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(1000, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_allocated() == 256 * MiB + 1024, torch.cuda.memory_allocated()
        assert torch.cuda.memory_reserved() == arena.stats()["bytes_mapped"] >= 256 * MiB
        del a
        assert torch.cuda.memory_allocated() == 1024
        assert torch.cuda.max_memory_allocated() == 256 * MiB + 1024
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 1024
        assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()
        s = torch.cuda.memory_stats()
        assert s["allocation.all.current"] == 1 and s["requested_bytes.all.current"] == 1000
        summary = torch.cuda.memory_summary()
        assert "PyTorch CUDA memory summary" in summary
        free0 = torch.cuda.mem_get_info()[0]
        torch.cuda.empty_cache()                                   # the arena trims: back to the driver
        free1 = torch.cuda.mem_get_info()[0]
        assert arena.stats()["bytes_mapped"] < 16 * MiB and free1 - free0 >= 200 * MiB, (free0, free1)
        print(summary.splitlines()[5])
        print("OK")
    """)
    print(out)


def test_freed_block_is_not_reused_before_another_streams_work_ends(cuda_torch):
    # A block freed while a kernel on a side stream still writes it must not be handed to the default
    # stream before that kernel ends: record_stream's promise, and the backend's for blocks of side streams.
    run("""
        arena = gpuguard.Arena(capacity=8 << 30)
        ggt.use_arena(arena)
        n = 64 * MiB // 4
        s = torch.cuda.Stream()
        for how in ("record_stream", "allocated_on_side_stream"):
            if how == "record_stream":
                x = torch.zeros(n, device="cuda")
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    torch.cuda._sleep(int(3e8))                    # ~0.2 s on the side stream
                    x.fill_(7.0)
                x.record_stream(s)
            else:
                with torch.cuda.stream(s):
                    x = torch.zeros(n, device="cuda")
                    torch.cuda._sleep(int(3e8))
                    x.fill_(7.0)
            p = x.data_ptr()
            del x                                                  # while the side stream still runs
            y = torch.empty(n, device="cuda")
            y.fill_(3.0)
            torch.cuda.synchronize()
            bad = int((y != 3.0).sum().item())
            assert bad == 0, f"{how}: {bad} elements overwritten by the side stream (y at {y.data_ptr()}, x was {p})"
            print(how, "reused:", y.data_ptr() == p)
            del y
        print("OK")
    """)
