"""gpuguard.query — devices, their memory, and the processes holding them."""
from __future__ import annotations

from ctypes import byref, c_int, c_size_t
from typing import Any, Dict, List

from ._lib import C, DeviceInfo, DeviceTelemetry, Process
from .errors import INT_MAX, check_int

_INT_MIN = -INT_MAX - 1


def device_count() -> int:
    """Number of devices on the selected backend (GPUGUARD_BACKEND; the host backend has one)."""
    n = c_int(0)
    C.gg_device_count(byref(n))
    return n.value


def device_info(device: int = 0) -> Dict[str, Any]:
    """Name, UUID, backend, memory (total/free/used bytes), compute capability, driver version and VMM
    support of one device, with its free memory as the driver reports it now."""
    check_int("gpuguard.device_info", "device", device, _INT_MIN, INT_MAX)  # C says which ordinals exist
    d = DeviceInfo()
    C.gg_device_info(device, byref(d))
    return {
        "index": d.index, "backend": d.backend.decode(), "name": d.name.decode(errors="replace"),
        "uuid": d.uuid.decode(), "total_bytes": d.total_bytes, "free_bytes": d.free_bytes,
        "used_bytes": d.used_bytes, "compute_capability": (d.cc_major, d.cc_minor),
        "driver_version": d.driver_version, "vmm_supported": bool(d.vmm_supported),
    }


def device_telemetry(device: int = 0) -> Dict[str, Any]:
    """Utilisation (percent of the last sample period with a kernel running / with memory traffic),
    temperature (degrees Celsius) and power (watts, and the enforced limit) of one device, from NVML,
    as nvidia-smi shows them; a reading the device does not offer is None. Creates no CUDA context.
    Raises NotSupportedError where NVML cannot be loaded (no NVIDIA driver: the host backend has no
    such readings), NoDeviceError for a device NVML does not know."""
    check_int("gpuguard.device_telemetry", "device", device, _INT_MIN, INT_MAX)
    t = DeviceTelemetry()
    C.gg_device_telemetry(device, byref(t))

    def known(v: Any) -> Any:
        return None if v < 0 else v
    return {
        "index": t.index, "utilization_gpu": known(t.utilization_gpu),
        "utilization_memory": known(t.utilization_memory), "temperature_c": known(t.temperature_c),
        "power_watts": known(t.power_watts), "power_limit_watts": known(t.power_limit_watts),
    }


def processes(device: int = 0) -> List[Dict[str, Any]]:
    """The processes holding device memory (NVML, else /dev/nvidia* descriptors), each joined with /proc
    and classified: "guarded", "orphan", "fd-holder", "foreign" or "unknown". ``used_bytes`` is None
    when the driver does not say. On a machine with no NVIDIA GPU (neither NVML nor the CUDA driver:
    the host backend's simulated device, which no process can hold) raises NoDeviceError, as the C
    gg_process_list() returns GG_ENODEV and ``gpuguard ps`` exits 3 with no device listed, while
    device_info() describes the simulated device."""
    check_int("gpuguard.processes", "device", device, _INT_MIN, INT_MAX)
    count = c_size_t(0)
    rows = (Process * 0)()
    for _ in range(4):  # the list can grow between asking for its size and reading it
        rows = (Process * (count.value + 8))()
        C.gg_process_list(device, rows, len(rows), byref(count))
        if count.value <= len(rows):
            break
    return [_process_row(p) for p in rows[:min(count.value, len(rows))]]


def _process_row(p: Process) -> Dict[str, Any]:
    """One gg_process_t as a dict (``used_bytes`` None when the driver does not say)."""
    return {
        "pid": p.pid, "ppid": p.ppid, "uid": p.uid, "user": p.user.decode(errors="replace"),
        "state": p.state.decode(errors="replace"), "start_time": p.start_time,
        "used_bytes": None if p.used_bytes < 0 else p.used_bytes, "device": p.device,
        "class": C.gg_process_class_name(p.cls).decode(), "session": p.session.decode(),
        "command": p.command.decode(errors="replace"),
    }
