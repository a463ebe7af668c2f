"""gpuguard._workers — workers that die with their parent, without changes to the script: once
:func:`install` has run (the start-up hook calls it with ``GPUGUARD_WORKERS=1`` or ``GPUGUARD_TORCH=1``,
when ``multiprocessing`` is first imported), every multiprocessing child started from this process (fork,
spawn and forkserver; so PyTorch DataLoader workers and ``torch.multiprocessing.spawn`` children too)
is armed before its target runs: SIGKILL when its parent dies, and no inherited /dev/nvidia* descriptors
(which would keep the dead parent's device memory held). A torch.distributed rank started by torchrun
(TORCHELASTIC_RUN_ID in its environment, not in its parent's) arms itself against its agent; what a
rank starts itself (a detached helper, a subprocess) is left alone.

Against which parent: the process that started the worker, named by pid and start time as the parent
saw itself, never as the child finds it later (by then a dead parent's child has been handed to a
reaper, and arming against the reaper would keep it alive). Fork children read it from an at-fork hook
that ran in the parent; spawn children from a token in their pickled Process object; forkserver children
from the forkserver's at-fork hook, and the forkserver from a variable its parent sets while starting it
(``GPUGUARD_FORKSERVER_PARENT``, read and removed by the forkserver: one generation). A worker whose
parent is no longer that process when it arms kills itself at once, as the death signal would have.

How: fork children run ``BaseProcess._bootstrap`` from the parent's memory, which is wrapped. Spawn and
forkserver children start a new interpreter that may not run the hook, so each such Process carries a
token whose unpickling in the child (before the target runs, after the child's sys.path is the
parent's) arms it; the forkserver itself is armed through its preload list. Standard library only:
neither libgpuguard nor torch is loaded."""
from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~2 ms at interpreter start: for the checker only
    from typing import Any, Callable, Optional, Tuple

FORKSERVER_PARENT = "GPUGUARD_FORKSERVER_PARENT"
_SIGKILL = 9
_PR_SET_PDEATHSIG = 1

_lock = _thread.allocate_lock()
_installed = False
_armed_pid = 0
# The pid of the process that last forked this memory image, and whether its forking thread was its
# main thread, written in that process just before the fork: a fork child reads its real parent here
# even when the parent died before the child could look.
_forked_by = (0, True)


def _before_fork() -> None:
    global _forked_by
    _forked_by = (os.getpid(), _on_main_thread())


def _on_main_thread() -> bool:
    """Whether the calling thread is the main one (which lives as long as the process)."""
    threading = sys.modules.get("threading")  # not imported: no thread was started through it
    return threading is None or threading.current_thread() is threading.main_thread()


os.register_at_fork(before=_before_fork)


def _start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks after boot, field 22 of /proc/PID/stat); None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _me() -> Tuple[int, int, bool]:
    """This process as the children it starts now must know it: pid, start time (0: unknown), and
    whether they are started from its main thread."""
    return os.getpid(), _start_time(os.getpid()) or 0, _on_main_thread()


def _arm(pid: int, start: int, main_thread: bool) -> None:
    """Ties this process to its parent ``pid`` (started at ``start``, 0: unchecked), once per process;
    dies at once when its parent is not that process any more. A failure is said on stderr, never raised
    into the worker.

    The death signal follows the thread that forked us, not its process (Linux's rule): a worker
    started from another thread (a ProcessPoolExecutor's, a thread that ends once it has started it)
    would die with that thread. Those are tied to the process instead, by a thread waiting on it."""
    global _armed_pid
    if _armed_pid == os.getpid():
        return
    _armed_pid = os.getpid()
    try:
        if main_thread:
            _death_signal()
        else:
            _watch(pid)
        # Armed first, checked second: a parent dying in between is seen here, one dying later by the kernel.
        if os.getppid() != pid or (start and _start_time(pid) not in (start, None)):
            os.kill(os.getpid(), _SIGKILL)
        _close_device_fds()
    except Exception as e:  # a worker must still run when it cannot be armed
        sys.stderr.write(f"gpuguard: could not arm worker {os.getpid()} against its parent {pid}: {e}\n")


def _death_signal() -> None:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _watch(pid: int) -> None:
    """A daemon thread that SIGKILLs this process once process ``pid`` has ended: it waits on a pidfd
    (Linux 5.3, Python 3.9), else looks at getppid() every 0.2 s. The caller then checks that ``pid`` is
    still its parent: the pidfd, opened first, is then known to name it."""
    import threading
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        fd = -1
    threading.Thread(target=_die_after, args=(pid, fd), name="gpuguard-parent-watch", daemon=True).start()


def _die_after(pid: int, fd: int) -> None:
    if fd >= 0:
        import select
        select.select([fd], [], [])  # readable once the process has ended
    else:
        import time
        while os.getppid() == pid:
            time.sleep(0.2)
    os.kill(os.getpid(), _SIGKILL)


def _close_device_fds() -> int:
    """Closes the /dev/nvidia* descriptors this process inherited (gpuguard.close_device_fds, without
    loading the library); how many."""
    closed = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/dev/nvidia"):
                os.close(int(name))
                closed += 1
        except (OSError, ValueError):  # the listing's own descriptor, closed by now
            continue
    return closed


def _arm_on_load(pid: int = 0, start: int = 0, main_thread: bool = True, method: str = "spawn") -> "_ArmToken":
    """Runs in a spawn or forkserver child when its Process object is unpickled."""
    install()
    if method == "forkserver":  # forked by the forkserver, which is armed against the process that started it
        _arm_forked()
    else:
        _arm(pid or os.getppid(), start, main_thread)
    return _ArmToken(pid, start, main_thread, method)


def _arm_forked() -> None:
    """In a fork child (of this process's image, or of the forkserver): armed against the forker."""
    pid, main_thread = _forked_by
    _arm(pid or os.getppid(), 0, main_thread)


class _ArmToken:
    """Carried by a Process started by spawn or forkserver: unpickling it arms the child against the
    process that started it (spawn) or the forkserver (forkserver)."""

    def __init__(self, pid: int, start: int, main_thread: bool, method: str) -> None:
        self.args = (pid, start, main_thread, method)

    def __reduce__(self) -> Tuple[Callable[..., "_ArmToken"], Tuple[int, int, bool, str]]:
        return (_arm_on_load, self.args)


def install() -> None:
    """Arms every multiprocessing child this process starts from now on (see the module's text), and this
    process itself when it is a torchrun rank. Idempotent; thread-safe."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        import multiprocessing.process as mpp
        base = mpp.BaseProcess
        bootstrap = base._bootstrap  # type: ignore[attr-defined]
        start = base.start

        def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
            _arm_forked()  # in the child, before its target
            return bootstrap(self, *args, **kwargs)

        def _start(self: Any) -> None:
            method = getattr(self, "_start_method", None) or _start_method()
            if method in ("spawn", "forkserver"):
                self._gpuguard_arm = _ArmToken(*_me(), method)
            start(self)

        base._bootstrap = _bootstrap  # type: ignore[attr-defined]
        base.start = _start  # type: ignore[method-assign]
    _after_import("multiprocessing.forkserver", _forkserver_knows_us)
    arm_if_rank()


_rank_checked = False


def arm_if_rank() -> None:
    """Arms this process against its parent when it is a torch.distributed rank that torchrun's agent
    started: TORCHELASTIC_RUN_ID and LOCAL_RANK in its environment, and not in its parent's (the agent's
    own environment lacks them; the agent sets them for the ranks only). What a rank starts itself (a
    checkpoint upload detached with start_new_session, a plain subprocess) inherits the variables from
    a parent that has them too, and is left alone, as is any process whose parent's environment cannot
    be read. A new session is no sign either way: torchrun starts its ranks in sessions of their own."""
    global _rank_checked
    if _rank_checked:  # the hook asks at start and install() again: the parent's environment is read once
        return
    _rank_checked = True
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or "LOCAL_RANK" not in os.environ:
        return
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/environ", "rb") as f:
            parent_env = f.read().split(b"\0")
    except OSError:
        return
    if b"TORCHELASTIC_RUN_ID=" + os.fsencode(run_id) not in parent_env:
        _arm(ppid, 0, True)  # the agent starts ranks from its main thread


def _forkserver_knows_us(forkserver: Any) -> None:
    """The forkserver imports gpuguard._arm_forkserver at start (its preload list), which arms it
    against this process, named in FORKSERVER_PARENT while ensure_running starts it."""
    try:
        fs = forkserver._forkserver
        mods = list(getattr(fs, "_preload_modules", None) or [])
        if "gpuguard._arm_forkserver" not in mods:
            fs._preload_modules = mods + ["gpuguard._arm_forkserver"]
        if getattr(fs, "_gpuguard_names_parent", False):
            return
        ensure_running = fs.ensure_running

        def named_ensure_running() -> None:
            with _lock:  # one variable for every thread: held while a forkserver may be started
                os.environ[FORKSERVER_PARENT] = "%d:%d:%d" % _me()
                try:
                    ensure_running()
                finally:
                    os.environ.pop(FORKSERVER_PARENT, None)

        fs.ensure_running = named_ensure_running
        fs._gpuguard_names_parent = True
    except Exception:  # another Python's internals: the workers are still armed against the forkserver
        pass


def arm_forkserver() -> None:
    """In the forkserver, at its start: armed against the process that started it."""
    named = os.environ.pop(FORKSERVER_PARENT, "").split(":")  # one generation: its workers do not inherit it
    if len(named) == 3 and all(n.isdigit() for n in named) and int(named[0]) > 1:
        _arm(int(named[0]), int(named[1]), named[2] == "1")
    else:
        _arm(os.getppid(), 0, True)


def _after_import(name: str, callback: Callable[[Any], None]) -> None:
    postimport: Any = sys.modules.get("gpuguard._postimport")  # loaded by the start-up hook
    if postimport is None:
        from . import _postimport as postimport  # imported with the package
    postimport.after_import(name, callback)


def _start_method() -> str:
    """The default context's method, which a Process of multiprocessing.Process starts with (start()
    fixes the default context as this does)."""
    import multiprocessing
    try:
        return multiprocessing.get_start_method() or "fork"
    except Exception:
        return "fork"
