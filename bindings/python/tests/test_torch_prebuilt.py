"""The prebuilt PyTorch backends (issue 44 item 1): the wheel that scripts/test.sh builds carries one per
PyTorch version of ``_native.PREBUILT`` (GPUGUARD_TEST_PREBUILT=1 says it must), and gpuguard.torch picks
the one of the running PyTorch's major.minor and CUDA major with no compiler on PATH, no CXX and an empty
cache; another version says in one line that it builds; an older PyTorch runs on its own allocator. A
stand-in ``torch`` module gives the version (as in test_torch_stub.py): nothing here needs PyTorch."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

PKG = os.path.dirname(os.path.dirname(os.path.realpath(importlib.util.find_spec("gpuguard").origin)))
PREBUILT_DIR = os.path.join(PKG, "gpuguard", "torch", "prebuilt")
MUST_CARRY = os.environ.get("GPUGUARD_TEST_PREBUILT") == "1"

STUB = '''
__version__ = {version!r}
class version:
    cuda = {cuda!r}
class _Cuda:
    def is_initialized(self): return False
    def get_allocator_backend(self): return "native"
class _C:
    _GLIBCXX_USE_CXX11_ABI = 1
cuda = _Cuda()
'''


def stand_in(tmp_path, version, cuda, headers=False):
    d = tmp_path / "stub" / "torch"
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(STUB.format(version=version, cuda=cuda))
    if headers:  # enough for the first-use build to start (and fail at the compiler)
        (d / "include" / "c10" / "cuda").mkdir(parents=True)
        (d / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").write_text("")
        (tmp_path / "cuda" / "include").mkdir(parents=True)
        (tmp_path / "cuda" / "include" / "cuda_runtime_api.h").write_text("")
    return str(d.parent)


def run(tmp_path, stub, body, **env):
    """body in a fresh interpreter with the stand-in torch first on sys.path, no compiler to be found
    (PATH without one, CXX unset) and an empty cache, unless env says otherwise."""
    src = f"import sys\nsys.path[:0] = [{stub!r}, {PKG!r}]\n" + textwrap.dedent(body)
    base = {k: v for k, v in os.environ.items() if k not in ("CXX", "GPUGUARD_TORCH", "GPUGUARD_TORCH_OPTIONS")}
    (tmp_path / "bin").mkdir(exist_ok=True)
    base.update(PATH=str(tmp_path / "bin"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    base.update(env)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=60, env=base)


def test_the_wheel_carries_a_prebuilt_backend_per_version(tmp_path):
    have = sorted(os.listdir(PREBUILT_DIR)) if os.path.isdir(PREBUILT_DIR) else []
    if not MUST_CARRY and not have:
        pytest.skip("this gpuguard was built without prebuilt backends (GPUGUARD_TEST_PREBUILT=1 requires them)")
    want = {"2.8": 12, "2.9": 12, "2.10": 12, "2.11": 13}  # the CUDA major of each version's wheel on PyPI
    r = run(tmp_path, stand_in(tmp_path, "2.11.0", "13.0"), "from gpuguard.torch import _native\nprint(*_native.PREBUILT)")
    assert r.stdout.split() == list(want), r.stdout + r.stderr
    assert have == sorted(f"libgpuguard_torch-{v}-cu{c}.so" for v, c in want.items())
    for name in have:
        with open(os.path.join(PREBUILT_DIR, name), "rb") as f:
            assert f.read(4) == b"\x7fELF", name


@pytest.mark.parametrize("version, cuda, name", [
    ("2.11.0+cu130", "13.0", "libgpuguard_torch-2.11-cu13.so"),
    ("2.10.0", "12.8", "libgpuguard_torch-2.10-cu12.so"),
    ("2.9.1+cu126", "12.6", "libgpuguard_torch-2.9-cu12.so"),
    ("2.8.0+cu128", "12.8", "libgpuguard_torch-2.8-cu12.so"),
])
def test_the_running_pytorchs_backend_is_loaded_without_a_compiler(tmp_path, version, cuda, name):
    if not os.path.exists(os.path.join(PREBUILT_DIR, name)):
        if MUST_CARRY:
            pytest.fail(f"the wheel lacks {name}")
        pytest.skip("this gpuguard was built without prebuilt backends")
    # Without PyTorch's libraries the load itself fails: at the prebuilt file, never at a build.
    r = run(tmp_path, stand_in(tmp_path, version, cuda), """
        import torch
        from gpuguard.torch import _native
        print(_native.prebuilt(torch))
        try:
            _native.load(torch)
        except _native.NativeUnavailable as e:
            print(e)
    """)
    out = r.stdout.splitlines()
    assert r.returncode == 0 and out[0] == os.path.join(PREBUILT_DIR, name), r.stdout + r.stderr
    assert f"loading {out[0]} failed" in out[1] and "libc10" in out[1], r.stdout
    assert "building" not in r.stderr and not (tmp_path / "cache" / "gpuguard").exists(), r.stderr


@pytest.mark.parametrize("version, cuda", [("2.12.0", "13.0"), ("2.11.0", "12.8"), ("2.9.0+cu130", "13.0")])
def test_a_version_without_a_prebuilt_backend_says_it_builds_in_one_line(tmp_path, version, cuda):
    stub = stand_in(tmp_path, version, cuda, headers=True)
    body = """
        import torch
        from gpuguard.torch import _native
        assert _native.prebuilt(torch) is None
        try:
            _native.load(torch)
        except _native.NativeUnavailable as e:
            print(e)
    """
    r = run(tmp_path, stub, body)  # no compiler: says so, with why no prebuilt one serves
    assert r.returncode == 0 and f"no prebuilt backend for PyTorch {version} with CUDA {cuda}" in r.stdout, \
        r.stdout + r.stderr
    assert "a C++ compiler" in r.stdout and r.stderr == "", r.stdout + r.stderr
    # A compiler that fails: the build starts with one line, then says why it failed.
    r = run(tmp_path, stub, body, CXX="/bin/false", CUDA_HOME=str(tmp_path / "cuda"))
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpuguard: no prebuilt backend for PyTorch {version}"), r.stderr
    assert "building it for this PyTorch once" in lines[0] and "building the PyTorch backend failed" in r.stdout


def test_an_older_pytorch_runs_on_its_own_allocator_with_one_line(tmp_path):
    r = run(tmp_path, stand_in(tmp_path, "2.7.1+cu126", "12.6"), """
        import os, torch
        from gpuguard import _autostart
        from gpuguard.torch import backend
        os.environ["GPUGUARD_TORCH"] = "1"  # set here, so that the wheel's .pth line stays out of it
        _autostart.run()
        assert backend() == "native", backend()
        print("script ran")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "script ran", r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "2.7.1" in lines[0] and "own allocator" in lines[0], r.stderr
