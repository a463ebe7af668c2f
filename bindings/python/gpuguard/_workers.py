"""gpuguard._workers — workers that die with their trainer, without changes to the script: once
:func:`install` has run (the ``GPUGUARD_TORCH=1`` startup hook calls it), every multiprocessing child
started from this process (fork, spawn and forkserver; so PyTorch DataLoader workers and
``torch.multiprocessing.spawn`` children too) runs :func:`gpuguard.proc.arm_worker` before its target:
the death signal, and no inherited device descriptors. A torch.distributed rank started by torchrun
(TORCHELASTIC_RUN_ID in its environment) arms itself against its agent.

How: fork children run ``BaseProcess._bootstrap`` from the parent's memory, which is wrapped. Spawn and
forkserver children start a new interpreter that may not run the hook, so each such Process carries a
small token in its pickled state whose unpickling in the child (before the target runs, after the
child's sys.path is the parent's) arms it; the forkserver itself is armed through its preload list.
Nothing here imports torch."""
from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~2 ms at interpreter start: for the checker only
    from typing import Any, Callable, Tuple

_lock = _thread.allocate_lock()
_installed = False
_armed_pid = 0


def _arm() -> None:
    """arm_worker() once per process; a failure is said on stderr, never raised into the worker."""
    global _armed_pid
    if _armed_pid == os.getpid():
        return
    _armed_pid = os.getpid()
    try:
        from .proc import arm_worker
        arm_worker()
    except Exception as e:  # a worker must still run when the library cannot be loaded
        sys.stderr.write(f"gpuguard: could not arm worker {os.getpid()} against its parent: {e}\n")


def _arm_on_load() -> "_ArmToken":
    """Runs in a spawn or forkserver child when its Process object is unpickled."""
    install()
    _arm()
    return _ArmToken()


class _ArmToken:
    """Carried by a Process started by spawn or forkserver: unpickling it arms the child."""

    def __reduce__(self) -> Tuple[Callable[[], "_ArmToken"], Tuple[()]]:
        return (_arm_on_load, ())


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
            _arm()  # in the child, before its target
            return bootstrap(self, *args, **kwargs)

        def _start(self: Any) -> None:
            method = getattr(getattr(self, "_ctx", None), "_name", None) or _start_method()
            if method in ("spawn", "forkserver"):
                self._gpuguard_arm = _ArmToken()
            start(self)

        base._bootstrap = _bootstrap  # type: ignore[attr-defined]
        base.start = _start  # type: ignore[method-assign]
    _after_import("multiprocessing.forkserver", _preload_in_forkserver)
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and "LOCAL_RANK" in os.environ:
        _arm()  # a rank: its parent is the elastic agent; the agent's death ends it


def _preload_in_forkserver(forkserver: Any) -> None:
    """The forkserver itself outlives a SIGKILLed parent (its workers keep it busy): it imports
    gpuguard._arm_forkserver at start, which arms it against the parent."""
    try:
        fs = forkserver._forkserver  # type: ignore[attr-defined]
        mods = list(getattr(fs, "_preload_modules", None) or [])
        if "gpuguard._arm_forkserver" not in mods:
            fs._preload_modules = mods + ["gpuguard._arm_forkserver"]  # type: ignore[attr-defined]
    except Exception:  # another Python's internals: the workers are still armed against the forkserver
        pass


def _after_import(name: str, callback: Callable[[Any], None]) -> None:
    postimport: Any = sys.modules.get("gpuguard._postimport")  # loaded by the start-up hook
    if postimport is None:
        from . import _postimport as postimport  # imported with the package
    postimport.after_import(name, callback)


def _start_method() -> str:
    import multiprocessing
    try:
        return multiprocessing.get_start_method(allow_none=True) or "fork"
    except Exception:
        return "fork"
