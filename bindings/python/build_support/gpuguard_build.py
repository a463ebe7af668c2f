"""gpuguard_build — the Python package's build backend: scikit-build-core as it is, driving the top-level
CMakeLists.txt two directories up, except for sdists. The C sources live outside bindings/python, so an
sdist of this directory could never build; it is refused with a message rather than made broken."""
from scikit_build_core.build import (build_editable, build_wheel, get_requires_for_build_editable,  # noqa: F401
                                     get_requires_for_build_wheel, prepare_metadata_for_build_editable,
                                     prepare_metadata_for_build_wheel)


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError(
        "gpuguard: no sdist of bindings/python: the wheel builds the C library from the whole repository "
        "(CMakeLists.txt two directories up), which an sdist of this directory would not hold. Build a "
        "wheel from a checkout instead: `pip wheel ./bindings/python` or `python -m build --wheel "
        "bindings/python`.")
