"""Test setup: the binding under test is this checkout's package, with the library from
GPUGUARD_LIBRARY (CTest sets it to the build tree's libgpuguard.so); with GPUGUARD_TEST_INSTALLED=1 it
is the installed package instead, with the library inside it (scripts/test.sh does that with a wheel)."""
import os
import sys

if os.environ.get("GPUGUARD_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("GPUGUARD_BACKEND", "host")
os.environ.setdefault("GPUGUARD_HOST_CAPACITY", "256M")
