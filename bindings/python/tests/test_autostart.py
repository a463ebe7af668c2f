"""The start-up hook (gpuguard_torch.pth → gpuguard._autostart) at interpreter start, in a venv whose
site-packages holds it as an installed wheel's does (hookenv): it runs once per process although a venv
processes site-packages twice; a PyTorch it cannot serve (CPU-only, ROCm, older than the backend's
floor) is left as it is with one line and the script runs; bad values stop the process with exit 2
naming the variable and the value, never a traceback. No GPU, no real torch (stand-in packages)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from hookenv import clean_env, hooked_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hook is tested on Linux")

# The hook's finders on sys.meta_path, and how many callbacks wait for torch's import (one per hook run).
COUNT_FINDERS = ("import sys; f = [f for f in sys.meta_path if type(f).__module__.startswith('gpuguard')]; "
                 "print(len(f), sum(len(x.pending.get('torch', ())) for x in f))")


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("venv"))


def run(python: str, code: str, torch_dir: Optional[str] = None, **env: str) -> "subprocess.CompletedProcess[str]":
    e: Dict[str, str] = clean_env(**env)
    if torch_dir:
        e["PYTHONPATH"] = torch_dir
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=e)


def test_the_hook_runs_once_per_process(python: str, tmp_path: Path) -> None:
    probe = Path(run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (probe / "zz-count-site-passes.pth").write_text("import sys; sys.stderr.write('site pass\\n')\n")
    try:
        r = run(python, COUNT_FINDERS, GPUGUARD_TORCH="1")
    finally:
        (probe / "zz-count-site-passes.pth").unlink()
    print(f"site-packages processed {r.stderr.count('site pass')} time(s); torch finders: {r.stdout.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 1", (r.stdout, r.stderr)
    # The package imported after the hook serves the modules the hook loaded.
    r = run(python, "import gpuguard, sys; print(gpuguard._workers is sys.modules['gpuguard._workers'], "
            "gpuguard._autostart._ran)", GPUGUARD_TORCH="1")
    assert r.returncode == 0 and r.stdout.strip() == "True True", (r.stdout, r.stderr)


def test_unset_variables_import_nothing_of_gpuguard(python: str) -> None:
    r = run(python, "import sys; print(sorted(m for m in sys.modules if m.startswith('gpuguard')))")
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)
