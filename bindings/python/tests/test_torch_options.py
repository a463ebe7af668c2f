"""GPUGUARD_TORCH and GPUGUARD_TORCH_OPTIONS: what the start-up hook accepts, what stops a process at start
(exit 2, the variable and the value named), and that the hook imports nothing of gpuguard while the
variable is unset. No torch and no GPU needed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    if os.environ.get("GPUGUARD_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = PKG + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.mark.parametrize("value,opts,needle", [
    ("maybe", "", "GPUGUARD_TORCH='maybe'"),
    ("1", "capacity=lots", "capacity='lots'"),
    ("1", "chunk=0", "chunk='0'"),
    ("1", "backend=fast", "'backend=fast'"),
    ("1", "capacity", "'capacity' is not key=value"),
    ("1", "captures=some", "'captures=some'"),
])
def test_bad_values_stop_the_process_naming_variable_and_value(value: str, opts: str, needle: str) -> None:
    env = _env(GPUGUARD_TORCH=value, GPUGUARD_TORCH_OPTIONS=opts)
    r = subprocess.run([sys.executable, "-c", "import gpuguard._autostart as A; A.run(); print('ran on')"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "ran on" not in r.stdout
    assert needle in r.stderr, r.stderr


def test_parse_accepts_the_documented_forms() -> None:
    from gpuguard import _autostart as A
    assert A.parse(None, None) is None and A.parse("0", "") is None and A.parse(" off ", "x") is None
    cfg = A.parse("1", "capacity=40G, chunk=64MiB,backend=native,fallback=torch,workers=off")
    assert cfg == {"capacity": 40 << 30, "chunk": 64 << 20, "backend": "native", "fallback": "torch",
                   "workers": False, "captures": "announced"}
    assert A.parse("1", "captures=Any")["captures"] == "any"


def test_unset_variable_imports_nothing_of_gpuguard() -> None:
    """What the .pth line does when GPUGUARD_TORCH is unset: no gpuguard module is imported."""
    pth = os.path.join(os.path.dirname(PKG), "python", "gpuguard_torch.pth")
    with open(pth) as f:
        line = f.read().strip()
    env = _env()
    env.pop("GPUGUARD_TORCH", None)
    r = subprocess.run([sys.executable, "-c", line + "\nimport sys; print(any(m.startswith('gpuguard') for m in sys.modules))"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", line + "\nimport sys; print('gpuguard._autostart' in sys.modules)"],
                       capture_output=True, text=True, timeout=60, env=dict(env, GPUGUARD_TORCH="1"))
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)
