"""gpuguard._arm_forkserver — imported by multiprocessing's forkserver as a preload module once
gpuguard._workers is installed: the forkserver then dies with the process that started it, and with it
every worker it forked (each armed against the forkserver)."""
from ._workers import arm_forkserver

arm_forkserver()
