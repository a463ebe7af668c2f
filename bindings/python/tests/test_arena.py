"""Arenas through the binding: allocation, scopes on every way out of a with block, trim, statistics,
bad input as exceptions with the library's message, use after close, and fork."""
import os

import pytest

import gpuguard

MiB = 1 << 20


@pytest.fixture
def arena():
    with gpuguard.Arena(capacity=64 * MiB, chunk_size=4 * MiB, name="test") as a:
        yield a


def test_alloc_write_read_free(arena):
    a = arena.alloc(1000, tag="weights")
    assert a.ptr % 256 == 0 and a.size == 1000 and a.tag == "weights"
    arena.write(a, b"gpuguard" * 10)
    assert arena.read(a, 16) == b"gpuguardgpuguard"
    arena.fill(a.ptr + 8, 0x41, 8)
    assert arena.read(a, 16) == b"gpuguardAAAAAAAA"
    s = arena.stats()
    assert s["n_live"] == 1 and s["bytes_in_use"] == 1024 and s["bytes_mapped"] == 4 * MiB
    assert [b["tag"] for b in arena.blocks()] == ["weights"]
    a.free()
    assert arena.stats()["n_live"] == 0
    with pytest.raises(gpuguard.InvalidArgumentError, match="gg_free"):
        a.free()  # double free: the library's message comes through


def test_scope_ends_on_exception_and_keyboard_interrupt(arena):
    keep = arena.alloc(256)
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)) as info:
            with arena.scope():
                arena.alloc(10 * MiB, tag="activations")
                assert arena.stats()["scope_depth"] == 1
                raise exc
        assert info.value is exc  # propagated unchanged
        s = arena.stats()
        assert s["scope_depth"] == 0 and s["n_live"] == 1
    keep.free()


def test_nested_scopes_and_trim():
    with gpuguard.Arena(capacity=64 * MiB, chunk_size=2 * MiB) as arena:
        with arena.scope():
            arena.alloc(MiB)
            with arena.scope():
                arena.alloc(8 * MiB)
            assert arena.stats()["n_live"] == 1
        assert arena.stats()["n_live"] == 0
        before = gpuguard.device_info()["free_bytes"]
        mapped = arena.stats()["bytes_mapped"]
        assert mapped > 0
        arena.trim()
        s = arena.stats()
        assert s["bytes_mapped"] == 0 and s["bytes_trimmed"] >= mapped and s["n_trims"] == 1
        assert gpuguard.device_info()["free_bytes"] == before + mapped


def test_bad_input_and_out_of_memory(arena):
    with pytest.raises(gpuguard.InvalidArgumentError, match="size"):
        arena.alloc(0)
    with pytest.raises(gpuguard.InvalidArgumentError, match="align"):
        arena.alloc(256, align=3)
    with pytest.raises(gpuguard.OutOfMemoryError) as e:
        arena.alloc(1 << 40)
    msg = str(e.value)
    assert "in use" in msg and "capacity" in msg and "largest free" in msg
    with pytest.raises(gpuguard.InvalidArgumentError):
        arena.free(0xDEAD00)


def test_use_after_close():
    arena = gpuguard.Arena(capacity=8 * MiB)
    arena.close()
    arena.close()  # twice is fine
    with pytest.raises(gpuguard.StateError, match="closed"):
        arena.alloc(256)


def test_forked_child_gets_state_error(arena):
    arena.alloc(256)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            arena.alloc(256)
        except gpuguard.StateError as e:
            code = 0 if "fork" in str(e) else 4
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert arena.stats()["n_live"] == 1  # the parent's arena is untouched
