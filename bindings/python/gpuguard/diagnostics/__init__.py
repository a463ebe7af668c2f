"""gpuguard.diagnostics — the memory diagnostics in one place, for ``gpuguard.torch`` to re-export with one
import line: ``holders`` (gpuguard.diagnostics.holding), ``rounds`` (gpuguard.diagnostics.growth), ``record`` (gpuguard.diagnostics.timeline).
None of them imports torch: each reads PyTorch's objects and counters only once the program did."""
from .growth import MemoryGrowthWarning, Rounds, rounds
from .holding import Holder, Holders, holders
from .timeline import Recorder, record

__all__ = ["holders", "Holders", "Holder", "rounds", "Rounds", "MemoryGrowthWarning", "record", "Recorder"]
