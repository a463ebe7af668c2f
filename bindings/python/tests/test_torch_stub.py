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
        self.alloc, self.free = getattr(self.lib, alloc_name), getattr(self.lib, free_name)
        self.alloc.restype = ctypes.c_void_p
        self.alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.lib.gg_torch_alloc, self.lib.gg_torch_free = self.alloc, self.free
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
def _unsupported(*a): raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats")
_C = types.SimpleNamespace(_cuda_clearCublasWorkspaces=lambda: CALLS.append("clear_cublas_workspaces"),
                           _cuda_memoryStats=_unsupported, _cuda_resetPeakMemoryStats=_unsupported,
                           _cuda_resetAccumulatedMemoryStats=_unsupported, _cuda_emptyCache=lambda: None,
                           _cuda_checkPoolLiveAllocations=_unsupported)
class _Device:
    def __init__(self, kind): self.type = kind
class Tensor:
    """A stand-in tensor: picklable on the CPU; PyTorch's reducer (below) shares it."""
    def __init__(self, kind="cpu", data=b"x"): self.device, self.data = _Device(kind), data
    @property
    def is_cuda(self): return self.device.type == "cuda"
    def record_stream(self, stream): CALLS.append("record_stream")
class UntypedStorage(Tensor): pass
class TypedStorage(Tensor): pass
import sys as _sys
multiprocessing = types.ModuleType("torch.multiprocessing")
def _reduce_tensor(t): return (Tensor, (t.device.type, t.data))
_reduce_tensor.__module__ = "torch.multiprocessing.reductions"
from multiprocessing.reduction import ForkingPickler as _FP
_FP.register(Tensor, _reduce_tensor)
_sys.modules["torch.multiprocessing"] = multiprocessing
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
        # the generic C++ entry point beside the library (no PyTorch headers in the stand-in)
        assert torch.CALLS == [("CUDAPluggableAllocator", "gg_torch_malloc", "gg_torch_mfree"),
                               "change_current_allocator"], torch.CALLS
        assert ggt.shim_kind() == "RuntimeError"
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


def test_memory_api_answers_from_the_arena(stub_path):
    # torch.cuda.memory_allocated() & co. reach the allocator through torch._C functions that raise under a
    # pluggable allocator: use_arena replaces them with the arena's and the plugin's figures.
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20, chunk_size=2 << 20)
        ggt.use_arena(arena)
        lib = ggt.pluggable_allocator().lib
        a = lib.gg_torch_alloc(3 << 20, 0, None)
        b = lib.gg_torch_alloc(1000, 0, None)
        s = torch._C._cuda_memoryStats(0)
        assert s["allocated_bytes"]["all"]["current"] == (3 << 20) + 1024, s["allocated_bytes"]
        assert s["requested_bytes"]["all"]["current"] == (3 << 20) + 1000
        assert s["allocated_bytes"]["small_pool"]["current"] == 1024
        assert s["allocation"]["all"]["current"] == 2 and s["active"]["large_pool"]["current"] == 1
        assert s["reserved_bytes"]["all"]["current"] == arena.stats()["bytes_mapped"] == 4 << 20
        lib.gg_torch_free(a, 3 << 20, 0, None)
        s = torch._C._cuda_memoryStats(0)
        assert s["allocated_bytes"]["all"]["current"] == 1024
        assert s["allocated_bytes"]["all"]["peak"] == (3 << 20) + 1024
        assert s["allocated_bytes"]["all"]["freed"] == 3 << 20
        torch._C._cuda_resetPeakMemoryStats(0)
        s = torch._C._cuda_memoryStats(0)
        assert s["allocated_bytes"]["all"]["peak"] == 1024, s["allocated_bytes"]["all"]
        assert s["reserved_bytes"]["all"]["peak"] == arena.stats()["bytes_mapped"]
        torch._C._cuda_resetAccumulatedMemoryStats(0)
        assert torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["allocated"] == 0
        torch._C._cuda_emptyCache()          # torch.cuda.empty_cache(): the arena gives free chunks back
        assert arena.stats()["bytes_mapped"] == 2 << 20, arena.stats()["bytes_mapped"]
        lib.gg_torch_free(b, 1000, 0, None)
        torch._C._cuda_emptyCache()
        assert arena.stats()["bytes_mapped"] == 0
        assert torch._C._cuda_checkPoolLiveAllocations(0, (0, 1), set()) is True
        print("OK")
    """)


def test_use_arena_refuses_an_arena_without_stream_tracking(stub_path):
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20, flags=0x1)   # GG_ARENA_NO_STREAM
        try:
            ggt.use_arena(arena)
            raise SystemExit("accepted")
        except gpuguard.InvalidArgumentError as e:
            assert "NO_STREAM" in str(e) and "illegal memory access" in str(e)
        assert torch.CALLS == [], torch.CALLS      # nothing installed
        print("OK")
    """)


def test_sending_a_cuda_tensor_fails_at_once_in_the_sender(stub_path):
    # A queue pickles in a feeder thread: an error there is printed while the receiver waits forever. Under
    # use_arena, put() itself raises for a CUDA tensor; CPU tensors still go through PyTorch's reducer.
    run(stub_path, """
        import multiprocessing as mp
        arena = gpuguard.Arena(capacity=64 << 20)
        ggt.use_arena(arena)
        q = mp.get_context("spawn").Queue()
        try:
            q.put({"batch": [torch.Tensor("cuda")]})
            raise SystemExit("accepted")
        except RuntimeError as e:
            assert "no CUDA IPC handle" in str(e) and "t.cpu()" in str(e), e
        q.put([torch.Tensor("cpu", b"abc")])
        got = q.get(timeout=10)
        assert got[0].data == b"abc" and got[0].device.type == "cpu"
        from multiprocessing.reduction import ForkingPickler
        try:
            ForkingPickler.dumps(torch.Tensor("cuda"))   # a pipe or SimpleQueue pickles in the caller
            raise SystemExit("pickled")
        except RuntimeError as e:
            assert "no CUDA IPC handle" in str(e)
        print("OK")
    """)


def test_mem_pool_arena_outlives_segments_freed_at_interpreter_exit(stub_path):
    # PyTorch frees a dead pool's cached segments as late as its own exit: the arena behind mem_pool must
    # still be there (no "no arena is registered" lines on stderr).
    run(stub_path, """
        torch.cuda.initialized = True
        arena = gpuguard.Arena(capacity=64 << 20)
        with ggt.mem_pool(arena, empty_cache=False):
            pass
        lib = torch.FREEABLE[0][0] if torch.FREEABLE else None
        assert lib is not None and arena.stats()["bytes_in_use"] == 2 << 20
        class Late:
            def __del__(self): torch.cuda.empty_cache()   # PyTorch's teardown frees the segment now
        import builtins
        builtins._late = Late()
        del arena
        print("OK")
    """, stderr_clean=True)
