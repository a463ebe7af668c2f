"""gpuguard._cachedir — a cache directory that only this effective user can write, for files that get
loaded as code (the PyTorch shim's compiled ``.so``): a file another user could plant or replace there
would run in our process, as root for root.

``private_dir(name)`` gives ``$XDG_CACHE_HOME/NAME`` (``~/.cache/NAME``) when it, and every directory
above it, can be written by no other user: owned by us or root, and not group- or other-writable unless
sticky (``/tmp``: others may not rename what is ours). Otherwise (a shared or foreign cache, or one we
cannot write) a new private directory for this process, removed at exit: the build is redone there.
``usable(path)`` says whether a file found in it may be loaded."""
from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from typing import Dict

_private: Dict[str, str] = {}  # name -> this process's fallback directory, made once


def _safe_dir(st: os.stat_result, euid: int) -> bool:
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (euid, 0):
        return False
    return not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)) or bool(st.st_mode & stat.S_ISVTX)


def _chain_is_safe(path: str, euid: int) -> bool:
    """path (a directory) and every directory above it: no other user can change what it names."""
    here = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(here)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):  # a link anywhere: follow it, and judge where it leads
            return _chain_is_safe(os.path.realpath(here), euid)
        if not _safe_dir(st, euid):
            return False
        up = os.path.dirname(here)
        if up == here:
            return True
        here = up


def _fallback(name: str) -> str:
    d = _private.get(name)
    if d is None or not os.path.isdir(d):
        d = tempfile.mkdtemp(prefix=f"{name}-cache-")  # 0700, ours
        _private[name] = d
        atexit.register(shutil.rmtree, d, True)
    return d


def private_dir(name: str) -> str:
    """The cache directory NAME for files that will be loaded as code; see the module's text."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, name)
    euid = os.geteuid()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:  # unwritable (or a file in the way): not a reason to fail, only to build privately
        return _fallback(name)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != euid or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return _fallback(name)
    if not _chain_is_safe(os.path.dirname(path), euid) or not os.access(path, os.W_OK | os.X_OK):
        return _fallback(name)
    return path


def usable(path: str) -> bool:
    """Whether the file at path may be loaded: a regular file (not a link), ours, writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
