"""What gpuguard's start-up hook (gpuguard_torch.pth in site-packages) costs at interpreter start:
``python -c pass`` in a venv without the hook and in one with it, with the variables unset, with
GPUGUARD_WORKERS=1 and with GPUGUARD_TORCH=1 (torch never imported: the cost before torch's import).
The variants run interleaved, round after round, so that a busy machine slows them alike; the table
gives each one's minimum and median, and the median's difference from the venv without the hook.

    python3 bench/bench_startup.py [--runs N]

Goals (issue 44): unset ≤ 5 ms over no hook; GPUGUARD_TORCH=1 ≤ 30 ms."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bindings" / "python"), str(ROOT / "bindings" / "python" / "tests")]
import hookenv  # noqa: E402  (the tests' venv with the hook, on the package found above)

Variant = Tuple[str, str, Dict[str, str]]


def plain_python(where: Path) -> str:
    """A venv with the package on its path but without the hook."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "00-gpuguard-under-test.pth").write_text(hookenv.PKG + "\n")
    return str(python)


def once(python: str, env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - start) * 1000


def measure(variants: List[Variant], runs: int) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {name: [] for name, _, _ in variants}
    for _name, python, env in variants:  # a first, unmeasured run of each: caches warm
        once(python, env)
    for _ in range(runs):
        for name, python, env in variants:
            times[name].append(once(python, env))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60, help="runs of each variant (default 60)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain, hooked = plain_python(Path(tmp) / "plain"), hookenv.hooked_python(Path(tmp) / "hooked")
        base = hookenv.clean_env()
        base.pop("PYTHONDONTWRITEBYTECODE", None)  # the warm-up writes the .pyc files pip writes for a wheel
        variants: List[Variant] = [
            ("no hook", plain, base),
            ("hook, variables unset", hooked, base),
            ("hook, GPUGUARD_WORKERS=1", hooked, dict(base, GPUGUARD_WORKERS="1")),
            ("hook, GPUGUARD_TORCH=1", hooked, dict(base, GPUGUARD_TORCH="1")),
        ]
        times = measure(variants, args.runs)
    ref = statistics.median(times["no hook"])
    print(f"python -c pass, {args.runs} interleaved runs each, {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'variant':<28} {'min ms':>8} {'median ms':>10} {'median - no hook':>17}")
    for name, _, _ in variants:
        med = statistics.median(times[name])
        print(f"{name:<28} {min(times[name]):>8.1f} {med:>10.1f} {med - ref:>+17.1f}")


if __name__ == "__main__":
    main()
