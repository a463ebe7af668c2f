"""How the package finds its library: the version check at import, GPUGUARD_LIBRARY as a strict
override, and (GPUGUARD_TEST_INSTALLED=1, from scripts/test.sh) an installed wheel that carries the
library and the `gpuguard` command inside it."""
import os
import shutil
import subprocess
import sys

import pytest

import gpuguard
from gpuguard import _lib

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))
SOURCE_PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "gpuguard"))
INSTALLED = os.environ.get("GPUGUARD_TEST_INSTALLED") == "1"


def run_python(code, **env):
    """Runs code in a fresh interpreter that imports this same gpuguard package."""
    e = dict(os.environ, PYTHONPATH=PKG_PARENT, **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)


def test_version_mismatch_stops_the_import():
    # A package that says 9.9.9 in front of this library: the import must fail and name both versions.
    r = run_python("import sys, types\n"
                   "m = types.ModuleType('gpuguard._version'); m.__version__ = '9.9.9'\n"
                   "sys.modules['gpuguard._version'] = m\n"
                   "import gpuguard\n")
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert f"is version {gpuguard.version()}, but this Python package is 9.9.9" in r.stderr


def test_release_part_of_versions():
    assert _lib._release("0.1.0") == _lib._release("0.1.0.dev3+g1234") == ("0", "1", "0")
    assert _lib._release("0.1.0") != _lib._release("0.2.0")


def test_library_override_wins(tmp_path):
    copy = tmp_path / "libgpuguard-copy.so"
    shutil.copy(_lib.path if os.path.isabs(_lib.path) else _lib.lib._name, copy)
    r = run_python("from gpuguard import _lib; print(_lib.path)", GPUGUARD_LIBRARY=str(copy))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(copy)


def test_bad_override_is_not_replaced_by_another_copy(tmp_path):
    r = run_python("import gpuguard", GPUGUARD_LIBRARY=str(tmp_path / "missing.so"))
    assert r.returncode != 0
    assert "GPUGUARD_LIBRARY=" in r.stderr and "cannot be loaded" in r.stderr


installed_only = pytest.mark.skipif(not INSTALLED, reason="GPUGUARD_TEST_INSTALLED=1 tests an installed wheel")


@installed_only
def test_installed_package_is_not_the_checkout():
    here = os.path.abspath(gpuguard.__file__)
    assert not here.startswith(SOURCE_PKG + os.sep), here
    assert here.startswith(os.path.realpath(sys.prefix) + os.sep) or here.startswith(sys.prefix + os.sep), here
    assert "GPUGUARD_LIBRARY" not in os.environ
    assert _lib.path == os.path.join(os.path.dirname(here), "lib", "libgpuguard.so.0")


@installed_only
def test_console_command_runs_the_c_tool():
    exe = shutil.which("gpuguard", path=os.path.dirname(sys.executable))
    assert exe, "no gpuguard command beside " + sys.executable
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: gpuguard") and f"gpuguard {gpuguard.__version__}" in r.stdout
    r = subprocess.run([exe, "info", "--json"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, GPUGUARD_BACKEND="host"))
    assert r.returncode == 0, r.stderr
    assert '"host"' in r.stdout
