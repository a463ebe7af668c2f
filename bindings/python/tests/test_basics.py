"""The binding's own behaviour: loading, errors carrying the library's message, devices, processes."""
import os
import signal
import subprocess
import sys

import pytest

import gpuguard
from gpuguard import _lib, errors


def test_version_matches_library():
    assert gpuguard.version() == gpuguard.__version__


def test_every_code_has_its_exception():
    for code, cls in errors.BY_CODE.items():
        assert issubclass(cls, gpuguard.GpuGuardError)
        assert cls.code == code
        assert _lib.lib.gg_err_name(code).decode() == cls.name
    assert issubclass(gpuguard.OutOfMemoryError, MemoryError)
    assert issubclass(gpuguard.InvalidArgumentError, ValueError)


def test_bad_backend_raises_with_the_library_message(monkeypatch):
    monkeypatch.setenv("GPUGUARD_BACKEND", "rocm")
    with pytest.raises(gpuguard.InvalidArgumentError) as e:
        gpuguard.device_count()
    assert "GPUGUARD_BACKEND='rocm'" in str(e.value)
    assert e.value.code == -1 and e.value.name == "GG_EINVAL"


def test_host_device_info():
    d = gpuguard.device_info(0)
    assert d["backend"] == "host"
    assert d["total_bytes"] == 256 << 20
    assert d["free_bytes"] + d["used_bytes"] == d["total_bytes"]
    with pytest.raises(gpuguard.NoDeviceError, match="device 5 does not exist"):
        gpuguard.device_info(5)
    # ctypes would wrap 2**32 to device 0: every device query refuses what C's int cannot hold.
    for f in (gpuguard.device_info, gpuguard.device_telemetry, gpuguard.processes):
        with pytest.raises(gpuguard.InvalidArgumentError, match="device 4294967296 is out of range"):
            f(2**32)


def test_telemetry_from_a_stand_in_nvml(monkeypatch):
    fake = os.environ.get("GPUGUARD_FAKE_NVML")
    if not fake:
        pytest.skip("GPUGUARD_FAKE_NVML (the test build's libfake_nvml.so) is not set")
    monkeypatch.setenv("GPUGUARD_NVML_LIBRARY", fake)
    monkeypatch.setenv("FAKE_NVML_TELEMETRY", "87,40,61,412500,700000")
    t = gpuguard.device_telemetry(0)
    assert t == {"index": 0, "utilization_gpu": 87, "utilization_memory": 40, "temperature_c": 61,
                 "power_watts": 412.5, "power_limit_watts": 700.0}
    monkeypatch.setenv("FAKE_NVML_TELEMETRY", "5,6,,,")  # no temperature or power sensor: None, not -1
    t = gpuguard.device_telemetry(0)
    assert (t["utilization_gpu"], t["temperature_c"], t["power_watts"]) == (5, None, None)


def test_telemetry_without_nvml(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUGUARD_NVML_LIBRARY", str(tmp_path / "no-such-libnvidia-ml.so"))
    with pytest.raises(gpuguard.NotSupportedError):
        gpuguard.device_telemetry(0)
    with pytest.raises((gpuguard.NoDeviceError, gpuguard.InvalidArgumentError)):
        gpuguard.device_telemetry(-1)


def test_processes_from_a_stand_in_nvml(monkeypatch):
    fake = os.environ.get("GPUGUARD_FAKE_NVML")
    if not fake:
        pytest.skip("GPUGUARD_FAKE_NVML (the test build's libfake_nvml.so) is not set")
    # SIGHUP back to its default: a suite run under nohup would hand the child "ignores SIGHUP", which
    # rightly classes it as detached.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        monkeypatch.setenv("GPUGUARD_NVML_LIBRARY", fake)
        monkeypatch.setenv("FAKE_NVML_PROCS", f"{os.getpid()}:4096,{child.pid}:na")
        rows = {p["pid"]: p for p in gpuguard.processes(0)}
        assert rows[os.getpid()]["used_bytes"] == 4096
        assert rows[child.pid]["used_bytes"] is None
        assert rows[child.pid]["ppid"] == os.getpid()
        assert rows[child.pid]["class"] == "unknown"
        assert "time.sleep(30)" in rows[child.pid]["command"]
    finally:
        child.kill()
        child.wait()


def test_import_error_says_where_it_looked(tmp_path):
    env = dict(os.environ, GPUGUARD_LIBRARY=str(tmp_path / "nope.so"), LD_LIBRARY_PATH="")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(gpuguard.__file__)))
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {pkg!r}); import gpuguard"],
                       env=env, capture_output=True, text=True)
    if r.returncode == 0:
        pytest.skip("a libgpuguard is installed system-wide, so the import succeeds")
    assert "ImportError" in r.stderr
    assert "nope.so" in r.stderr and "GPUGUARD_LIBRARY" in r.stderr
