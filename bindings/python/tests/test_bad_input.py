"""Python values C cannot hold are refused at the boundary, never wrapped or cut by ctypes:
before, alloc(2**64 + 100) got 256 bytes, teardown(grace_ms=2**32) became grace 0,
Arena(device=2**32) opened device 0, and spawn(['tr\\0ue']) ran `tr`."""
import pytest

import gpuguard
from gpuguard import InvalidArgumentError


def test_sizes_that_do_not_fit_size_t_are_refused():
    with gpuguard.Arena(capacity=64 << 20, backend="host") as a:
        for bad in (2 ** 64 + 100, -1, 2 ** 64):
            with pytest.raises(InvalidArgumentError, match="size"):
                a.alloc(bad)
        with pytest.raises(InvalidArgumentError, match="align"):
            a.alloc(256, align=2 ** 64)
        assert a.stats()["n_allocs"] == 0       # nothing was allocated on the way
        a.alloc(2 ** 20).free()                 # the arena still works


def test_arena_options_out_of_range_are_refused():
    for kw, name in (({"device": 2 ** 32}, "device"), ({"device": -1}, "device"),
                     ({"capacity": 2 ** 64}, "capacity"), ({"chunk_size": -5}, "chunk_size"),
                     ({"flags": 2 ** 32}, "flags"), ({"device": True}, "device")):
        with pytest.raises(InvalidArgumentError, match=name):
            gpuguard.Arena(backend="host", **kw)


def test_teardown_grace_out_of_range_is_refused():
    for bad in (2 ** 32, -1, 2 ** 31):
        with pytest.raises(InvalidArgumentError, match="grace_ms"):
            gpuguard.teardown(grace_ms=bad)


def test_embedded_nul_is_refused_before_anything_runs():
    with pytest.raises(InvalidArgumentError, match="NUL"):
        gpuguard.spawn(["tr\0ue"])
    with pytest.raises(InvalidArgumentError, match="NUL"):
        gpuguard.spawn(["true"], env={"A": "b\0c"})
    with pytest.raises(InvalidArgumentError, match="NUL"):
        gpuguard.spawn(["true"], cwd="/tmp\0/x")
