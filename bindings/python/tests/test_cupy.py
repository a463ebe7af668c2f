"""CuPy drawing from an arena: skipped (with the reason) without cupy or a CUDA device."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))


def test_import_without_cupy_says_what_is_missing():
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed here, so `import gpuguard.cupy` succeeds")
    with pytest.raises(ImportError, match="gpuguard.cupy needs CuPy"):
        import gpuguard.cupy  # noqa: F401


def test_cupy_allocations_come_from_the_arena_and_go_back():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as e:  # no driver at all
        pytest.skip(f"no CUDA device: {e}")
    src = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {PKG!r})
        import cupy, gpuguard, gpuguard.cupy as ggc
        MiB = 1 << 20
        previous = cupy.cuda.get_allocator()
        with gpuguard.Arena(capacity=4 << 30) as arena:
            with ggc.use_arena(arena):
                x = cupy.arange(1 << 20, dtype=cupy.float32)
                y = (x * 2).sum()
                assert float(y) == float((1 << 20) * ((1 << 20) - 1)), y
                assert arena.stats()["bytes_in_use"] >= 4 * MiB
                assert all(b["tag"] == "cupy" for b in arena.blocks())
                s = cupy.cuda.Stream(non_blocking=True)
                with s:
                    z = cupy.ones(1 << 20, dtype=cupy.float32)
                del x, y, z
                assert arena.stats()["n_live"] == 0, arena.blocks()
                e = cupy.empty(0)
            assert cupy.cuda.get_allocator() is previous
            arena.trim()
            assert arena.stats()["bytes_mapped"] == 0
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GPUGUARD_BACKEND="cuda"))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
