#!/usr/bin/env python3
"""cupy_example.py — CuPy arrays drawn from a gpuguard arena: allocate inside a scope of work, see the
arena's figures, restore CuPy's own allocator, trim the memory back to the driver.

  GPUGUARD_LIBRARY=build/libgpuguard.so PYTHONPATH=bindings/python python3 examples/cupy_example.py

Without CuPy or a GPU it says so on its first line and exits 0."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

try:
    import cupy
except ImportError:
    print("gpuguard cupy_example: skipped: CuPy is not installed (pip install cupy-cuda13x)")
    sys.exit(0)
try:
    n_dev = cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # no driver
    print(f"gpuguard cupy_example: skipped: no CUDA driver ({e})")
    sys.exit(0)
if n_dev < 1:
    print("gpuguard cupy_example: skipped: no CUDA device")
    sys.exit(0)

import gpuguard  # noqa: E402
import gpuguard.cupy as ggc  # noqa: E402

MiB = 1 << 20

print(f"gpuguard cupy_example: CUDA device 0, CuPy {cupy.__version__}, arrays from a gpuguard arena")
with gpuguard.Guard(name="cupy_example"), gpuguard.Arena(capacity=8 << 30, name="cupy") as arena:
    with ggc.use_arena(arena):
        for n in (1 << 20, 1 << 24, 1 << 26):
            a = cupy.random.standard_normal(n, dtype=cupy.float32)
            b = cupy.sort(a)  # temporary storage for the sort comes from the arena too
            s = arena.stats()
            print(f"n={n:>9}: max={float(b[-1]):6.2f}  arena in use {s['bytes_in_use'] / MiB:7.1f} "
                  f"MiB, mapped {s['bytes_mapped'] / MiB:7.1f} MiB, live blocks {s['n_live']}")
            del a, b
        cupy.cuda.Device(0).synchronize()
        print(f"after the arrays are gone: in use {arena.stats()['bytes_in_use'] / MiB:.1f} MiB")
    print("CuPy's own allocator is back:", cupy.cuda.get_allocator() is not None)
    free0 = cupy.cuda.runtime.memGetInfo()[0]
    mapped = arena.stats()["bytes_mapped"]
    arena.trim()
    free1 = cupy.cuda.runtime.memGetInfo()[0]
    print(f"trim gave {mapped / MiB:.1f} MiB back; the driver's free memory rose by {(free1 - free0) / MiB:.1f} MiB")
