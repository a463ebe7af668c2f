"""gpuguard_build — the Python package's build backend: scikit-build-core as it is (wheels and editable
installs drive the top-level CMakeLists.txt), with an sdist of its own: the C sources live two
directories up, outside what scikit-build-core's sdist of bindings/python would hold, so this one carries
them. The archive is laid out as the repository is (CMakeLists.txt, cmake/, include/, src/, tools/,
bindings/python/...), with a pyproject.toml at its root that points scikit-build-core at "." instead of
"../..", so `pip install gpuguard-X.tar.gz` builds the same wheel a checkout does."""
from __future__ import annotations

import io
import os
import re
import tarfile
import tempfile
import time
from typing import Dict, List, Optional

from scikit_build_core.build import (build_editable, build_wheel, get_requires_for_build_editable,  # noqa: F401
                                     get_requires_for_build_wheel, prepare_metadata_for_build_editable,
                                     prepare_metadata_for_build_wheel)

# What the wheel's build reads, relative to the repository root (CMakeLists.txt guards the rest).
_ROOT_ITEMS = ["CMakeLists.txt", "LICENSE", "cmake", "include", "src", "tools"]
_PACKAGE_ITEMS = ["README.md", "build_support", "gpuguard", "gpuguard_torch.pth"]


def _root_and_package() -> "tuple[str, str]":
    """(repository root, bindings/python) for a checkout, or for an unpacked sdist (whose root is here)."""
    here = os.path.abspath(os.getcwd())
    if os.path.exists(os.path.join(here, "CMakeLists.txt")) and os.path.isdir(os.path.join(here, "src")):
        return here, os.path.join(here, "bindings", "python")
    root = os.path.abspath(os.path.join(here, "..", ".."))
    if not os.path.isdir(os.path.join(root, "src")):
        raise RuntimeError(f"gpuguard: no C sources at {root}/src: an sdist is built from a checkout of the "
                           "whole repository (or from an unpacked gpuguard sdist)")
    return root, here


def _sdist_pyproject(text: str) -> str:
    """bindings/python/pyproject.toml with its paths made relative to the archive's root."""
    subs = [(r'cmake\.source-dir = "\.\./\.\."', 'cmake.source-dir = "."'),
            (r'wheel\.packages = \["gpuguard"\]', 'wheel.packages = ["bindings/python/gpuguard"]'),
            (r'backend-path = \["build_support"\]', 'backend-path = ["bindings/python/build_support"]'),
            (r'readme = "README\.md"', 'readme = "bindings/python/README.md"'),
            (r'input = "gpuguard/_version\.py"', 'input = "bindings/python/gpuguard/_version.py"')]
    for pattern, new in subs:
        text, n = re.subn(pattern, new, text)
        if n != 1:
            raise RuntimeError(f"gpuguard: pyproject.toml: {pattern!r} found {n} times, expected once")
    return text


def _files(base: str, items: List[str]) -> List[str]:
    out = []
    for item in items:
        path = os.path.join(base, item)
        if os.path.isfile(path):
            out.append(item)
            continue
        for d, dirs, names in os.walk(path):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            out += [os.path.relpath(os.path.join(d, n), base) for n in sorted(names)
                    if not n.endswith((".pyc", ".so")) and not n.startswith(".")]
    return out


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return []


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, object]] = None) -> str:
    root, pkg = _root_and_package()
    in_sdist = root == os.path.abspath(os.getcwd())
    with open("pyproject.toml", encoding="utf-8") as f:  # an unpacked sdist's is rewritten already
        pyproject = f.read()
    sdist_pyproject = pyproject if in_sdist else _sdist_pyproject(pyproject)
    # PKG-INFO: the same core metadata the wheel gets.
    with tempfile.TemporaryDirectory() as tmp:
        info = prepare_metadata_for_build_wheel(tmp)
        with open(os.path.join(tmp, info, "METADATA"), "rb") as f:
            pkg_info = f.read()
    m = re.search(rb"^Version: (\S+)", pkg_info, re.M)
    if not m:
        raise RuntimeError("gpuguard: the package metadata has no version")
    name = f"gpuguard-{m.group(1).decode()}"
    out = os.path.join(sdist_directory, name + ".tar.gz")
    now = int(time.time())

    def add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
        ti = tarfile.TarInfo(f"{name}/{arcname}")
        ti.size, ti.mtime, ti.mode = len(data), now, 0o644
        tar.addfile(ti, io.BytesIO(data))

    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        add_bytes(tar, "PKG-INFO", pkg_info)
        add_bytes(tar, "pyproject.toml", sdist_pyproject.encode())
        for rel in _files(root, _ROOT_ITEMS):
            tar.add(os.path.join(root, rel), f"{name}/{rel}", recursive=False)
        for rel in _files(pkg, _PACKAGE_ITEMS):
            tar.add(os.path.join(pkg, rel), f"{name}/bindings/python/{rel}", recursive=False)
    return os.path.basename(out)
