"""Executed by the one line of ``gpuguard_torch.pth`` (site-packages) when ``GPUGUARD_TORCH`` or
``GPUGUARD_WORKERS`` is set. Loads the hook's three modules from the package's directory under their own
names without running the package's ``__init__`` (which loads libgpuguard and most of the binding: ~20 ms
the hook does not need; each of the three imports only the standard library at its top), and runs
``gpuguard._autostart.run``, which acts once per process: ``site`` may process site-packages twice (a
venv's lib and lib64), and then this runs twice."""
import sys
from importlib import _bootstrap, machinery  # what importlib.util re-exports, without its imports


def _load(name: str) -> object:
    full = "gpuguard." + name
    if full not in sys.modules:
        package = machinery.PathFinder.find_spec("gpuguard")
        assert package is not None and package.submodule_search_locations
        spec = machinery.PathFinder.find_spec(full, package.submodule_search_locations)
        assert spec is not None and spec.loader is not None, full
        module = _bootstrap.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


for _name in ("_postimport", "_workers"):
    _load(_name)
_load("_autostart").run()  # type: ignore[attr-defined]
