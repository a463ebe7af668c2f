"""gpuguard.guard — exit-path guards: cleanups (Python callables included) that run exactly once however
the work ends, without taking Python's SIGINT away from it."""
from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import weakref
from ctypes import byref, c_ulonglong, c_void_p
from typing import Any, Callable, Dict, List, Optional, cast

from ._lib import C, CLEANUP_FN, GuardOptions, enc
from .errors import GG_ESTATE, INT_MAX, GpuGuardError, StateError, check_int, check_str

SIGINT = 0x001
"""Handle SIGINT (GG_GUARD_SIGINT). Not in the default set: Python turns SIGINT into KeyboardInterrupt."""
SIGTERM = 0x002
"""Handle SIGTERM."""
SIGHUP = 0x004
"""Handle SIGHUP."""
SIGQUIT = 0x008
"""Handle SIGQUIT."""
SIGNALS_FATAL = 0x010 | 0x020 | 0x040 | 0x080 | 0x100
"""SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: async-signal-safe work only (children killed, a report);
Python cleanups do not run on these."""
DEFAULT_SIGNALS = SIGTERM | SIGHUP | SIGQUIT | SIGNALS_FATAL
"""What a Python Guard handles by default: every signal the C library handles except SIGINT."""

# Live guards of this process, oldest first: torn down (newest first) by the atexit hook below, while the
# interpreter can still run their Python cleanups. The C library's own exit() hook runs after the
# interpreter is finalised, too late for Python callables.
_live: "List[weakref.ref[Guard]]" = []
_live_lock = threading.Lock()


def _report_cleanup_error(name: str) -> None:
    try:
        sys.stderr.write(f"gpuguard: cleanup {name!r} raised; the teardown goes on:\n")
        traceback.print_exc()
    except Exception:  # stderr may be gone at exit; a cleanup must never raise into C
        pass


def _destroy(handle: int, owner_pid: int, callbacks: Dict[int, Any]) -> None:
    # `callbacks` is only held: the CFUNCTYPE objects must outlive the teardown that calls them.
    # A forked child never tears down its parent's guard (the library would refuse with GG_ESTATE).
    if os.getpid() == owner_pid:
        try:
            C.gg_guard_destroy(handle)
        except Exception:
            pass


class Guard:
    """A guard: a device context kept for the guard's lifetime and a LIFO registry of cleanups, each run
    exactly once — at ``close()`` / the end of the ``with`` block (also when an exception or
    KeyboardInterrupt leaves it: the teardown runs, then the exception propagates unchanged), at
    interpreter exit (``run_at_exit``), or on a handled signal (SIGTERM, SIGHUP, SIGQUIT: the teardown runs
    on the library's guard thread, then the process ends as it would have without gpuguard).

    SIGINT is left to Python by default (KeyboardInterrupt ends the ``with`` block, which tears down).
    ``handle_sigint=True`` lets the library handle it: teardown first, then Python's own handler runs, so
    KeyboardInterrupt still arrives. ``signals`` (bits of this module) overrides the set entirely.

    Arenas created while the guard lives (same backend and device) attach to it: its teardown gives their
    memory back. Processes spawned or adopted with ``guard=`` end with it (``child_grace_ms``).

    A forked child must not use an inherited guard: calls raise StateError, and the child's exit never
    runs the parent's cleanups."""

    def __init__(self, device: int = 0, backend: Optional[str] = None, signals: Optional[int] = None,
                 run_at_exit: bool = True, teardown_timeout_ms: int = 10000, leak_report: Optional[str] = None,
                 name: Optional[str] = None, child_grace_ms: int = 2000, handle_sigint: bool = False,
                 reset_context: bool = False) -> None:
        if signals is None:
            signals = DEFAULT_SIGNALS | (SIGINT if handle_sigint else 0)
        call = "gpuguard.Guard"
        check_int(call, "device", device, 0, INT_MAX)
        check_int(call, "signals", signals, 0, (1 << 32) - 1)
        check_int(call, "teardown_timeout_ms", teardown_timeout_ms, 0, INT_MAX)
        check_int(call, "child_grace_ms", child_grace_ms, 0, INT_MAX)
        for label, text in (("backend", backend), ("leak_report", leak_report), ("name", name)):
            check_str(call, label, text)
        opts = GuardOptions()
        C.gg_guard_options_init(byref(opts))
        keep = (enc(backend), enc(leak_report), enc(name))  # must outlive the create call
        opts.device, opts.backend, opts.signals = device, keep[0], signals
        opts.run_at_exit, opts.reset_context = run_at_exit, reset_context
        opts.teardown_timeout_ms, opts.leak_report, opts.name = teardown_timeout_ms, keep[1], keep[2]
        opts.child_grace_ms = child_grace_ms
        h = c_void_p()
        C.gg_guard_create(byref(h), byref(opts))
        self._h: Optional[int] = h.value
        self._pid = os.getpid()
        self.device = device
        self.signals = signals
        self.run_at_exit = run_at_exit
        self.teardown_timeout_ms = teardown_timeout_ms
        """The longest its teardown at interpreter exit (or on a signal) may take; 0: no limit."""
        self._lock = threading.Lock()
        # id -> the CFUNCTYPE object: the C library holds a raw pointer to it until the guard is freed.
        self._callbacks: Dict[int, Any] = {}
        self._finalizer = weakref.finalize(self, _destroy, cast(int, h.value), self._pid, self._callbacks)
        self._finalizer.atexit = False  # exit is _teardown_at_exit's job (it honours run_at_exit)
        with _live_lock:
            _live[:] = [r for r in _live if r() is not None]
            _live.append(weakref.ref(self))

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise StateError("gpuguard.Guard: the guard is closed", GG_ESTATE, "GG_ESTATE")
        if os.getpid() != self._pid:
            raise StateError("gpuguard.Guard: this guard was created before fork(); a forked child must not "
                             "use its parent's guard: create a new one in the child", GG_ESTATE, "GG_ESTATE")
        return h

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._h is None

    def on_teardown(self, fn: Callable[[], Any], name: Optional[str] = None) -> int:
        """Registers ``fn()`` to run once at teardown (LIFO). An exception inside it is printed to stderr
        and the teardown goes on; it never propagates into the library. On a signal path it runs on the
        library's guard thread. Returns an id for ``cancel()``."""
        if not callable(fn):
            raise TypeError(f"gpuguard.Guard.on_teardown: fn must be callable, not {type(fn).__name__}")
        check_str("gpuguard.Guard.on_teardown", "name", name)
        label = name or getattr(fn, "__qualname__", None) or "cleanup"
        if not isinstance(label, str):
            label = "cleanup"

        def call(_user: Any) -> None:
            try:
                fn()
            except BaseException:  # KeyboardInterrupt and SystemExit included: nothing may escape into C
                _report_cleanup_error(label)

        cb = CLEANUP_FN(call)
        ident = c_ulonglong(0)
        C.gg_guard_on_teardown_ex(self._handle(), cb, None, enc(label), byref(ident))
        with self._lock:
            self._callbacks[ident.value] = cb
        return ident.value

    def cancel(self, ident: int) -> None:
        """Cancels a registration: its cleanup will not run (NotFoundError when it is not registered)."""
        check_int("gpuguard.Guard.cancel", "ident", ident, 0, (1 << 64) - 1)
        C.gg_guard_cancel(self._handle(), ident)
        with self._lock:
            self._callbacks.pop(ident, None)

    def close(self) -> None:
        """The teardown: cleanups LIFO, the guard's child processes, attached arenas' memory, the device.
        Safe to call twice; after a signal or exit teardown already ran it only frees the handle."""
        with self._lock:
            h, self._h = self._h, None
        if h is None:
            return
        self._finalizer.detach()
        try:
            if os.getpid() == self._pid:
                C.gg_guard_destroy(h)
        finally:
            # The library no longer calls them: the callback objects may go.
            with self._lock:
                self._callbacks.clear()

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except GpuGuardError as e:  # the original exception wins; the teardown's error is only shown
            sys.stderr.write(f"gpuguard: teardown while {exc_type.__name__} propagates: {e}\n")

    def __repr__(self) -> str:
        return f"Guard(device={self.device}, closed={self.closed})"


@atexit.register
def _teardown_at_exit() -> None:
    """Interpreter exit: tear down this process's live guards, newest first, while Python can still run
    their cleanups. Guards inherited through fork() are skipped: they are the parent's."""
    with _live_lock:
        guards = [r() for r in reversed(_live)]
        _live.clear()
    for g in guards:
        if g is None or g.closed or g._pid != os.getpid() or not g.run_at_exit:
            continue
        # Bounded as on the signal and exit() paths: a cleanup that never returns must not keep the
        # process alive after the script ended. Past the limit the process ends (status 1).
        limit = g.teardown_timeout_ms / 1000.0
        timer = threading.Timer(limit, _exit_overdue, (g, limit)) if limit > 0 else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            g.close()
        except Exception as e:
            sys.stderr.write(f"gpuguard: teardown at exit: {e}\n")
        finally:
            if timer is not None:
                timer.cancel()


def _exit_overdue(g: Guard, limit: float) -> None:
    try:
        sys.stderr.write(f"gpuguard: the teardown at exit of {g!r} took more than teardown_timeout_ms "
                         f"({limit * 1000:.0f} ms): ending the process\n")
        sys.stderr.flush()
    finally:
        os._exit(1)
