"""gpuguard.torch against a stand-in `torch` package (host backend, no GPU, no PyTorch headers): the
refusals of use_arena and mem_pool happen before anything is installed and say why — an arena without
stream tracking, a PyTorch whose allocator is initialised already, a PyTorch the native backend cannot
serve — and the per-arena statistics and the removed ``backend=plugin`` option behave as documented. The
real thing runs on a GPU in test_torch_native.py."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))

STUB = '''
__version__ = "2.11.0"
class _Cuda:
    initialized = False
    def is_initialized(self): return self.initialized
    def get_allocator_backend(self): return "native"
    def synchronize(self, device=None): CALLS.append("synchronize")
    def empty_cache(self): CALLS.append("empty_cache")
class _C:
    _GLIBCXX_USE_CXX11_ABI = 1
CALLS = []
cuda = _Cuda()
'''


@pytest.fixture
def stub_path(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STUB)
    return tmp_path


def run(stub_path, body, env=None):
    src = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(stub_path)!r}, {PKG!r}]
        import torch, gpuguard, gpuguard.torch as ggt
    """) + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return r


def test_use_arena_refuses_an_arena_without_stream_tracking(stub_path):
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20, flags=0x1)   # GG_ARENA_NO_STREAM
        for call in (ggt.use_arena, lambda a: ggt.mem_pool(a).__enter__()):
            try:
                call(arena)
                raise SystemExit("accepted")
            except gpuguard.InvalidArgumentError as e:
                assert "NO_STREAM" in str(e) and "illegal memory access" in str(e)
        assert torch.CALLS == [], torch.CALLS      # nothing installed
        print("OK")
    """)


def test_use_arena_after_cuda_init_says_the_backend_cannot_be_installed(stub_path):
    run(stub_path, """
        torch.cuda.initialized = True
        arena = gpuguard.Arena(capacity=64 << 20)
        for call in (ggt.use_arena, lambda a: ggt.mem_pool(a).__enter__()):
            try:
                call(arena)
                raise SystemExit("accepted")
            except gpuguard.StateError as e:
                assert "already initialised" in str(e) and "GPUGUARD_TORCH=1" in str(e), e
        print("OK")
    """)


def test_use_arena_on_a_pytorch_the_backend_cannot_serve_says_why(stub_path):
    # The stand-in has no headers to build the backend against; an old one is refused by version.
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20)
        try:
            ggt.use_arena(arena)
            raise SystemExit("accepted")
        except gpuguard.StateError as e:
            assert "cannot serve this PyTorch" in str(e) and "headers" in str(e), e
        from gpuguard.torch import _native
        _native._loaded = None
        torch.__version__ = "2.5.1"
        try:
            with ggt.mem_pool(arena):
                pass
            raise SystemExit("accepted")
        except gpuguard.StateError as e:
            assert "2.5.1" in str(e) and "2.8 and later" in str(e), e
        assert ggt.backend() == "native"   # PyTorch's own, untouched
        print("OK")
    """)


def test_memory_stats_of_an_arena_use_pytorchs_names(stub_path):
    run(stub_path, """
        arena = gpuguard.Arena(capacity=64 << 20)
        p = arena.alloc(4096)
        s = ggt.memory_stats(arena)
        assert s["allocated_bytes.all.current"] == 4096 and s["active.all.current"] == 1
        assert s["reserved_bytes.all.current"] >= 4096 and "gpuguard.fragmentation" in s
        assert not [k for k in s if "plugin" in k]
        arena.free(p)
        print("OK")
    """)


def test_backend_plugin_option_is_gone_with_one_line(capsys):
    from gpuguard import _autostart
    cfg = _autostart.parse("1", "backend=plugin,capacity=1G")
    assert cfg["backend"] == "native" and cfg["capacity"] == 1 << 30
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "backend=plugin is gone" in err and "native backend" in err
    with pytest.raises(_autostart.ConfigError):
        _autostart.parse("1", "backend=bogus")
