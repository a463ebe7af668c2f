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
                # Freed from a side stream that still runs: the host does not wait for it; the arena's
                # stream (the legacy one) is made to wait for it on the device instead.
                with s:
                    w = cupy.full(16 << 20, 5.0, dtype=cupy.float32)
                    m = cupy.ones((4096, 4096), dtype=cupy.float32)
                    for _ in range(30):
                        m2 = m @ m  # tens of ms of work on s
                    v = w * 1.0
                del w, m, m2
                assert not s.done, "the free waited for the side stream on the host"
                assert not cupy.cuda.Stream.null.done, "the arena's stream does not wait for the side stream"
                s.synchronize()
                assert float(v.min()) == 5.0 and float(v.max()) == 5.0
                del v
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


CUPY_STUB = '''
import types
class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes).")
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id): self.ptr, self.size, self.owner = ptr, size, owner
class MemoryPointer:
    def __init__(self, mem, offset): self.mem, self.ptr = mem, mem.ptr + offset
class _Stream:
    ptr = 0
    def synchronize(self): pass
_allocator = [None]
cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory, get_current_stream=lambda: _Stream(),
    get_allocator=lambda: _allocator[0], set_allocator=lambda f: _allocator.__setitem__(0, f))
'''


def test_cupy_out_of_memory_is_cupys_own_error(tmp_path):
    # Against a stand-in cupy package (host backend): an allocation the arena cannot hold raises CuPy's
    # OutOfMemoryError (what code written for CuPy's pool catches) carrying the arena's detail.
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(CUPY_STUB)
    src = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {PKG!r}]
        import cupy, gpuguard, gpuguard.cupy as ggc
        arena = gpuguard.Arena(capacity=64 << 20, backend="host")
        with ggc.use_arena(arena):
            malloc = cupy.cuda.get_allocator()
            ok = malloc(1 << 20)
            try:
                malloc(1 << 30)
                raise SystemExit("no error")
            except cupy.cuda.memory.OutOfMemoryError as e:
                assert isinstance(e, MemoryError)
                assert "1,073,741,824 bytes" in str(e) and "gpuguard arena" in str(e) and "capacity" in str(e), e
            assert arena.stats()["bytes_in_use"] == 1 << 20
            del ok
        assert arena.stats()["bytes_in_use"] == 0
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
