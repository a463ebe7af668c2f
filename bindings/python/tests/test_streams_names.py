"""Handles and names that came from elsewhere: the host backend refuses a
stream it did not make instead of reading it (stream=2, cudaStreamPerThread, crashed .stats()), and
names cut to fit a C buffer stay valid UTF-8 (a name of 'é' * 40 made registry_list() raise
UnicodeDecodeError for every caller)."""
import os
import subprocess
import sys

import pytest

import gpuguard
from gpuguard import InvalidArgumentError


def test_cuda_special_streams_are_the_default_stream_on_host():
    for handle in (1, 2):
        with gpuguard.Arena(backend="host", capacity=16 << 20, stream=handle) as a:
            assert a.stats()["n_live"] == 0
            a.alloc(1000).free()
            a.trim()
            assert a.stats()["bytes_mapped"] == 0


def test_a_foreign_stream_is_refused_not_read():
    # In a child: on code without the check this is a segfault, which must fail the test, not pytest.
    code = ("import gpuguard\n"
            "try:\n"
            "    gpuguard.Arena(backend='host', capacity=16 << 20, stream=0xdead0)\n"
            "except gpuguard.InvalidArgumentError as e:\n"
            "    print('refused:', e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(gpuguard.__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "not a stream of the host backend" in r.stdout
    with pytest.raises(InvalidArgumentError, match="cudaStreamPerThread"):
        gpuguard.Arena(backend="host", capacity=16 << 20, stream=0xdead0)


def test_long_names_are_cut_between_characters(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUGUARD_REGISTRY_DIR", str(tmp_path / "reg"))
    monkeypatch.delenv("GPUGUARD_SESSION", raising=False)
    # Straight from the C structs, strictly decoded: the binding's own decoding forgives, C must not cut.
    gpuguard.registry_register("é" * 40)
    try:
        rows = gpuguard.registry_list()
        mine = [r for r in rows if r["pid"] == os.getpid()]
        assert len(mine) == 1 and mine[0]["devices"] == "é" * (len(mine[0]["devices"]))
        assert len(mine[0]["devices"]) >= 30
    finally:
        gpuguard.registry_unregister()
    with gpuguard.Arena(backend="host", capacity=16 << 20, name="é" * 100) as a:
        from gpuguard._lib import lib
        raw = lib.gg_arena_name(a._handle())
        assert raw.decode() == "é" * (len(raw) // 2) and len(raw) >= 60
        assert a.name == raw.decode()
        a.alloc(256, tag="€" * 40)
        assert a.blocks()[0]["tag"] == "€" * 21
