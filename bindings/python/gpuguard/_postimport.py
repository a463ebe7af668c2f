"""gpuguard._postimport — run a function right after a module's own import finishes, without importing it:
what lets the start-up hook arm ``multiprocessing`` and install PyTorch's allocator only in the programs
that import them, at no cost to those that never do. Standard library only (loaded by the start-up hook
before the package)."""
from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~2 ms at interpreter start: for the checker only
    from typing import Any, Callable, Dict, List


class _Finder:
    """A meta-path finder that finds nothing itself: for a watched module it asks the finders after it,
    and wraps the loader's exec_module so that the callbacks run once the module has executed."""

    def __init__(self) -> None:
        self.pending: Dict[str, List[Callable[[Any], None]]] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        callbacks = self.pending.pop(name, None)
        if callbacks is None:
            return None
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = _find_elsewhere(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            for callback in callbacks:
                callback(module)

        spec.loader.exec_module = exec_module
        return spec


def _find_elsewhere(me: Any, name: str, path: Any, target: Any) -> Any:
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if finder is me or find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            return spec
    return None


_finder = _Finder()


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Calls ``callback(module)`` once ``name`` has been imported: at once when it is imported already,
    else right after its import executes it (before the importer gets it). Once per call."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _finder.pending.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
