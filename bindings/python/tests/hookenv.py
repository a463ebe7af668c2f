"""A Python whose site-packages holds gpuguard's start-up hook (gpuguard_torch.pth), as an installed wheel
has it, for tests of what the hook does at interpreter start: a virtual environment (no pip, made in the
test's own temporary directory) whose site-packages gets the package under test on its path and a copy
of the hook. A venv is also where site-packages is processed twice (lib and lib64), which the hook must
survive. Stand-in ``torch`` packages (CPU-only, ROCm, old) go on PYTHONPATH with :func:`fake_torch`."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))
HOOK = "gpuguard_torch.pth"
SWITCHES = ("GPUGUARD_TORCH", "GPUGUARD_TORCH_OPTIONS", "GPUGUARD_WORKERS", "GPUGUARD_PARENT_PID",
            "TORCHELASTIC_RUN_ID", "LOCAL_RANK")


def hook_source() -> Path:
    """The hook under test: beside the package (site-packages of an installed wheel, or bindings/python)."""
    path = Path(PKG) / HOOK
    assert path.is_file(), f"no {HOOK} beside the package under test in {PKG}"
    return path


def hooked_python(where: Path) -> str:
    """Makes a venv under ``where`` with the hook in its site-packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(site) / "00-gpuguard-under-test.pth").write_text(PKG + "\n")  # a path line: sorted before the hook
    (Path(site) / HOOK).write_text(hook_source().read_text())
    return str(python)


def clean_env(**extra: str) -> Dict[str, str]:
    """This environment without gpuguard's switches (and without PYTHONPATH), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES and k != "PYTHONPATH"}
    env.update(extra)
    return env


def fake_torch(where: Path, version: str = "2.11.0+cpu", cuda: Optional[str] = None,
               hip: Optional[str] = None) -> str:
    """A stand-in ``torch`` package under ``where`` with ``torch.version.cuda``/``hip`` as given, whose
    import prints nothing; returns the directory to put on PYTHONPATH."""
    pkg = where / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import version\n__version__ = version.__version__\n")
    (pkg / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\nhip = {hip!r}\n")
    return str(where)
