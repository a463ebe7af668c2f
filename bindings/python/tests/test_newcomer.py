"""What a newcomer stumbles on, and the monitor's HTTP endpoint under a crowd: exception names that
are gpuguard.TimeoutError etc. (both GpuGuardError and the built-in; the old underscore names kept),
dir(gpuguard), a relative GPUGUARD_LIBRARY made absolute for children, the monitor's file sinks said
at construction and once on stderr, idle HTTP clients that cannot exhaust the job's threads and
descriptors, other users' command lines out of /json, the headers and CMake package of an installed
wheel, and `gpuguard plot` from a venv's command without the venv activated."""
import builtins
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import gpuguard
from gpuguard import _lib

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))
INSTALLED = os.environ.get("GPUGUARD_TEST_INSTALLED") == "1"


def test_exception_names_derive_from_both():
    for name, builtin in (("TimeoutError", builtins.TimeoutError), ("IOError", builtins.OSError),
                          ("PermissionError", builtins.PermissionError)):
        cls = getattr(gpuguard, name)
        assert cls is not builtin and issubclass(cls, gpuguard.GpuGuardError) and issubclass(cls, builtin), cls
        assert cls.__module__ == "gpuguard.errors" and cls.__name__ == name
        assert getattr(gpuguard, name + "_") is cls  # the old name still works
    assert gpuguard.errors.error_for(gpuguard.errors.GG_ETIMEDOUT, "late", "GG_ETIMEDOUT").__class__ is gpuguard.TimeoutError


def test_dir_shows_the_api():
    names = dir(gpuguard)
    for n in ("holders", "rounds", "monitor", "record", "Arena", "TimeoutError", "cmake_prefix_path"):
        assert n in names, n
    assert "annotations" not in names and not hasattr(gpuguard, "annotations")


def test_relative_library_is_made_absolute_for_children(tmp_path):
    if INSTALLED:
        pytest.skip("GPUGUARD_LIBRARY is not used with an installed wheel")
    libdir = os.path.dirname(_lib.path)
    rel = os.path.relpath(_lib.path, libdir)
    rel = os.path.join(".", rel)
    code = ("import os, subprocess, sys, gpuguard\n"
            "v = os.environ['GPUGUARD_LIBRARY']\n"
            "assert os.path.isabs(v), v\n"
            f"r = subprocess.run([sys.executable, '-c', 'import gpuguard; print(gpuguard._lib.path)'], cwd={str(tmp_path)!r},"
            " capture_output=True, text=True)\n"
            "assert r.returncode == 0, r.stderr\n"
            "print(r.stdout.strip())\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=libdir, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PKG_PARENT, GPUGUARD_LIBRARY=rel))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.abspath(_lib.path)


def test_monitor_file_sink_checked_at_construction(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gpuguard.monitor(interval=60, to=str(tmp_path / "missing" / "gpu.prom"))
    with pytest.raises(FileNotFoundError):
        gpuguard.monitor(interval=60, to=str(tmp_path / "missing" / "log.jsonl"))


def test_monitor_file_sink_failure_said_once(tmp_path, capfd):
    d = tmp_path / "d"
    d.mkdir()
    mon = gpuguard.monitor(interval=0.05, to=str(d / "gpu.prom"), processes=False)
    try:
        deadline = time.monotonic() + 10
        while mon.samples < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(d)  # a directory gone later: every write fails from now on
        while mon.errors < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        mon.stop()
    assert mon.errors >= 3, (mon.errors, mon.last_error)
    err = capfd.readouterr().err
    assert err.count("gpuguard.monitor: writing") == 1, err


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_monitor_http_idle_clients_are_bounded():
    mon = gpuguard.monitor(interval=60, to="http://127.0.0.1:0", processes=False)
    try:
        threads0, fds0 = threading.active_count(), _fds()
        idle = [socket.create_connection(("127.0.0.1", mon.port)) for _ in range(50)]
        time.sleep(0.5)
        # 50 idle clients: before, 50 parked threads and 50 descriptors in the job, for ever.
        assert threading.active_count() - threads0 <= 8, threading.active_count() - threads0
        assert _fds() - fds0 <= 50 + 9, _fds() - fds0  # our 50 client ends, at most 8 served + slack
        t0 = time.monotonic()
        deadline = t0 + 15
        body = None
        while body is None and time.monotonic() < deadline:  # a slot frees when an idle client times out
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{mon.port}/metrics", timeout=5).read()
            except OSError:
                time.sleep(0.1)
        assert body is not None and b"gpuguard_build_info" in body
        assert time.monotonic() - t0 < 6, time.monotonic() - t0
        for s in idle:
            s.close()
        time.sleep(2.5)  # the handlers' 2 s timeout
        assert threading.active_count() - threads0 <= 1, threading.active_count() - threads0
    finally:
        mon.stop()


def test_monitor_json_leaves_out_other_users_commands():
    from gpuguard.diagnostics.monitoring import _public
    # The uid decides, not the class: as root, another user's process is classed stranded or detached.
    other = os.geteuid() + 1
    s = {"processes": [{"pid": 1, "uid": other, "class": "foreign", "command": "trainer --token=hunter2"},
                       {"pid": 3, "uid": other, "class": "detached", "command": "serve --token=hunter2"},
                       {"pid": 2, "uid": os.geteuid(), "class": "unknown", "command": "mine"}]}
    out = _public(s)
    assert [p["command"] for p in out["processes"]] == ["", "", "mine"], out
    assert s["processes"][0]["command"].endswith("hunter2")  # the sample itself is left as it was
    assert "hunter2" not in json.dumps(out)


@pytest.mark.skipif(not INSTALLED, reason="GPUGUARD_TEST_INSTALLED=1 tests an installed wheel")
def test_installed_wheel_has_headers_and_cmake_package():
    assert os.path.isfile(os.path.join(gpuguard.get_include(), "gpuguard", "gpuguard.h"))
    assert os.path.isfile(os.path.join(gpuguard.get_cmake_dir(), "gpuguardConfig.cmake"))
    assert os.path.isdir(os.path.join(gpuguard.cmake_prefix_path, "lib", "cmake", "gpuguard"))


@pytest.mark.skipif(not INSTALLED, reason="GPUGUARD_TEST_INSTALLED=1 tests an installed wheel")
def test_plot_from_a_venv_command_without_activation(tmp_path):
    exe = shutil.which("gpuguard", path=os.path.dirname(sys.executable))
    assert exe
    tl = tmp_path / "t.jsonl"
    tl.write_text('{"type":"meta","version":1,"start":1000.0,"device":0,"source":"test","series":["driver_used"]}\n'
                  '{"type":"sample","t":0.0,"step":0,"driver_used":1024}\n'
                  '{"type":"sample","t":1.0,"step":1,"driver_used":2048}\n')
    # Not activated: PATH has no venv, and the python3 there may lack gpuguard (the old failure).
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "GPUGUARD_PYTHON", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    out = tmp_path / "m.html"
    r = subprocess.run([exe, "plot", str(tl), "-o", str(out)], capture_output=True, text=True, timeout=120,
                       env=env, cwd=str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert out.exists() and "<html" in out.read_text().lower()


def test_host_backend_processes_say_no_gpu_like_c_and_cli():
    code = ("import gpuguard\n"
            "assert gpuguard.device_info(0)['backend'] == 'host'\n"
            "try:\n"
            "    gpuguard.processes()\n"
            "except gpuguard.NoDeviceError as e:\n"
            "    assert e.code == gpuguard.errors.GG_ENODEV and 'no NVIDIA GPU' in str(e), e\n"
            "    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PKG_PARENT, GPUGUARD_BACKEND="host",
                                GPUGUARD_NVML_LIBRARY="/nonexistent/libnvidia-ml.so.1"))
    assert r.stdout.strip() == "ok", (r.stdout, r.stderr)
