"""gpuguard.diagnostics.monitoring — ``monitor()``: a thread that samples device memory, the processes holding the
device and this process's arenas every ``interval`` seconds, and hands each sample to its sinks, built
so that it cannot hurt the job it watches:

- it never initialises CUDA: every reading goes through the C library's report (``gg_report``), which
  reads the device through NVML (loaded at run time, no context) and the arenas from host-side counters;
- it never raises into the job: a failing reading or sink is counted (``errors``, ``last_error``) and the
  thread goes on; it is a daemon thread, so it never holds the interpreter's exit;
- it stops with ``stop()``, the end of a ``with`` block, or its guard's teardown (``guard=``).

Sinks (``to=``, one or a list): a callable (gets the sample dict); a path ending in ``.prom`` (a
Prometheus textfile for node_exporter, replaced atomically: written to a new temporary file opened with
O_CREAT|O_EXCL|O_NOFOLLOW in the same directory, then renamed over the path, so a reader never sees half
a file and a symlink planted at the temporary name is never followed); ``"http://127.0.0.1:PORT"`` (an
HTTP endpoint serving ``/metrics`` as Prometheus text and ``/json``; port 0 picks a free one, see
``.port``); any other path (JSON lines appended); a file object (JSON lines written); a
``logging.Logger`` (one info line per sample)."""
from __future__ import annotations

import ctypes
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Sequence, Union, cast

from .. import _lib
from ..errors import INT_MAX, check_int, check_interval
from ..guard import Guard
from .holding import format_bytes

__all__ = ["monitor", "Monitor", "report"]

_GG_REPORT_ALL = 0x7
_JSON, _PROM = 0, 1
_report_fn: Any = None
_libc: Any = None


def report(fmt: str = "json", what: int = _GG_REPORT_ALL) -> str:
    """The C library's report (``gg_report``) as text: "json" or "prometheus". Devices, the processes
    holding them and this process's arenas; no CUDA context is created."""
    global _report_fn, _libc
    if _report_fn is None:
        _report_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint)(
            ("gg_report", _lib.lib))
        _libc = ctypes.CDLL(None)
        _libc.open_memstream.restype = ctypes.c_void_p
        _libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        _libc.fclose.argtypes = [ctypes.c_void_p]
        _libc.free.argtypes = [ctypes.c_void_p]
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    f = _libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not f:
        raise OSError(ctypes.get_errno(), "gpuguard.monitor: open_memstream failed")
    try:
        rc = _report_fn(f, _PROM if fmt.startswith("prom") else _JSON, what)
    finally:
        _libc.fclose(f)  # flushes; buf/size are valid after it
    try:
        text = ctypes.string_at(buf, size.value).decode("utf-8", errors="replace")
    finally:
        _libc.free(buf)
    if rc < 0:
        _lib.raise_for(rc)
    return text


def _write_textfile(path: str, text: str) -> None:
    """Replaces ``path`` atomically; the temporary file is new (O_EXCL) and never a followed symlink."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _BoundedHTTPServer(ThreadingHTTPServer):
    """At most ``max_handlers`` connections at once: idle connections cannot park threads and
    descriptors in the job without bound (enough of them made the job's own ``open()`` fail with
    EMFILE). Beyond the cap, the oldest connection that has not sent its request yet is evicted for
    the new one: refusing the newcomer let a crowd of idle connections, renewed as each timed out,
    keep every scrape out (0 of 6). Each connection has ``deadline`` seconds in all, however slowly
    its bytes come (a socket timeout alone restarts with every byte)."""

    daemon_threads = True
    max_handlers = 8
    deadline = 5.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(self.max_handlers)
        self._lock = threading.Lock()
        self._conns: Dict[Any, List[Any]] = {}  # socket -> [accepted at (monotonic), request read]

    def busy(self, request: Any) -> None:
        """The handler has read the request: no longer idle, not evicted for a newcomer."""
        with self._lock:
            if request in self._conns:
                self._conns[request][1] = True

    def _cut(self, request: Any) -> None:
        try:
            request.shutdown(socket.SHUT_RDWR)  # the handler's read or write returns at once
        except OSError:
            pass

    def service_actions(self) -> None:  # serve_forever calls it every poll interval
        now = time.monotonic()
        with self._lock:
            late = [r for r, (t0, _) in self._conns.items() if now - t0 > self.deadline]
        for r in late:
            self._cut(r)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.service_actions()
        if not self._slots.acquire(blocking=False):
            with self._lock:
                idle = sorted((t0, id(r), r) for r, (t0, read) in self._conns.items() if not read)
            if idle:
                self._cut(idle[0][2])
            # the evicted handler ends at once and gives its slot back
            if not (idle and self._slots.acquire(timeout=1.0)):
                self.shutdown_request(request)
                return
        with self._lock:
            self._conns[request] = [time.monotonic(), False]
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a connection cut for its deadline or evicted fails its write; that is no news for
        the job's stderr."""

    def _forget(self, request: Any) -> None:
        with self._lock:
            self._conns.pop(request, None)
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)


def _public(sample: Dict[str, Any]) -> Dict[str, Any]:
    """The sample for /json: other users' command lines left out, as ``gpuguard ps`` and /metrics do.
    The uid decides, not the class: a monitor running as root classes other users' processes
    stranded or detached, not foreign (the library's report leaves them out too)."""
    me = os.geteuid()
    procs = [dict(p, command="") if p.get("uid") != me else p for p in sample.get("processes", [])]
    return dict(sample, processes=procs) if "processes" in sample else sample


class _Http:
    def __init__(self, url: str, mon: "Monitor") -> None:
        rest = url.split("://", 1)[1].rstrip("/")
        host, _, port = rest.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"

        class Handler(BaseHTTPRequestHandler):
            timeout = 2.0  # seconds to send the request; the socket's timeout for the answer too

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                cast(_BoundedHTTPServer, self.server).busy(self.request)
                if self.path.split("?")[0] in ("/metrics", "/"):
                    body, ctype = mon.last_prometheus.encode(), "text/plain; version=0.0.4; charset=utf-8"
                elif self.path.split("?")[0] == "/json":
                    body, ctype = json.dumps(_public(mon.last or {})).encode(), "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _BoundedHTTPServer((host, int(port or 0)), Handler)
        self.port = self.server.server_address[1]
        bound = cast(str, self.server.server_address[0])  # an AF_INET/AF_INET6 address: text
        if not (bound.startswith("127.") or bound in ("::1", "localhost")):
            sys.stderr.write(f"gpuguard.monitor: warning: {url} is not a loopback address: other machines can "
                             "read /metrics (users and GPU memory of the processes on this machine's GPUs)\n")
        self.thread = threading.Thread(target=self.server.serve_forever, name="gpuguard-monitor-http",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Sink = Union[str, Callable[[Dict[str, Any]], Any], Any]


class Monitor:
    """A running monitor; see ``monitor``. ``samples`` counts the samples taken, ``last`` is the latest
    (a dict), ``last_prometheus`` its Prometheus text, ``errors``/``last_error`` what went wrong, ``port``
    the HTTP endpoint's port, ``sample_seconds`` the mean cost of one sample."""

    def __init__(self, interval: float = 5.0, to: Union[Sink, Sequence[Sink], None] = None, device: int = 0,
                 guard: Any = None, processes: bool = True) -> None:
        self.interval = check_interval("gpuguard.monitor", interval)  # 0, negative, NaN: a busy loop
        check_int("gpuguard.monitor", "device", device, 0, INT_MAX)
        if guard is not None and not isinstance(guard, Guard):
            raise TypeError(f"gpuguard.monitor: guard must be a Guard or None, not {type(guard).__name__}")
        self.device = device
        self.what = 0x7 if processes else 0x5
        self.samples = 0
        self.errors = 0
        self.last_error: Optional[str] = None
        self.last: Optional[Dict[str, Any]] = None
        self.last_prometheus = ""
        self.port: Optional[int] = None
        self._spent = 0.0
        self._stop = threading.Event()
        self._sinks: List[Callable[[Dict[str, Any], str], None]] = []
        self._closers: List[Callable[[], None]] = []
        self._prom_wanted = False
        try:
            for sink in (to if isinstance(to, (list, tuple)) else [to] if to is not None else []):
                self._add(sink)
        except BaseException:  # a bad sink after good ones: close what was opened, leak nothing
            for close in self._closers:
                close()
            raise
        self._guard_id = guard.on_teardown(self.stop, name="gpuguard.monitor") if guard is not None else None
        self._guard = guard
        self._thread = threading.Thread(target=self._run, name="gpuguard-monitor", daemon=True)
        self._thread.start()

    @property
    def sample_seconds(self) -> float:
        return self._spent / self.samples if self.samples else 0.0

    def _add(self, sink: Sink) -> None:
        if callable(sink) and not isinstance(sink, logging.Logger):
            self._sinks.append(lambda s, p: sink(s))
        elif isinstance(sink, logging.Logger):
            self._sinks.append(lambda s, p: sink.info("%s", _summary(s)))
        elif isinstance(sink, str) and sink.startswith("http://"):
            h = _Http(sink, self)
            self.port = h.port
            self._prom_wanted = True
            self._closers.append(h.close)
        elif isinstance(sink, str) and sink.endswith(".prom"):
            # Its directory is checked now, not at the first sample in the thread, where only
            # ``errors`` would know.
            d = os.path.dirname(os.path.abspath(sink))
            if not os.path.isdir(d):
                raise FileNotFoundError(f"gpuguard.monitor: {sink}: the directory {d} does not exist")
            if not os.access(d, os.W_OK | os.X_OK):
                raise PermissionError(f"gpuguard.monitor: {sink}: the directory {d} is not writable")
            self._prom_wanted = True
            self._sinks.append(self._warn_once(sink, lambda s, p: _write_textfile(sink, p)))
        elif isinstance(sink, str):
            f = open(sink, "a", encoding="utf-8")  # a missing directory raises here, in the caller

            def append_line(s: Dict[str, Any], p: str, f: Any = f) -> None:
                f.write(json.dumps(s) + "\n")
                f.flush()

            self._sinks.append(self._warn_once(sink, append_line))
            self._closers.append(f.close)
        elif hasattr(sink, "write"):
            stream: Any = sink

            def write_line(s: Dict[str, Any], p: str) -> None:
                stream.write(json.dumps(s) + "\n")
                stream.flush()

            self._sinks.append(write_line)
        else:
            raise TypeError(f"gpuguard.monitor: unknown sink {sink!r} (a callable, a path, a .prom path, "
                            "http://127.0.0.1:PORT, a file object or a logging.Logger)")

    def _warn_once(self, where: str, write: Callable[[Dict[str, Any], str], Any]) -> Callable[[Dict[str, Any], str], None]:
        """A file sink that says on stderr, once, that it failed (a full disk, a directory removed later);
        the failures are counted in ``errors`` as before."""
        warned = [False]

        def sink(s: Dict[str, Any], p: str) -> None:
            try:
                write(s, p)
            except Exception as e:
                if not warned[0]:
                    warned[0] = True
                    sys.stderr.write(f"gpuguard.monitor: writing {where} failed: {e} (said once; "
                                     "Monitor.errors counts each failure)\n")
                raise
        return sink

    def sample(self) -> Dict[str, Any]:
        """Takes one sample now (the thread calls this) and gives it to the sinks."""
        t0 = time.perf_counter()
        data = json.loads(report("json", self.what))
        data["time"] = time.time()
        data["pid"] = os.getpid()
        mine = [p for p in data.get("processes", []) if p.get("pid") == os.getpid()]
        data["process_used_bytes"] = mine[0].get("used_bytes") if mine else None
        prom = report("prometheus", self.what) if self._prom_wanted else ""
        self.last, self.last_prometheus = data, prom
        self._spent += time.perf_counter() - t0
        self.samples += 1
        for sink in self._sinks:
            try:
                sink(data, prom)
            except Exception as e:  # a sink must never stop the others or the thread
                self.errors += 1
                self.last_error = f"sink: {e}"
        return data

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as e:
                self.errors += 1
                self.last_error = str(e)
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        """Stops the thread (after the sample in progress) and closes the sinks. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for close in self._closers:
            try:
                close()
            except Exception:
                pass
        if self._guard is not None and self._guard_id is not None and not self._guard.closed:
            try:
                self._guard.cancel(self._guard_id)
            except Exception:
                pass  # already running as the teardown
        self._guard = None

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _summary(s: Dict[str, Any]) -> str:
    devs = "; ".join(f"device {d['index']} used {format_bytes(d['used_bytes'])} of {format_bytes(d['total_bytes'])}"
                     for d in s.get("devices", []))
    ar = ", ".join(f"{a['name'] or 'arena'} {format_bytes(a['bytes_in_use'])} in use/{format_bytes(a['bytes_mapped'])} "
                   "mapped" for a in s.get("arenas", []))
    return f"gpuguard: {devs}" + (f"; arenas: {ar}" if ar else "")


def monitor(interval: float = 5.0, to: Union[Sink, Sequence[Sink], None] = None, device: int = 0,
            guard: Any = None, processes: bool = True) -> Monitor:
    """Starts a monitor thread (see the module's doc): a first sample at once, then one every
    ``interval`` seconds, to the sinks in ``to``. ``guard``: stops at that Guard's teardown.
    ``processes=False`` leaves out the per-process list (the /proc scan is most of a sample's cost)."""
    return Monitor(interval, to, device, guard, processes)
