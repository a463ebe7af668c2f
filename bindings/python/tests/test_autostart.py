"""The start-up hook (gpuguard_torch.pth → gpuguard._autostart) at interpreter start, in a venv whose
site-packages holds it as an installed wheel's does (hookenv): it runs once per process although a venv
processes site-packages twice; a PyTorch it cannot serve (CPU-only, ROCm, older than the backend's
floor) is left as it is with one line and the script runs; bad values stop the process with exit 2
naming the variable and the value, never a traceback. No GPU, no real torch (stand-in packages)."""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Optional

import pytest

from hookenv import clean_env, fake_torch, hooked_python

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


@pytest.mark.parametrize("kind,version,cuda,hip,needle", [
    ("cpu", "2.11.0+cpu", None, None, "no CUDA"),
    ("rocm", "2.9.1+rocm6.4", None, "6.4.43482", "ROCm"),
    ("rocm-with-cuda-field", "2.9.1+rocm6.4", "12.8", "6.4.43482", "ROCm"),
])
def test_a_pytorch_without_cuda_is_left_as_it_is(python: str, tmp_path: Path, kind: str, version: str,
                                                 cuda: Optional[str], hip: Optional[str], needle: str) -> None:
    torch_dir = fake_torch(tmp_path, version, cuda, hip)
    code = "import torch, sys; print('ran', 'gpuguard.torch' in sys.modules)"
    r = run(python, code, torch_dir, GPUGUARD_TORCH="1")
    print(kind, "exit", r.returncode, "stderr:", r.stderr.strip())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran False", r.stdout  # nothing installed, gpuguard.torch not even imported
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0] and "left as it is" in lines[0], r.stderr


@pytest.mark.parametrize("var,conf", [
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),
    ("PYTORCH_ALLOC_CONF", "max_split_size_mb:20, backend: cudaMallocAsync ,release_lock_on_cudamalloc:none"),
])
def test_pytorchs_own_backend_setting_wins(python: str, tmp_path: Path, var: str, conf: str) -> None:
    """test_cuda.py's test_allocator_backend: a process whose PyTorch settings ask for cudaMallocAsync gets
    it, with one line saying so, and gpuguard.torch is never imported."""
    torch_dir = fake_torch(tmp_path, "2.11.0+cu130", "13.0", None)
    code = "import torch, sys; print('ran', 'gpuguard.torch' in sys.modules)"
    r = run(python, code, torch_dir, GPUGUARD_TORCH="1", **{var: conf})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran False", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and var in lines[0] and "cudaMallocAsync backend" in lines[0], r.stderr


def test_conf_backend_reads_settings_as_pytorch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuguard import _autostart as A
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    assert A._conf_backend() is None
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native,expandable_segments:True")
    assert A._conf_backend() is None  # PyTorch's default backend, named: gpuguard still serves
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync,backend:native")
    assert A._conf_backend() is None  # named twice: the last one counts
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage,backend:cudaMallocAsync")
    assert A._conf_backend() == ("PYTORCH_CUDA_ALLOC_CONF", "cudaMallocAsync")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")  # read only without the CUDA one
    assert A._conf_backend() == ("PYTORCH_CUDA_ALLOC_CONF", "cudaMallocAsync")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert A._conf_backend() is None


def test_a_pytorch_older_than_the_backend_keeps_its_allocator(python: str, tmp_path: Path) -> None:
    torch_dir = fake_torch(tmp_path, "1.13.1+cu117", "11.7", None)
    r = run(python, "import torch; print('ran')", torch_dir, GPUGUARD_TORCH="1")
    print("exit", r.returncode, "stderr:", r.stderr.strip())
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "1.13.1" in lines[0] and "PyTorch's own allocator" in lines[0], r.stderr


@pytest.mark.parametrize("env,needle", [
    ({"GPUGUARD_WORKERS": "maybe"}, "GPUGUARD_WORKERS='maybe'"),
    ({"GPUGUARD_WORKERS": "2"}, "GPUGUARD_WORKERS='2'"),
    ({"GPUGUARD_WORKERS": "1", "GPUGUARD_TORCH": "sure"}, "GPUGUARD_TORCH='sure'"),
    ({"GPUGUARD_TORCH": "1", "GPUGUARD_TORCH_OPTIONS": "capacity=" + "9" * 5000}, "capacity="),
    ({"GPUGUARD_TORCH": "1", "GPUGUARD_TORCH_OPTIONS": "chunk=1" + "0" * 30 + "G"}, "chunk="),
    ({"GPUGUARD_TORCH": "1", "GPUGUARD_TORCH_OPTIONS": "workers=sometimes"}, "'workers=sometimes'"),
])
def test_bad_values_stop_the_process_with_exit_2(python: str, env: Dict[str, str], needle: str) -> None:
    r = run(python, "print('ran on')", **env)
    print("exit", r.returncode, "stderr:", r.stderr.strip()[:160])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "ran on" not in r.stdout and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("gpuguard: ") and needle in r.stderr, r.stderr


def test_workers_switch_values() -> None:
    from gpuguard import _autostart as A
    assert A.parse_workers(None) is None and A.parse_workers(" ") is None
    assert A.parse_workers("ON") is True and A.parse_workers("no") is False
    torch_on = A.parse("1", "")
    assert A.workers_wanted(None, torch_on) is True            # GPUGUARD_TORCH=1 implies it
    assert A.workers_wanted(False, torch_on) is False          # unless GPUGUARD_WORKERS=0 says no
    assert A.workers_wanted(None, A.parse("1", "workers=off")) is False
    assert A.workers_wanted(True, None) is True and A.workers_wanted(None, None) is False


_KEYS = ["capacity", "chunk", "backend", "fallback", "workers", "captures", "", " Capacity ", "x"]
_VALUES = ["", " ", "K", "G", "iB", "B", "native", "torch", "on", "off", "any", "-", "0", "1e9", "0x10", "+5",
           "\x00", "é", "٣", "=", "7" * 4301]


def _fuzz_text(rng: random.Random) -> str:
    """Options that look like ours: key=value items of known and unknown keys, odd values and separators."""
    items = []
    for _ in range(rng.randint(0, 4)):
        value = "".join(rng.choice(_VALUES + ["9" * rng.randint(1, 25)]) for _ in range(rng.randint(0, 3)))
        items.append(rng.choice(_KEYS) + rng.choice(["=", "", "=="]) + value)
    return rng.choice([",", ", ", ",,"]).join(items)


def test_the_option_parser_only_ever_says_config_error() -> None:
    from gpuguard import _autostart as A
    rng = random.Random(42)
    for _ in range(3000):
        text = _fuzz_text(rng)
        try:
            cfg = A.parse("1", text)
        except A.ConfigError:
            continue
        assert cfg is not None and 0 <= cfg["capacity"] < 1 << 62 and 0 <= cfg["chunk"] < 1 << 62, text


def test_fuzzed_options_at_start_exit_0_or_2_without_traceback(python: str) -> None:
    rng = random.Random(7)
    texts = [_fuzz_text(rng).replace("\x00", "") for _ in range(12)]
    script = textwrap.dedent("""
        import subprocess, sys
        for text in sys.argv[1:]:
            env = {"GPUGUARD_TORCH": "1", "GPUGUARD_TORCH_OPTIONS": text}
            r = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env=env)
            print(r.returncode, "Traceback" in r.stderr, repr(text))
    """)
    r = subprocess.run([python, "-c", script, *texts], capture_output=True, text=True, timeout=300, env=clean_env())
    assert r.returncode == 0, r.stderr
    for line in r.stdout.splitlines():
        code, traceback, _ = line.split(" ", 2)
        assert code in ("0", "2") and traceback == "False", line
