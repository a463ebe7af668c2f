"""gpuguard._workers.install(): multiprocessing children (fork, spawn, forkserver) of a trainer that is
SIGKILLed die with it, without a change to the trainer's code; without install() they survive (what
`gpuguard reap` then finds as stranded). Real processes on the host, CPU only."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import gpuguard

# Where the gpuguard under test lives (the source tree, or the installed wheel): the children import it.
PKG = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))

TRAINER = textwrap.dedent("""
    import multiprocessing as mp, sys, time
    if sys.argv[1] == "1":
        from gpuguard import _workers
        _workers.install()
    def work():
        time.sleep(60)
    if __name__ == "__main__":
        kids = []
        for method in ("fork", "spawn", "forkserver"):
            p = mp.get_context(method).Process(target=work)
            p.start()
            kids.append(p.pid)
        print(" ".join(map(str, kids)), flush=True)
        time.sleep(60)
""")


def _state(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):  # ESRCH: reaped after the open
        return "gone"


def _run(tmp_path, install):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = dict(os.environ, PYTHONPATH=PKG + os.pathsep + os.environ.get("PYTHONPATH", ""))
    trainer = subprocess.Popen([sys.executable, str(script), "1" if install else "0"], stdout=subprocess.PIPE,
                               env=env, text=True)
    kids = [int(k) for k in trainer.stdout.readline().split()]
    assert len(kids) == 3
    time.sleep(0.5)  # each child reaches its target (spawn children import the script first)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    return kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's")
def test_workers_die_with_a_sigkilled_trainer(tmp_path):
    kids = _run(tmp_path, install=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_state(k) not in ("Z", "gone") for k in kids):
        time.sleep(0.02)
    states = {k: _state(k) for k in kids}
    for k in kids:
        if states[k] not in ("Z", "gone"):
            os.kill(k, signal.SIGKILL)
    assert all(s in ("Z", "gone") for s in states.values()), states


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's")
def test_without_install_workers_survive(tmp_path):
    kids = _run(tmp_path, install=False)
    time.sleep(0.5)
    states = {k: _state(k) for k in kids}
    for k in kids:
        if states[k] not in ("Z", "gone"):
            os.kill(k, signal.SIGKILL)
    assert all(s not in ("Z", "gone") for s in states.values()), states


def test_install_is_idempotent_and_arm_worker_runs():
    from gpuguard import _workers, proc
    _workers.install()
    _workers.install()
    import multiprocessing.process as mpp
    assert mpp.BaseProcess._bootstrap.__name__ == "_bootstrap"
    assert proc.arm_worker.__doc__
