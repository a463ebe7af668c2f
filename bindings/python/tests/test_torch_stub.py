"""gpuguard.torch against a stand-in `torch` package (host backend, no GPU): proves the module calls
PyTorch's allocator API in the documented order — the plugin library's path and symbol names, the
initialised-allocator refusal turned into StateError, MemPool + use_mem_pool + empty_cache — and that
the plugin really serves the stand-in's allocations from the arena. The real thing runs in test_torch.py."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))

STUB = '''
import ctypes, types
class _Cuda:
    initialized = False
    def is_initialized(self): return self.initialized
    def synchronize(self, device=None): CALLS.append("synchronize")
    def empty_cache(self):
        CALLS.append("empty_cache")
        while FREEABLE:               # PyTorch frees a deleted pool's segments at empty_cache
            lib, p = FREEABLE.pop()
            lib.gg_torch_free(p, 0, 0, None)
class CUDAPluggableAllocator:
    def __init__(self, path, alloc_name, free_name):
        CALLS.append(("CUDAPluggableAllocator", alloc_name, free_name))
        self.lib = ctypes.CDLL(path)
        self.lib.gg_torch_alloc.restype = ctypes.c_void_p
        self.lib.gg_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.lib.gg_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    def allocator(self): return self
def change_current_allocator(a):
    if cuda.initialized: raise RuntimeError("Can't swap an already initialized allocator")
    CALLS.append("change_current_allocator")
class MemPool:
    def __init__(self, allocator):
        self.alloc, self.blocks = allocator, []
    def __del__(self): FREEABLE.extend((self.alloc.lib, p) for p in self.blocks)
class use_mem_pool:
    def __init__(self, pool, device=None): self.pool = pool
    def __enter__(self):
        CALLS.append("use_mem_pool")
        self.pool.blocks.append(self.pool.alloc.lib.gg_torch_alloc(2 << 20, 0, None))  # one segment
    def __exit__(self, *e): pass
CALLS, FREEABLE = [], []
_C = types.SimpleNamespace(_cuda_clearCublasWorkspaces=lambda: CALLS.append("clear_cublas_workspaces"))
cuda = _Cuda()
cuda.memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                    change_current_allocator=change_current_allocator)
cuda.MemPool, cuda.use_mem_pool = MemPool, use_mem_pool
def device(kind, index): return (kind, index)
'''


@pytest.fixture
def stub_path(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STUB)
    return tmp_path


def run(stub_path, body, stderr_clean=False):
    src = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(stub_path)!r}, {PKG!r}]
        import torch, gpuguard, gpuguard.torch as ggt
        from gpuguard import _lib
    """) + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    if stderr_clean:
        assert "gpuguard" not in r.stderr, r.stderr


def test_use_arena_installs_the_plugin_and_refuses_after_init(stub_path):
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20)
        ggt.use_arena(arena)
        assert torch.CALLS == [("CUDAPluggableAllocator", "gg_torch_alloc", "gg_torch_free"),
                               "change_current_allocator"], torch.CALLS
        p = ggt.pluggable_allocator().lib.gg_torch_alloc(1 << 20, 0, None)
        assert arena.stats()["bytes_in_use"] == 1 << 20
        ggt.pluggable_allocator().lib.gg_torch_free(p, 1 << 20, 0, None)
        assert arena.stats()["bytes_in_use"] == 0
        torch.cuda.initialized = True
        try:
            ggt.use_arena(arena)
            raise SystemExit("accepted")
        except gpuguard.StateError as e:
            assert "mem_pool" in str(e)
        other = gpuguard.Arena(capacity=8 << 20)
        try:
            ggt.use_arena(other)
        except gpuguard.StateError:
            pass
        print("OK")
    """)


def test_global_arena_outlives_the_tensors_freed_at_interpreter_exit(stub_path):
    # PyTorch frees its last tensors (cuBLAS workspaces, module globals) after atexit handlers have run:
    # the arena behind the global allocator must still be there then, not destroyed by its finalizer.
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20)
        ggt.use_arena(arena)
        lib = ggt.pluggable_allocator().lib
        class Tensor:
            def __init__(self): self.p = lib.gg_torch_alloc(1 << 20, 0, None)
            def __del__(self): lib.gg_torch_free(self.p, 1 << 20, 0, None)
        import builtins
        builtins._kept_tensor = Tensor()   # freed at interpreter teardown, after atexit
        del arena
        print("OK")
    """, stderr_clean=True)


def test_mem_pool_region_returns_its_segments_and_trim(stub_path):
    run(stub_path, """
        torch.cuda.initialized = True
        arena = gpuguard.Arena(capacity=64 << 20, chunk_size=4 << 20)
        with ggt.mem_pool(arena) as a:
            assert a is arena and arena.stats()["bytes_in_use"] == 2 << 20
        assert "use_mem_pool" in torch.CALLS and torch.CALLS[-1] == "empty_cache"
        assert arena.stats()["bytes_in_use"] == 0 and arena.stats()["bytes_mapped"] == 4 << 20
        assert ggt.memory_stats(arena)["reserved_bytes.all.peak"] == 4 << 20
        assert ggt.trim(arena) == 4 << 20
        assert "synchronize" in torch.CALLS
        other = gpuguard.Arena(capacity=8 << 20)
        try:
            with ggt.mem_pool(other):
                raise SystemExit("two arenas on one device")
        except gpuguard.StateError as e:
            assert "one arena per device" in str(e)
        arena.close()
        with ggt.mem_pool(other):       # the closed arena unregistered itself
            pass
        print("OK")
    """)
