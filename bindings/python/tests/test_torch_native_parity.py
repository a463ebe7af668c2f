"""gpuguard's PyTorch backend doing what PyTorch's own allocator does, as PyTorch's test_cuda.py checks it
(issue 41): snapshot actions and metadata, allocator settings, record_stream. Each test runs a short script
in a fresh interpreter under GPUGUARD_TORCH=1 (test_torch_native.py's helpers); needs a GPU."""
from __future__ import annotations

from test_torch_native import need_gpu, run_script, run_script_raw

SNAPSHOT_ACTIONS = """
    def trace(skip=None, context="all", meta=""):
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._set_memory_metadata(meta)
        torch.cuda.memory._record_memory_history(context=context, stacks="python", skip_actions=skip)
        x = torch.rand(3 << 20, device="cuda")
        del x
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._set_memory_metadata("")
        ss = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        return ss
    ss = trace(["free_requested", "free_completed"])
    out["skip_free"] = sorted({e["action"] for e in ss["device_traces"][0]})
    ss = trace(["alloc"])
    out["skip_alloc"] = sorted({e["action"] for e in ss["device_traces"][0]})
    ss = trace(None)
    out["last"] = ss["device_traces"][0][-1]["action"]
    out["all_has_empty_cache"] = "empty_cache" in json.dumps(ss)
    out["alloc_has_empty_cache"] = "empty_cache" in json.dumps(trace(None, context="alloc"))
    ss = trace(None, meta="metadata test")
    out["meta"] = sorted({e["user_metadata"] for e in ss["device_traces"][0]})
    try:
        torch.cuda.memory._record_memory_history(context="all", skip_actions=["nonsense"])
        out["bad"] = "accepted"
    except Exception as e:
        out["bad"] = type(e).__name__ + ": " + str(e)
    torch.cuda.memory._record_memory_history(None)
"""


def test_snapshot_actions_skip_metadata_and_free_segment_stack() -> None:
    """test_memory_snapshot_skip_actions, test_memory_plots_free_segment_stack, test_memory_plots_metadata and
    test_memory_snapshot's last action: any action can be skipped; chunks given back are segment_unmap
    entries, with the stack of empty_cache under context "all" only; every entry carries the metadata."""
    need_gpu()
    out = run_script(SNAPSHOT_ACTIONS)
    assert "free_requested" not in out["skip_free"] and "free_completed" not in out["skip_free"], out
    assert "alloc" in out["skip_free"], out
    assert "alloc" not in out["skip_alloc"] and "free_completed" in out["skip_alloc"], out
    assert out["last"] == "segment_unmap", out
    assert out["all_has_empty_cache"] and not out["alloc_has_empty_cache"], out
    assert out["meta"] == ["metadata test"], out
    assert "Unknown TraceEntry action: nonsense" in out["bad"], out


SETTINGS = """
    torch.cuda.init()  # memory_stats() is {} before CUDA starts (test_cuda.py's process has started it)
    torch.cuda.memory.empty_cache()
    n = 21 * 1024 * 1024
    key = "active_bytes.all.allocated"
    start = torch.cuda.memory_stats()[key]
    torch.cuda.memory._set_allocator_settings("")
    x = torch.rand(n, device="cuda")
    reg = torch.cuda.memory_stats()[key]
    torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
    y = torch.rand(n, device="cuda")
    div4 = torch.cuda.memory_stats()[key]
    torch.cuda.memory._set_allocator_settings("garbage_collection_threshold:0.5,max_split_size_mb:40")
    z = torch.rand(n, device="cuda")
    back = torch.cuda.memory_stats()[key]
    out["plain"] = reg - start
    out["div4"] = div4 - reg
    out["reset"] = back - div4
    out["requested"] = torch.cuda.memory_stats()["requested_bytes.all.current"] >= 3 * 4 * n
"""


def test_allocator_settings_roundup_power2_divisions() -> None:
    """test_allocator_settings: roundup_power2_divisions:4 rounds 84 MiB to 96 MiB (active bytes), and
    settings without it round as before."""
    need_gpu()
    out = run_script(SETTINGS)
    nbytes = 4 * 21 * 1024 * 1024
    assert out["plain"] == nbytes and out["div4"] == 96 << 20 and out["reset"] == nbytes, out
    assert out["requested"], out


RECORD_STREAM = """
    t = torch.FloatTensor([1, 2, 3, 4]).pin_memory()
    result = torch.cuda.FloatTensor(t.size())
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tmp = t.cuda(non_blocking=True)
        ptr = tmp.data_ptr()
    torch.cuda.current_stream().wait_stream(stream)
    tmp.record_stream(torch.cuda.current_stream())
    torch.cuda._sleep(50_000_000)  # the main stream still uses tmp
    result.copy_(tmp)
    del tmp
    active_held = torch.cuda.memory_stats()["active_bytes.all.current"]
    allocated_held = torch.cuda.memory_stats()["allocated_bytes.all.current"]
    with torch.cuda.stream(stream):
        tmp2 = torch.cuda.FloatTensor(t.size())
        tmp2.zero_()
    out["too_soon"] = tmp2.data_ptr() == ptr
    out["result"] = result.tolist()
    out["held"] = active_held - allocated_held
    torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(stream):
        tmp3 = torch.cuda.FloatTensor(t.size())
    out["reused"] = tmp3.data_ptr() == ptr
"""


def test_record_stream_holds_the_block_until_the_stream_is_done() -> None:
    """test_record_stream: a block freed while a stream it was recorded on still runs is not handed out
    (it counts as active, not allocated); once that stream is done, the next allocation of its size on its
    stream gets it back."""
    need_gpu()
    out = run_script(RECORD_STREAM)
    assert not out["too_soon"] and out["result"] == [1, 2, 3, 4], out
    assert out["held"] >= 256, out
    assert out["reused"], out


BAD_INPUT = """
    from gpuguard.torch import _native
    x = torch.empty(1000, device="cuda")
    errors = {}
    def expect(name, fn):
        try:
            fn()
            errors[name] = "accepted"
        except Exception as e:
            errors[name] = type(e).__name__
    expect("delete_foreign", lambda: torch.cuda.caching_allocator_delete(0x1234500))
    expect("delete_inside", lambda: torch.cuda.caching_allocator_delete(x.data_ptr() + 256))
    expect("fraction", lambda: torch.cuda.set_per_process_memory_fraction(1.5))
    expect("huge", lambda: torch.empty(1 << 62, dtype=torch.uint8, device="cuda"))
    expect("skip", lambda: torch.cuda.memory._record_memory_history(context="all", skip_actions=["bogus"]))
    expect("checkpoint_pool", lambda: torch._C._cuda_setCheckpointPoolState(
        0, torch._C._cuda_getCheckpointState(0, (777, 0)), [], []))
    expect("end_pool", lambda: torch._C._cuda_endAllocateToPool(0, (778, 0)))
    torch.cuda.memory._record_memory_history(None)
    out["errors"] = errors
    out["check"] = _native.check()
    y = torch.ones(1000, device="cuda")
    out["sum"] = float(y.sum())
    del x, y
    out["allocated"] = torch.cuda.memory_allocated()
"""


def test_bad_input_is_a_clear_exception_and_the_tables_stay_whole() -> None:
    """Bad input answered as PyTorch's allocator answers it (an exception), never a crash; the backend's
    tables check out afterwards and allocation goes on."""
    need_gpu()
    out = run_script(BAD_INPUT)
    for name, what in out["errors"].items():
        assert what in ("RuntimeError", "OutOfMemoryError", "ValueError"), (name, out["errors"])
    assert out["check"] == 0 and out["sum"] == 1000.0 and out["allocated"] == 0, out


FRACTION = """
    d = torch._C._cuda_getDevice()
    out["fraction"] = torch.cuda.memory.get_per_process_memory_fraction(d)
    total = torch.cuda.get_device_properties(d).total_memory
    x = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")  # under a tenth: fine
    try:
        torch.empty(int(total * 0.08), dtype=torch.uint8, device="cuda")  # 0.13 in all: over it
        out["oom"] = False
    except torch.OutOfMemoryError:
        out["oom"] = True
    del x
    torch.cuda.set_per_process_memory_fraction(1.0, d)  # the call overrides the setting
    out["after_set"] = torch.cuda.memory.get_per_process_memory_fraction(d)
    y = torch.empty(int(total * 0.08), dtype=torch.uint8, device="cuda")
    out["backend"] = torch.cuda.get_allocator_backend()
"""


def test_per_process_memory_fraction_setting_bounds_the_arena() -> None:
    """test_allocator_memory_fraction_setting: PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F is the
    device arena's bound from its first allocation, get_per_process_memory_fraction reports it, and a
    value outside [0, 1] stops the process with PyTorch's own message."""
    need_gpu()
    out = run_script(FRACTION, PYTORCH_CUDA_ALLOC_CONF="per_process_memory_fraction:0.1")
    assert out == {"fraction": 0.1, "oom": True, "after_set": 1.0, "backend": "gpuguard"}, out
    bad = run_script_raw("torch.empty(1, device='cuda')", PYTORCH_CUDA_ALLOC_CONF="per_process_memory_fraction:1.1")
    assert bad.returncode != 0 and "per_process_memory_fraction is invalid" in bad.stderr, bad.stderr[-2000:]


PROFILER = """
    import json
    from torch.cuda._memory_viz import _profile_to_snapshot
    def make_tensors():  # the frame the profiler's memory events must carry
        x = torch.rand(128, 128, device="cuda")
        return x * x + x * x
    with torch.profiler.profile(with_stack=True, profile_memory=True, record_shapes=True) as prof:
        make_tensors()
    snap = _profile_to_snapshot(prof)
    out["frame"] = "make_tensors" in json.dumps(snap)
    trace = [e for dev in snap["device_traces"] for e in dev]
    out["allocs"] = sum(1 for e in trace if e["action"] == "alloc")
    out["frees"] = sum(1 for e in trace if e["action"] == "free_completed")
"""


def test_profiler_sees_every_block_with_its_stack() -> None:
    """test_memory_profiler_viz: under torch.profiler(profile_memory=True) each allocation and free is
    reported to the profiler, with the Python stack that made it."""
    need_gpu()
    out = run_script(PROFILER)
    assert out["frame"] and out["allocs"] >= 3 and out["frees"] >= 2, out


COMPILE_CONTEXT = """
    torch.cuda.memory._record_memory_history(context="all", compile_context=True)
    x = torch.randn(64, device="cuda")  # outside any compiled region
    f = torch.compile(lambda t: (t * 2).sin() + 1)
    f(x)
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    out["first"] = trace[0]["compile_context"]
    seen = []
    for e in trace:
        c = e["compile_context"]
        if c != "N/A" and (not seen or seen[-1] != c):
            seen.append(c)
    out["regions"] = seen
"""


def test_trace_entries_name_their_compiled_region() -> None:
    """test_memory_compile_regions: an entry made outside torch.compile's regions says "N/A" (what tools
    skip), one made inside says which region."""
    need_gpu()
    out = run_script(COMPILE_CONTEXT)
    assert out["first"] == "N/A", out
    assert out["regions"] and all(r.startswith("Torch-Compiled Region") for r in out["regions"]), out
