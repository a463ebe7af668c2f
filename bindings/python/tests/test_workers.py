"""Workers that die with their parent (gpuguard._workers): multiprocessing children (fork, spawn and
forkserver; DataLoader workers are such children) of a parent that is SIGKILLed die with it, without a
change to the parent's code, once armed: by ``_workers.install()``, or at start by the hook with
``GPUGUARD_WORKERS=1`` or ``GPUGUARD_TORCH=1`` (tests/hookenv.py: a venv with the hook, as an installed
wheel has it). Unarmed, they survive (what `gpuguard reap` then finds as stranded). Real processes on
the host, CPU only; every test kills what it leaves."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List

import pytest

from hookenv import PKG, clean_env, hooked_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's")

METHODS = ("fork", "spawn", "forkserver")

# argv: how it is armed ("install" or not), when the parent goes ("after-start": once every worker runs
# its target; "kill-during-start" / "exit-during-start": right after Process.start() returns), the
# start methods, and a directory where each worker leaves a file once its target runs.
TRAINER = textwrap.dedent("""
    import multiprocessing as mp, os, signal, sys, time
    if sys.argv[1] == "install":
        from gpuguard import _workers
        _workers.install()
    def work(ready):
        open(os.path.join(ready, str(os.getpid())), "w").close()
        time.sleep(60)
    def started(method, ready):
        if method.startswith("default-"):  # multiprocessing.Process, of the default context
            mp.set_start_method(method[len("default-"):], force=True)
            p = mp.Process(target=work, args=(ready,))
        else:
            p = mp.get_context(method).Process(target=work, args=(ready,))
        p.start()
        return p.pid
    if __name__ == "__main__":
        when, methods, ready = sys.argv[2], sys.argv[3].split(","), sys.argv[4]
        kids = [started(m, ready) for m in methods]
        print(" ".join(map(str, kids)), flush=True)
        if when == "kill-during-start":
            os.kill(os.getpid(), signal.SIGKILL)
        if when == "exit-during-start":
            os._exit(0)  # exits at once: multiprocessing's exit handler would wait for the workers
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < len(kids) and time.monotonic() < deadline:
            time.sleep(0.02)
        print("running", flush=True)
        time.sleep(60)
""")


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> str:
    return hooked_python(tmp_path_factory.mktemp("venv"))


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):  # ESRCH: reaped after the open
        return "gone"


def _dead(pid: int) -> bool:
    return _state(pid) in ("Z", "X", "gone")


def _states_after(kids: List[int], seconds: float) -> Dict[int, str]:
    """Waits up to ``seconds`` for every worker to die; their states then; kills the survivors."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_dead(k) for k in kids):
        time.sleep(0.05)
    states = {k: _state(k) for k in kids}
    for k in kids:
        if not _dead(k):
            os.kill(k, signal.SIGKILL)
    return states


def run_trainer(tmp_path: Path, python: str, arm: str, when: str, methods: str, **env: str) -> List[int]:
    """Runs TRAINER; once it has gone (SIGKILLed by us after its workers run, or by itself), returns the
    workers' pids."""
    script, ready = tmp_path / "trainer.py", tmp_path / "ready"
    script.write_text(TRAINER)
    ready.mkdir()
    e = clean_env(**env)
    if python == sys.executable:
        e["PYTHONPATH"] = PKG
    trainer = subprocess.Popen([python, str(script), arm, when, methods, str(ready)], stdout=subprocess.PIPE,
                               env=e, text=True)
    assert trainer.stdout is not None
    kids = [int(k) for k in trainer.stdout.readline().split()]
    try:
        if when == "after-start":
            assert trainer.stdout.readline().strip() == "running"
            trainer.send_signal(signal.SIGKILL)
    finally:
        trainer.wait(timeout=120)
        trainer.stdout.close()
    assert len(kids) == len(methods.split(",")), kids
    return kids


ARMED = {  # how a parent arms its workers: (python, argv's arm, environment)
    "install": ("sys", "install", {}),
    "GPUGUARD_WORKERS=1": ("hook", "-", {"GPUGUARD_WORKERS": "1"}),
    "GPUGUARD_TORCH=1": ("hook", "-", {"GPUGUARD_TORCH": "1"}),
}


@pytest.mark.parametrize("how", list(ARMED))
def test_workers_die_with_a_sigkilled_parent(tmp_path: Path, hooked: str, how: str) -> None:
    where, arm, env = ARMED[how]
    python = sys.executable if where == "sys" else hooked
    kids = run_trainer(tmp_path, python, arm, "after-start", ",".join(METHODS), **env)
    states = _states_after(kids, 10)
    assert all(s in ("Z", "X", "gone") for s in states.values()), dict(zip(METHODS, states.values()))


@pytest.mark.parametrize("when", ["kill-during-start", "exit-during-start"])
@pytest.mark.parametrize("method", METHODS + ("default-spawn",))
def test_workers_die_when_the_parent_goes_during_their_start(tmp_path: Path, hooked: str, method: str,
                                                             when: str) -> None:
    """The parent is SIGKILLed, or exits (status 0), right after Process.start() returns, while the
    worker is still starting (a spawn child is importing the interpreter): the worker must not arm
    itself against the reaper it was handed to, and must not run on."""
    kids = run_trainer(tmp_path, hooked, "-", when, method, GPUGUARD_WORKERS="1")
    states = _states_after(kids, 10)
    assert all(s in ("Z", "X", "gone") for s in states.values()), (method, when, states)


@pytest.mark.parametrize("env", [{}, {"GPUGUARD_TORCH": "1", "GPUGUARD_WORKERS": "0"},
                                 {"GPUGUARD_TORCH": "1", "GPUGUARD_TORCH_OPTIONS": "workers=off"}])
def test_unarmed_workers_survive(tmp_path: Path, hooked: str, env: Dict[str, str]) -> None:
    kids = run_trainer(tmp_path, hooked, "-", "after-start", ",".join(METHODS), **env)
    time.sleep(0.5)
    states = _states_after(kids, 0)
    assert not any(s in ("Z", "X", "gone") for s in states.values()), dict(zip(METHODS, states.values()))


def test_install_is_idempotent() -> None:
    from gpuguard import _workers
    _workers.install()
    _workers.install()
    import multiprocessing.process as mpp
    assert mpp.BaseProcess._bootstrap.__name__ == "_bootstrap"


JOINED = textwrap.dedent("""
    import multiprocessing as mp, sys
    def work():
        pass
    if __name__ == "__main__":
        for method in sys.argv[1].split(","):
            p = mp.get_context(method).Process(target=work)
            p.start()
            p.join(60)
            print(method, p.exitcode, flush=True)
""")


@pytest.mark.parametrize("value", ["garbage", "0", "1", "-5", "99999999999", "parent-of-the-test"])
def test_an_inherited_or_garbage_parent_pid_does_not_kill_workers(tmp_path: Path, hooked: str, value: str) -> None:
    """GPUGUARD_PARENT_PID left in the environment (by an outer launcher, or garbage) is not read by
    the workers' arming: every worker runs to its end."""
    if value == "parent-of-the-test":
        value = str(os.getppid())
    script = tmp_path / "joined.py"
    script.write_text(JOINED)
    r = subprocess.run([hooked, str(script), ",".join(METHODS)], capture_output=True, text=True, timeout=300,
                       env=clean_env(GPUGUARD_WORKERS="1", GPUGUARD_PARENT_PID=value))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == [f"{m} 0" for m in METHODS], (value, r.stdout, r.stderr)


ARM_CHILD = "import sys, gpuguard; gpuguard.arm_child(); print('armed')"


def _arm_child_exit(value: str, python_under: str = "") -> int:
    """The exit status of an exec'd program calling gpuguard.arm_child() with GPUGUARD_PARENT_PID=value
    (through a Python that execs it in turn when ``python_under``: a grandchild inheriting the value)."""
    code = ARM_CHILD if not python_under else (
        "import subprocess, sys; sys.exit(-subprocess.run([sys.executable, '-c', %r]).returncode)" % ARM_CHILD)
    env = dict(os.environ, GPUGUARD_PARENT_PID=value, PYTHONPATH=PKG)
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode


@pytest.mark.parametrize("value", ["garbage", "0", "1", "-5", "99999999999", "12abc", "parent-of-the-test",
                                   "this-test"])
def test_arm_child_ignores_a_parent_pid_that_is_not_its_parent(value: str) -> None:
    """The C library's gg_proc_arm_child in an exec'd program: GPUGUARD_PARENT_PID is used only when it
    names the real parent; garbage or a live process that is not the parent is ignored (was: SIGKILL)."""
    value = {"parent-of-the-test": str(os.getppid()), "this-test": str(os.getpid())}.get(value, value)
    assert _arm_child_exit(value) == 0


def test_arm_child_still_dies_for_a_named_parent_that_is_gone() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert _arm_child_exit(str(gone.pid)) == -signal.SIGKILL  # named, gone, not handed down: it died early
    # One generation: a grandchild inheriting the value from its parent, which has it too, ignores it.
    assert _arm_child_exit(str(gone.pid), python_under="grandchild") == 0


THREADED = textwrap.dedent("""
    import concurrent.futures as cf, multiprocessing as mp, sys, threading, time
    def square(x):
        return x * x
    def in_a_thread(fn):
        t = threading.Thread(target=fn)
        t.start()
        t.join()  # the thread has ended: workers it started must not die with it
    if __name__ == "__main__":
        ctx, box = mp.get_context(sys.argv[1]), {}
        def start_one():
            box["p"] = ctx.Process(target=time.sleep, args=(1.0,))
            box["p"].start()
        def start_pool():
            box["pool"] = cf.ProcessPoolExecutor(2, mp_context=ctx)
            box["pool"].submit(square, 2).result()
        in_a_thread(start_one)
        box["p"].join(60)
        print("process", box["p"].exitcode, flush=True)
        in_a_thread(start_pool)
        time.sleep(0.5)
        try:
            print("pool", sum(box["pool"].map(square, range(10))), flush=True)
        except Exception as e:
            print("pool", type(e).__name__, flush=True)
        box["pool"].shutdown()
""")


@pytest.mark.parametrize("method", METHODS)
def test_workers_started_from_a_thread_outlive_the_thread(tmp_path: Path, hooked: str, method: str) -> None:
    """The death signal follows the forking thread: workers (and the forkserver) started from a thread
    that ends must live on, tied to the process instead; ProcessPoolExecutor keeps working."""
    script = tmp_path / "threaded.py"
    script.write_text(THREADED)
    r = subprocess.run([hooked, str(script), method], capture_output=True, text=True, timeout=300,
                       env=clean_env(GPUGUARD_WORKERS="1"))
    print(method, r.stdout.split("\n"))
    assert r.stdout.split("\n")[:2] == ["process 0", "pool 285"], (r.stdout, r.stderr[-2000:])


def test_a_worker_started_from_a_thread_dies_with_its_sigkilled_parent(tmp_path: Path, hooked: str) -> None:
    """Tied to the process, a thread-started worker still dies with it."""
    script = tmp_path / "threaded_kill.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, os, signal, threading, time
        if __name__ == "__main__":
            box = {}
            def start():
                box["pids"] = []
                for method in ("fork", "spawn", "forkserver"):
                    p = mp.get_context(method).Process(target=time.sleep, args=(60,))
                    p.start()
                    box["pids"].append(p.pid)
            t = threading.Thread(target=start)
            t.start()
            t.join()
            print(" ".join(map(str, box["pids"])), flush=True)
            time.sleep(1.0)  # the workers are armed, the thread is gone
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    r = subprocess.run([hooked, str(script)], capture_output=True, text=True, timeout=120,
                       env=clean_env(GPUGUARD_WORKERS="1"))
    kids = [int(k) for k in r.stdout.split()]
    assert len(kids) == 3, (r.stdout, r.stderr)
    states = _states_after(kids, 10)
    assert all(s in ("Z", "X", "gone") for s in states.values()), dict(zip(METHODS, states.values()))


# A stand-in for torchrun's agent: starts one rank as torchrun does (the rank's variables in its
# environment only, a session of its own), prints the rank's output, then waits or SIGKILLs itself.
AGENT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    rank_env = dict(os.environ, TORCHELASTIC_RUN_ID="run-1", LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    rank = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], env=rank_env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    print(rank.pid, rank.stdout.readline().strip(), flush=True)
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    rank.wait(60)
""")
# The rank starts a detached helper (a checkpoint upload: start_new_session, imports multiprocessing
# as such tools do) and a plain child, prints their pids, and exits ("exit") or lives on ("live").
RANK = textwrap.dedent("""
    import subprocess, sys, time
    helper = "import multiprocessing, time; time.sleep(60)"
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    detached = subprocess.Popen([sys.executable, "-c", helper], start_new_session=True, **quiet)
    plain = subprocess.Popen([sys.executable, "-c", helper], **quiet)
    time.sleep(1.0)  # both have started and run the hook
    print(detached.pid, plain.pid, flush=True)
    if sys.argv[1] == "live":
        time.sleep(60)
""")


def _agent(tmp_path: Path, hooked: str, rank_does: str, agent_does: str) -> List[int]:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "rank.py").write_text(RANK)
    r = subprocess.run([hooked, str(tmp_path / "agent.py"), str(tmp_path / "rank.py"), rank_does, agent_does],
                       capture_output=True, text=True, timeout=120, env=clean_env(GPUGUARD_WORKERS="1"))
    pids = [int(p) for p in r.stdout.split()]
    assert len(pids) == 3, (r.stdout, r.stderr)
    return pids


def test_a_ranks_detached_helper_outlives_the_rank(tmp_path: Path, hooked: str) -> None:
    """What a rank starts (a helper in a new session, a plain child) inherits TORCHELASTIC_RUN_ID and
    LOCAL_RANK, but is not a rank: it must not be armed against the rank, which has exited."""
    rank, detached, plain = _agent(tmp_path, hooked, "exit", "wait")
    time.sleep(1.0)
    states = _states_after([detached, plain], 0)
    assert _dead(rank)
    assert not any(s in ("Z", "X", "gone") for s in states.values()), {"detached": states[detached],
                                                                          "plain": states[plain]}


def test_a_rank_dies_with_its_sigkilled_agent(tmp_path: Path, hooked: str) -> None:
    rank, detached, plain = _agent(tmp_path, hooked, "live", "kill")
    states = _states_after([rank], 10)
    _states_after([detached, plain], 0)
    assert states[rank] in ("Z", "X", "gone"), states
