"""gg_pytest_counters — a pytest plugin for scripts/gpu-torch.sh stage 3: after each test, one line with
what gpuguard's PyTorch backend still holds (pools alive, blocks in pools, blocks in all, captures
announced) into $GG_COUNTERS_LOG. Pools or captures an earlier test left alive change what a later
test measures (a memory fraction set over memory_reserved(), a segment count); this log shows where
they came from. Does nothing when the backend is not PyTorch's allocator."""
from __future__ import annotations

import os


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    path = os.environ.get("GG_COUNTERS_LOG")
    if not path:
        return
    try:
        from gpuguard.torch import _native
        line = f"{nodeid} {_native.counters()}" if _native.active() else f"{nodeid} (backend not active)"
    except Exception as e:  # the log must never fail a test
        line = f"{nodeid} (no counters: {e!r})"
    with open(path, "a") as f:
        f.write(line + "\n")
