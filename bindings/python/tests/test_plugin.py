"""The allocator plugin on the host backend, called through ctypes exactly as PyTorch's
CUDAPluggableAllocator calls it (no torch needed): it draws from the registered arena, frees on a foreign
stream wait for that stream first, a failed wait keeps the block, and destroy unregisters."""
from ctypes import byref, c_void_p

import pytest

import gpuguard
from gpuguard import _lib
from gpuguard._lib import C, PluginStats
from gpuguard._pluginstats import torch_style_stats

MiB = 1 << 20


def plugin_stats(device=0):
    s = PluginStats()
    C.gg_plugin_stats(device, byref(s))
    return s


def registered(device=0):
    p = c_void_p()
    C.gg_plugin_get_arena(device, byref(p))
    return p.value


@pytest.fixture
def host_stream():
    s = c_void_p()
    C.gg_host_stream_create(byref(s))
    yield s.value
    C.gg_host_stream_destroy(s.value)


@pytest.fixture
def arena():
    with gpuguard.Arena(capacity=64 * MiB, chunk_size=4 * MiB, name="plug") as a:
        C.gg_plugin_set_arena(0, a._handle())
        yield a
    assert registered(0) is None  # destroy unregistered it


def test_alloc_and_free_draw_from_the_registered_arena(arena):
    before = plugin_stats()
    p = C.gg_torch_alloc(1000, 0, None)
    assert p and p % 256 == 0
    assert [(b["tag"], b["size"]) for b in arena.blocks()] == [("torch", 1000)]
    arena.write(p, b"x" * 1000)  # real memory of the arena
    assert arena.read(p, 4) == b"xxxx"
    C.gg_torch_free(p, 1000, 0, None)
    assert arena.stats()["n_live"] == 0
    after = plugin_stats()
    assert after.n_allocs == before.n_allocs + 1 and after.n_frees == before.n_frees + 1
    assert after.n_stream_waits == before.n_stream_waits and after.arena == arena._handle()


def test_size_zero_and_null_free_are_quiet(arena, capfd):
    before = plugin_stats()
    assert C.gg_torch_alloc(0, 0, None) is None  # PyTorch asks for 0 bytes for empty tensors
    C.gg_torch_free(None, 0, 0, None)
    after = plugin_stats()
    assert after.n_failed_allocs == before.n_failed_allocs and after.n_failed_frees == before.n_failed_frees
    assert capfd.readouterr().err == ""


def test_failures_return_null_say_why_and_are_counted(arena, capfd):
    before = plugin_stats()
    assert C.gg_torch_alloc(1 << 40, 0, None) is None  # beyond the capacity: PyTorch's OOM path
    assert C.gg_torch_alloc(256, 5, None) is None      # no arena for device 5
    assert C.gg_torch_alloc(256, 999, None) is None    # out of the table
    err = capfd.readouterr().err
    assert "capacity" in err and "no arena is registered for device 5" in err and "out of range" in err
    assert plugin_stats().n_failed_allocs == before.n_failed_allocs + 1  # each device counts its own
    assert plugin_stats(5).n_failed_allocs >= 1
    p = C.gg_torch_alloc(256, 0, None)
    C.gg_torch_free(p, 256, 0, None)
    C.gg_torch_free(p, 256, 0, None)  # double free: refused, said, counted; nothing corrupted
    assert "double free" in capfd.readouterr().err
    assert plugin_stats().n_failed_frees == before.n_failed_frees + 1


def test_calls_on_a_foreign_stream_join_streams_on_the_device(arena, host_stream):
    C.gg_host_fault_set(None)  # resets the backend's operation counters
    q = C.gg_torch_alloc(4096, 0, None)  # the arena's own stream (the default one): nothing to order
    assert C.gg_host_op_count(b"stream_wait") == 0
    joins = plugin_stats().n_stream_waits
    p = C.gg_torch_alloc(4096, 0, host_stream)  # another stream: it waits for the arena's, on the device
    assert C.gg_host_op_count(b"stream_wait") == 1
    C.gg_torch_free(q, 4096, 0, None)  # own stream: stream-ordered, reusable at once
    assert C.gg_host_op_count(b"stream_wait") == 1
    C.gg_torch_free(p, 4096, 0, host_stream)  # another stream: the arena's waits for it, on the device
    assert C.gg_host_op_count(b"stream_wait") == 2
    assert C.gg_host_op_count(b"stream_sync") == 0  # the host never waited
    assert plugin_stats().n_stream_waits == joins + 2
    assert arena.stats()["n_live"] == 0


def test_arena_with_its_own_stream_and_no_stream_flag(host_stream):
    with gpuguard.Arena(capacity=16 * MiB, stream=host_stream) as a:
        C.gg_plugin_set_arena(0, a._handle())
        C.gg_host_fault_set(None)
        p = C.gg_torch_alloc(256, 0, host_stream)
        C.gg_torch_free(p, 256, 0, host_stream)  # its own stream: straight to gg_free
        assert C.gg_host_op_count(b"stream_wait") == 0
        p = C.gg_torch_alloc(256, 0, None)  # the default stream is a foreign one here: ordered after it
        C.gg_torch_free(p, 256, 0, None)  # and the arena's after the default one before the free
        assert C.gg_host_op_count(b"stream_wait") == 2
        assert C.gg_host_op_count(b"stream_sync") == 0
    with gpuguard.Arena(capacity=16 * MiB, flags=gpuguard.NO_STREAM) as a:
        C.gg_plugin_set_arena(0, a._handle())
        C.gg_host_fault_set(None)
        p = C.gg_torch_alloc(256, 0, host_stream)
        C.gg_torch_free(p, 256, 0, host_stream)  # NO_STREAM: the caller synchronises, nothing ordered
        assert C.gg_host_op_count(b"stream_wait") == 0 and C.gg_host_op_count(b"stream_sync") == 0


@pytest.mark.parametrize("op", [b"event_record", b"stream_wait"])
def test_failed_stream_ordering_keeps_the_block(arena, host_stream, capfd, op):
    p = C.gg_torch_alloc(4096, 0, host_stream)
    C.gg_host_fault_set(op + b":1")
    try:
        C.gg_torch_free(p, 4096, 0, host_stream)
    finally:
        C.gg_host_fault_set(None)
    assert "gg_torch_free" in capfd.readouterr().err
    assert arena.stats()["n_live"] == 1  # never handed out while work may still read it
    C.gg_torch_free(p, 4096, 0, host_stream)  # a later free that can order the streams succeeds
    assert arena.stats()["n_live"] == 0
    C.gg_host_fault_set(op + b":1")  # an allocation for another stream that cannot be ordered fails
    try:
        assert C.gg_torch_alloc(4096, 0, host_stream) is None
    finally:
        C.gg_host_fault_set(None)
    assert "gg_torch_alloc" in capfd.readouterr().err
    assert arena.stats()["n_live"] == 0  # and keeps nothing


def test_registration_errors_and_replacement(arena):
    with pytest.raises(gpuguard.InvalidArgumentError, match="out of range"):
        C.gg_plugin_set_arena(64, arena._handle())
    other = gpuguard.Arena(capacity=8 * MiB)
    C.gg_plugin_set_arena(0, other._handle())
    assert registered(0) == other._handle()
    other.close()
    assert registered(0) is None
    C.gg_plugin_set_arena(0, None)
    C.gg_plugin_set_arena(0, arena._handle())


def test_torch_style_stats_without_torch(arena):
    p = C.gg_torch_alloc(3 * MiB, 0, None)
    s = torch_style_stats(arena)
    assert s["allocated_bytes.all.current"] == 3 * MiB and s["active.all.current"] == 1
    assert s["reserved_bytes.all.current"] == 4 * MiB and s["reserved_bytes.all.peak"] >= 4 * MiB
    assert s["num_alloc_retries"] == 0 and s["num_ooms"] == plugin_stats().n_failed_allocs
    C.gg_torch_free(p, 3 * MiB, 0, None)
    s = torch_style_stats(arena)
    assert s["allocated_bytes.all.current"] == 0 and s["allocated_bytes.all.peak"] >= 3 * MiB
    assert s["allocation.all.allocated"] >= 1 and s["allocation.all.freed"] >= 1
    arena.trim()
    assert torch_style_stats(arena)["reserved_bytes.all.current"] == 0
    assert _lib.path  # the library path CUDAPluggableAllocator is given


def test_trim_waits_for_the_stream_after_stream_ordered_frees(host_stream):
    """A block freed in stream order is reusable at once, but its memory is unmapped only once the
    work queued before the free has run (found on the H200: unmapping under a running cuBLAS call
    made it fail)."""
    with gpuguard.Arena(capacity=16 * MiB, chunk_size=2 * MiB, stream=host_stream) as a:
        C.gg_plugin_set_arena(0, a._handle())
        p = C.gg_torch_alloc(4 * MiB, 0, host_stream)
        mapped = a.stats()["bytes_mapped"]
        C.gg_host_stream_hold(host_stream)  # "a kernel still reads the block"
        C.gg_torch_free(p, 4 * MiB, 0, host_stream)
        with pytest.raises(gpuguard.TimeoutError_):
            a.trim()  # must wait for the stream; a held host stream cannot be waited for
        assert a.stats()["bytes_mapped"] == mapped
        q = C.gg_torch_alloc(4 * MiB, 0, host_stream)  # growth does not trim under running work either
        assert a.stats()["bytes_mapped"] >= mapped
        C.gg_torch_free(q, 4 * MiB, 0, host_stream)
        C.gg_host_stream_release(host_stream)
        a.trim()
        assert a.stats()["bytes_mapped"] == 0


def test_trim_after_stream_ordered_frees_waits_only_while_their_work_may_run(host_stream):
    # Memory freed in stream order may still be read by queued work: trim waits for the stream first
    # when the work queued before the free may still run, counted in the arena's n_stream_waits and in
    # the torch-style gpuguard.n_stream_waits key; once an event says that work is done, it does not.
    with gpuguard.Arena(capacity=16 * MiB, chunk_size=2 * MiB, stream=host_stream) as a:
        C.gg_plugin_set_arena(0, a._handle())
        p = C.gg_torch_alloc(8 * MiB, 0, host_stream)
        C.gg_host_stream_hold(host_stream)  # "a kernel still reads the block"
        C.gg_torch_free(p, 8 * MiB, 0, host_stream)
        assert a.stats()["n_stream_waits"] == 0
        with pytest.raises(gpuguard.TimeoutError_):
            a.trim()  # the wait is counted though the held host stream cannot be waited for
        assert a.stats()["n_stream_waits"] == 1
        assert torch_style_stats(a)["gpuguard.n_stream_waits"] == 1
        C.gg_host_stream_release(host_stream)  # the work is done: the free's event says so
        a.trim()
        s = a.stats()
        assert s["n_stream_waits"] == 1 and s["bytes_mapped"] == 0
        q = C.gg_torch_alloc(8 * MiB, 0, host_stream)
        C.gg_torch_free(q, 8 * MiB, 0, host_stream)
        a.trim()  # on a stream that is idle the free's event is complete at once: no wait
        assert a.stats()["n_stream_waits"] == 1 and a.stats()["bytes_mapped"] == 0
