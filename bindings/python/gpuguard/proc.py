"""gpuguard.proc — child processes that never outlive the job: spawn, adopt, teardown with a receipt,
subreaper, and the per-user session registry."""
from __future__ import annotations

import json
import os
from ctypes import byref, c_char_p, c_int, c_size_t, c_void_p, create_string_buffer
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._lib import C, Process, SessionRecord, SpawnOptions, _check, enc
from .guard import Guard
from .query import _process_row

PathLike = Union[str, bytes, "os.PathLike[str]"]


def _guard_handle(guard: Optional[Guard]) -> Optional[int]:
    """None means this process's default set (no guard tears it down: call teardown() yourself)."""
    if guard is not None and not isinstance(guard, Guard):
        raise TypeError(f"gpuguard: guard must be a Guard or None, not {type(guard).__name__}")
    return None if guard is None else guard._handle()


def _b(s: Union[str, bytes, "os.PathLike[str]"]) -> bytes:
    return os.fsencode(s)


def spawn(argv: Sequence[PathLike], guard: Optional[Guard] = None, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[PathLike] = None, new_process_group: bool = False, close_device_fds: bool = False,
          stdin: Optional[int] = None, stdout: Optional[int] = None, stderr: Optional[int] = None,
          death_signal: bool = True, pid_ns: str = "off") -> int:
    """Starts ``argv`` as a child in ``guard``'s set (None: the default set) and returns its pid.

    The child gets SIGKILL when this process dies (``death_signal``; tied to the process, not the calling
    thread), and is ended by the guard's teardown or ``teardown()``. ``env`` replaces the environment
    (None inherits ours); ``stdin``/``stdout``/``stderr`` are file descriptors (None inherits);
    ``new_process_group`` makes the child lead its own group (teardown signals the group);
    ``close_device_fds`` closes inherited /dev/nvidia* descriptors before exec. ``pid_ns`` ("off", "auto"
    or "on") runs the child in its own PID namespace, so that all of it dies with this process; the pid
    returned is then the namespace's keeper (see gg_spawn_pid_ns_t); ``pid_ns_probe()`` says whether
    the system allows one.
    Raises NotFoundError for a missing program, PermissionError when it may not run."""
    from .errors import INT_MAX, check_int, check_no_nul
    call = "gpuguard.spawn"
    if isinstance(argv, (str, bytes)) or not hasattr(argv, "__iter__"):
        raise TypeError(f"{call}: argv must be a list of str, bytes or paths, not {type(argv).__name__}")
    for name, fd in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
        if fd is not None:
            check_int(call, name, fd, 0, INT_MAX)
    if not isinstance(pid_ns, str):
        raise TypeError(f"{call}: pid_ns must be 'off', 'auto' or 'on', not {type(pid_ns).__name__}")
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"{call}: env must be a mapping of str to str, not {type(env).__name__}")
    args = [check_no_nul(call, "argument", _b(a)) for a in argv]
    if not args:
        from .errors import GG_EINVAL, InvalidArgumentError
        raise InvalidArgumentError("gpuguard.spawn: argv is empty", GG_EINVAL, "GG_EINVAL")
    c_argv = (c_char_p * (len(args) + 1))(*args, None)
    opts = SpawnOptions()
    C.gg_spawn_options_init(byref(opts))
    keep: List[Any] = []
    if env is not None:
        pairs = [check_no_nul("gpuguard.spawn", "environment entry", _b(k) + b"=" + _b(v)) for k, v in env.items()]
        c_env = (c_char_p * (len(pairs) + 1))(*pairs, None)
        keep.append(c_env)
        opts.env = c_env
    c_cwd = None if cwd is None else check_no_nul("gpuguard.spawn", "cwd", _b(cwd))
    opts.cwd = c_cwd
    opts.new_process_group = int(new_process_group)
    opts.close_device_fds = int(close_device_fds)
    opts.death_signal = int(death_signal)
    modes = {"off": 0, "auto": 1, "on": 2}
    if pid_ns not in modes:
        from .errors import GG_EINVAL, InvalidArgumentError
        raise InvalidArgumentError("gpuguard.spawn: pid_ns %r: 'off', 'auto' or 'on' expected" % (pid_ns,),
                                   GG_EINVAL, "GG_EINVAL")
    opts.pid_ns = modes[pid_ns]
    opts.stdin_fd = -1 if stdin is None else stdin
    opts.stdout_fd = -1 if stdout is None else stdout
    opts.stderr_fd = -1 if stderr is None else stderr
    pid = c_int(0)
    C.gg_proc_spawn(_guard_handle(guard), c_argv, byref(opts), byref(pid))
    return pid.value


def pid_ns_probe() -> bool:
    """Whether ``spawn(..., pid_ns="on")`` can work here (root, or unprivileged user namespaces)."""
    return C.gg_proc_pid_ns_probe() > 0


def adopt(pid: int, guard: Optional[Guard] = None, start_time: Optional[int] = None) -> None:
    """Records a process started elsewhere (multiprocessing, DataLoader workers) in ``guard``'s set, so its
    teardown ends it. With ``start_time`` (clock ticks after boot, as ``processes()``/``orphans()`` report
    it) the pid is adopted only if it still names that process: NotFoundError otherwise, so a reused pid is
    never signalled. Adopted processes get no death signal: use ``set_subreaper`` or ``arm_child``."""
    from .errors import INT_MAX, check_int
    check_int("gpuguard.adopt", "pid", pid, 1, INT_MAX)  # pid_t: 2**32 + pid would adopt pid
    if start_time is not None:
        check_int("gpuguard.adopt", "start_time", start_time, 0, (1 << 64) - 1)
    C.gg_proc_adopt_ex(_guard_handle(guard), pid, start_time or 0)


def teardown(guard: Optional[Guard] = None, grace_ms: int = 2000) -> Dict[str, Any]:
    """Ends every process of ``guard``'s set (None: the default set) and their descendants: SIGTERM,
    ``grace_ms`` to exit, SIGKILL, reaped. Returns the receipt as a dict (``grace_ms``, ``elapsed_ms``,
    ``alive``, ``processes``: pid, ppid, start_time, command, found, sent, end, code, state). When some
    process could not be ended, raises TimeoutError (gpuguard.TimeoutError) with the receipt in its ``receipt`` attribute."""
    receipt = c_void_p()
    from .errors import INT_MAX, check_int
    check_int("gpuguard.teardown", "grace_ms", grace_ms, 0, INT_MAX)
    if guard is not None and not isinstance(guard, Guard):
        raise TypeError(f"gpuguard.teardown: guard must be a Guard or None, not {type(guard).__name__}")
    rc = C.gg_proc_teardown_ex(_guard_handle(guard), grace_ms, byref(receipt))
    out: Dict[str, Any] = {}
    if receipt.value:
        try:
            need = c_size_t(0)
            C.gg_proc_receipt_json(receipt, None, 0, byref(need))
            buf = create_string_buffer(need.value + 1)
            _check(C.gg_proc_receipt_json(receipt, buf, len(buf), byref(need)), None, None)
            out = json.loads(buf.value.decode(errors="replace"))
        finally:
            C.gg_proc_receipt_free(receipt)
    if rc < 0:
        try:
            _check(rc, None, None)
        except Exception as e:
            setattr(e, "receipt", out)  # noqa: B010 (not a declared attribute of Exception)
            raise
    return out


def arm_child() -> None:
    """Call in a child right after ``os.fork()``: it gets SIGKILL when the parent that forked it dies
    (race-free: a parent already gone kills the child at once)."""
    C.gg_proc_arm_child()


def arm_worker() -> int:
    """Call first thing in a worker process (a multiprocessing child, a DataLoader worker, a rank started
    by a launcher): it gets SIGKILL when its parent dies (:func:`arm_child`; a parent already gone ends it
    at once), and drops the /dev/nvidia* descriptors it inherited (:func:`close_device_fds`), which
    would otherwise keep the parent's device memory held after the parent died. Returns how many
    descriptors were closed. ``GPUGUARD_WORKERS=1`` (or ``GPUGUARD_TORCH=1``) does the same in every
    multiprocessing worker without a change to the script (gpuguard._workers: tied to the parent process
    rather than its forking thread, and to the parent named when the worker was started)."""
    C.gg_proc_arm_child()
    return int(C.gg_proc_close_device_fds())


def set_subreaper(on: bool = True) -> None:
    """Makes this process a child subreaper (or stops): orphaned descendants become our children, and a
    teardown ends them with the rest."""
    C.gg_proc_set_subreaper(1 if on else 0)


def close_device_fds() -> int:
    """Closes every inherited /dev/nvidia* descriptor of this process (for forked workers that do not use
    CUDA: while they hold them, the parent's memory is not freed when it dies). Returns how many."""
    return int(C.gg_proc_close_device_fds())


def registry_register(devices: Optional[str] = None) -> None:
    """Records this process in the per-user session registry (a leader with a new session id, or a worker
    of the session in GPUGUARD_SESSION), so ``gpuguard ps``/``orphans()`` can tell live workers from
    orphans. The session id is also put into ``os.environ`` (the C library never writes the process
    environment), so children started from Python (``subprocess``, ``multiprocessing``'s spawn and
    forkserver workers) join the session as children started by :func:`spawn` do."""
    C.gg_registry_register(enc(devices))
    os.environ["GPUGUARD_SESSION"] = registry_session()


def registry_session() -> str:
    """This process's session id ("" before registering or inheriting one)."""
    buf = create_string_buffer(64)
    C.gg_registry_session(buf, len(buf))
    return buf.value.decode()


def registry_unregister() -> None:
    """Removes this process's registry record (none is not an error)."""
    C.gg_registry_unregister()


def registry_list() -> List[Dict[str, Any]]:
    """The session registry's records: pid, ppid, start_time, session, role, devices, command, stale,
    parent_alive."""
    count = c_size_t(0)
    rows = (SessionRecord * 0)()
    for _ in range(4):  # the registry can grow between asking for its size and reading it
        rows = (SessionRecord * (count.value + 8))()
        C.gg_registry_list(rows, len(rows), byref(count))
        if count.value <= len(rows):
            break
    return [{
        "pid": r.pid, "ppid": r.ppid, "start_time": r.start_time, "session": r.session.decode(),
        "role": r.role.decode(), "devices": r.devices.decode(errors="replace"), "command": r.command.decode(errors="replace"),
        "stale": bool(r.stale), "parent_alive": bool(r.parent_alive),
    } for r in rows[:min(count.value, len(rows))]]


def orphans() -> List[Dict[str, Any]]:
    """The caller's own orphaned processes (gpuguard sessions whose leader died, orphaned multiprocessing
    workers holding device memory), each with the ``start_time`` to pass to ``adopt`` or to check before
    acting on the pid."""
    count = c_size_t(0)
    rows = (Process * 0)()
    for _ in range(4):
        rows = (Process * (count.value + 8))()
        C.gg_orphan_list(rows, len(rows), byref(count))
        if count.value <= len(rows):
            break
    return [_process_row(p) for p in rows[:min(count.value, len(rows))]]
