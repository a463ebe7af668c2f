"""Test setup: the binding under test is this checkout's package; the library comes from
GPUGUARD_LIBRARY (the test command sets it to the build tree's libgpuguard.so)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("GPUGUARD_BACKEND", "host")
os.environ.setdefault("GPUGUARD_HOST_CAPACITY", "256M")
