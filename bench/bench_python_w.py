"""bench_python_w.py — bench_python.py's part (w): third-party model code under each allocator, one process
per run, alternating rounds (bench_python.py's docstring says what the tables hold)."""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

from bench_common import FROM_SOURCE, PKG, SCRIPT, MiB, _usage, decoder_model, table


# Third-party model code, each with the shapes it varies over: a step draws one per step (the same
# sequence in every process), after a first pass over all of them that warms the kernels up.
W_WORKLOADS = {
    "gpt2": ("transformers", "Hugging Face GPT-2 124M from GPT2Config, AdamW, seq 128..1024 at 8k tokens",
             [128, 256, 512, 1024]),
    "gptce": ("torch", "GPT-like 12 x 1024, 32k vocabulary, fp32 logits into cross-entropy, fused AdamW, "
              "seq 128..2048 at 8k tokens", [128, 256, 512, 1024, 2048]),
    "gptbf16": ("torch", "GPT-like 12 x 1024 with bf16 weights, 32k vocabulary, fused AdamW, seq drawn from 7 "
                "lengths 128..2048 at 12k tokens", [128, 256, 384, 512, 768, 1024, 2048]),
    "vit": ("timm", "timm vit_base_patch16_224, AdamW, batch 32..128", [32, 64, 96, 128]),
    "resnet": ("torchvision", "torchvision resnet50, channels_last, cudnn.benchmark, SGD, batch 64, "
               "160..256 px", [160, 192, 224, 256]),
}
W_ALLOCATORS = [("PyTorch default", "default", {}),
                ("expandable_segments", "expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
                ("cudaMallocAsync", "async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
                ("gpuguard", "gpuguard", {})]
W_TOKENS = 8192
W_TOKENS_BF16 = 12288  # 3 x 4096: every one of gptbf16's seven lengths divides it, so no step has more tokens


def w_gpuguard_native() -> bool:
    """Whether the installed gpuguard.torch offers its native PyTorch backend (GPUGUARD_TORCH=1): its
    ``native_available()`` says so. Asked in a child process, so this one never imports torch."""
    code = ("import gpuguard.torch as g, sys; f = getattr(g, 'native_available', None); "
            "sys.stdout.write('1' if f is not None and f() else '0')")
    env = dict(os.environ)
    if FROM_SOURCE:
        env["PYTHONPATH"] = os.pathsep.join([PKG, os.environ.get("PYTHONPATH", "")])
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        return r.stdout.strip() == "1"
    except Exception:
        return False


def w_gpuguard_env(native: bool) -> dict:
    """The environment of a gpuguard run: the native backend when it is there, else use_arena (set up in
    the child by w_gpuguard_setup)."""
    return {"GPUGUARD_TORCH": "1", "GG_BENCH_W_GPUGUARD": "native"} if native else \
        {"GG_BENCH_W_GPUGUARD": "use_arena"}


def w_gpuguard_setup():
    """In a gpuguard child, before CUDA is initialised: the arena that serves PyTorch (use_arena), or
    None for the native backend (GPUGUARD_TORCH=1, set by the parent; use_native() makes it so where
    the wheel's .pth did not, as when the package runs from the source tree)."""
    import gpuguard
    import gpuguard.torch as ggt
    if os.environ.get("GG_BENCH_W_GPUGUARD") == "native":
        ggt.use_native()
        return None
    arena = gpuguard.Arena(capacity=None, name="bench-workload")  # capacity: the device's memory
    ggt.use_arena(arena)
    return arena


def w_build(torch, workload: str):
    """(model, optimizer, make_batch(shape, gen) -> (inputs, target), loss(model, inputs, target))."""
    from torch import nn
    F = nn.functional
    if workload == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).cuda()  # 124M: 12 x 768, vocabulary 50257, 1024 positions
        vocab = model.config.vocab_size
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def batch(seq, g):
            ids = torch.randint(0, vocab, (W_TOKENS // seq, seq), device="cuda", generator=g)
            return ids, ids

        def loss(m, ids, labels):
            return m(input_ids=ids, labels=labels).loss
    elif workload in ("gptce", "gptbf16"):  # gptbf16: held in bf16 (weights, grads, AdamW's state)
        from torch import nn as tnn
        vocab = 32768
        model = decoder_model(torch, tnn, vocab=vocab).cuda()
        if workload == "gptbf16":
            model = model.to(torch.bfloat16)
        tokens = W_TOKENS_BF16 if workload == "gptbf16" else W_TOKENS
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def batch(seq, g):
            idx = torch.randint(0, vocab, (tokens // seq, seq + 1), device="cuda", generator=g)
            return idx[:, :-1], idx[:, 1:]

        def loss(m, x, y):
            logits = m(x)  # fp32 logits into the cross-entropy, as GPT trainers do
            return F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
    elif workload == "vit":
        import timm
        model = timm.create_model("vit_base_patch16_224", pretrained=False).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def batch(n, g):
            x = torch.randn(n, 3, 224, 224, device="cuda", generator=g)
            return x, torch.randint(0, 1000, (n,), device="cuda", generator=g)

        def loss(m, x, y):
            return F.cross_entropy(m(x), y)
    elif workload == "resnet":
        import torchvision
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def batch(px, g):
            x = torch.randn(64, 3, px, px, device="cuda", generator=g).contiguous(memory_format=torch.channels_last)
            return x, torch.randint(0, 1000, (64,), device="cuda", generator=g)

        def loss(m, x, y):
            return F.cross_entropy(m(x), y)
    else:
        raise SystemExit(f"bench_python: unknown workload {workload!r} (one of {', '.join(W_WORKLOADS)})")
    return model, opt, batch, loss


def w_shapes(workload: str, steps: int, seed: int = 0) -> list:
    """The shape of every step: a first pass over all shapes (shuffled), then one drawn per step."""
    import random
    rng = random.Random(seed)
    shapes = list(W_WORKLOADS[workload][2])
    first = shapes[:]
    rng.shuffle(first)
    return (first + [rng.choice(shapes) for _ in range(steps)])[:max(steps, len(first))]


def w_warmup(workload: str, steps: int) -> int:
    """Steps left out of the figures: the first pass over the shapes and 4 more."""
    return min(steps - 1, len(W_WORKLOADS[workload][2]) + 4)


def w_waits(torch, arena) -> int:
    """Host waits for the GPU the gpuguard allocator made so far (every one is counted): the arena's, or
    the native backend's under torch.cuda.memory_stats()'s gpuguard keys; -1 when unknown."""
    if arena is not None:
        return arena.stats()["n_stream_waits"]
    st = torch.cuda.memory_stats()  # the native backend: every host wait of its arenas
    for k in ("num_sync_all_streams", "gpuguard.n_stream_waits"):
        if k in st:
            return int(st[k])
    return -1


def w_device_calls(torch, arena) -> int:
    """Driver allocations and frees so far: the arena's chunk maps and unmaps, or what memory_stats()
    counts (cudaMalloc/cudaFree for PyTorch's allocator, cuMemCreate maps and unmaps for gpuguard's
    backend); -1 when unknown."""
    if arena is not None:
        st = arena.stats()
        return int(st.get("n_maps", -1) + st.get("n_unmaps", 0))
    st = torch.cuda.memory_stats()
    if "num_device_alloc" not in st:
        return -1
    return int(st["num_device_alloc"] + st.get("num_device_free", 0))


def w_cpus(spec: str) -> list:
    """The CPUs every run of (w) is pinned to: ``auto`` (the last four this process may use), ``none``
    (no pinning: []) or a comma-separated list. These models are launch-bound (a ResNet-50 step is ~10 ms
    of kernels and ~25 ms of host work), so where the scheduler puts a run moves its step time by tens of
    percent from one process to the next; the same CPUs for every run take the scheduler's part of that
    out of the comparison (on the H200's VM they did not narrow the spread: what is left is the VM's)."""
    if spec == "none":
        return []
    have = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if spec == "auto":
        return have[-4:] if len(have) >= 8 else []
    try:
        cpus = sorted({int(c) for c in spec.split(",") if c.strip()})
    except ValueError:
        _usage(f"bench_python: --cpus {spec!r}: not auto, none or a list of CPU numbers")
    bad = [c for c in cpus if c not in have]
    if not cpus or bad:
        _usage(f"bench_python: --cpus {spec!r}: CPUs {bad or spec} are not this process's "
               f"(it may use {','.join(map(str, have))})")
    return cpus


def child_w(spec: str, args: argparse.Namespace) -> dict:
    """One run: `w:WORKLOAD:ALLOCATOR`. Prints one JSON line."""
    import gc
    import statistics
    _, workload, alloc = spec.split(":")
    cpus = {int(c) for c in os.environ.get("GG_BENCH_W_CPUS", "").split(",") if c}
    if cpus:  # before torch starts its threads: they inherit the mask
        os.sched_setaffinity(0, cpus)
        os.environ["OMP_NUM_THREADS"] = str(len(cpus))  # no more CPU threads than CPUs
    arena = w_gpuguard_setup() if alloc == "gpuguard" else None
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    t_build = time.perf_counter()
    model, opt, make_batch, loss_fn = w_build(torch, workload)
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    shapes = w_shapes(workload, args.steps)
    warm = w_warmup(workload, len(shapes))
    trace = os.environ.get("GPUGUARD_PLUGIN_TRACE")
    times, queued, offsets, losses = [], [], [], []
    waits_warm = 0
    calls_warm = -1
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t_build
    last = time.perf_counter()
    for k, shape in enumerate(shapes):
        x, y = make_batch(shape, g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        queued.append(time.perf_counter() - last)  # host time to queue the step's work
        losses.append(loss.item())  # a loop that logs its loss: the host waits for the step here
        now = time.perf_counter()
        times.append(now - last)
        last = now
        del x, y, loss
        if trace:
            offsets.append(os.path.getsize(trace) if os.path.exists(trace) else -1)
        if k + 1 == warm:
            waits_warm = w_waits(torch, arena) if alloc == "gpuguard" else 0
            calls_warm = w_device_calls(torch, arena)
    measured = times[warm:]
    out = {"workload": workload, "alloc": alloc, "steps": len(shapes), "warm": warm,
           "median_ms": statistics.median(measured) * 1e3,
           "queued_ms": statistics.median(queued[warm:]) * 1e3, "build_s": build_s, "final_loss": losses[-1],
           "loss_sum": sum(losses), "offsets": offsets, "backend": "pytorch"}
    calls = w_device_calls(torch, arena)
    out["device_calls_per_step"] = (calls - calls_warm) / len(measured) if calls >= 0 and calls_warm >= 0 else -1
    if alloc == "gpuguard":
        w = w_waits(torch, arena)
        out["waits_per_step"] = (w - waits_warm) / len(measured) if w >= 0 else -1
        out["waits_total"] = w
        out["backend"] = "use_arena" if arena is not None else "native"
    else:
        out["waits_per_step"], out["waits_total"] = 0, 0
    if arena is not None:
        st = arena.stats()
        out["peak_reserved"], out["peak_allocated"] = st["peak_mapped"], st["peak_in_use"]
    else:
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
    del model, opt
    gc.collect()
    torch.cuda.synchronize()
    if arena is not None:
        import gpuguard.torch as ggt
        ggt.trim(arena)  # gc, sync, cuBLAS workspaces, empty_cache, the arena's trim
        st = arena.stats()
        out["held_after"] = st["bytes_mapped"] - st["bytes_in_use"]
    else:
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        out["held_after"] = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return out


def w_run(workload: str, alloc: str, env: dict, args: argparse.Namespace, trace: str) -> dict:
    env = {**os.environ, "GPUGUARD_BACKEND": "cuda", "GPUGUARD_TORCH": "0", **env}  # PyTorch's own unless asked
    env["GG_BENCH_W_CPUS"] = ",".join(map(str, args.cpu_list))
    if trace:
        env["GPUGUARD_PLUGIN_TRACE"] = trace
    cmd = [sys.executable, SCRIPT, "--child", f"w:{workload}:{alloc}", "--steps",
           str(args.steps)]
    if args.dry:
        return w_dry_result(workload, alloc, args, trace)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"  run failed: {workload} / {alloc}: still running after 600 s", flush=True)
        return {}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        out = r.stdout + r.stderr
        tail = "\n".join(out.splitlines()[-30:])
        print(f"  run failed: {workload} / {alloc} (rc {r.returncode}):\n{tail}", flush=True)
        return {}
    return json.loads(lines[-1])


def w_dry_result(workload: str, alloc: str, args: argparse.Namespace, trace: str) -> dict:
    """--dry: a made-up result (and trace) that exercises the tables and the trace merge, no torch."""
    import random
    rng = random.Random(hash((workload, alloc)) & 0xffff)
    shapes = w_shapes(workload, args.steps)
    offsets = []
    if trace:
        with open(trace, "w") as f:
            f.write("# gpuguard plugin trace, dry run\n")
            for k, _ in enumerate(shapes):
                f.write(f"a {0x1000 * (k + 1):#x} 4096 (nil)\nf {0x1000 * (k + 1):#x} (nil)\n")
                f.flush()
                offsets.append(f.tell())
    return {"workload": workload, "alloc": alloc, "steps": len(shapes), "warm": w_warmup(workload, len(shapes)),
            "median_ms": 30 + 5 * rng.random(), "queued_ms": 20 + 5 * rng.random(), "build_s": 1.0,
            "final_loss": 6.25, "loss_sum": 100.0,
            "offsets": offsets, "backend": "dry", "waits_per_step": 0.0, "waits_total": 0,
            "device_calls_per_step": 0.0,
            "peak_reserved": 1010 * MiB, "peak_allocated": 1000 * MiB, "held_after": 0}


def w_merge_trace(raw: str, offsets: list) -> str:
    """Writes RAW.gz with a `# step K` line after each step's last event (bench_replay --catch-up step
    reads them) and removes RAW. The child noted the trace's size after each step: the backend flushes
    every line, and the step's loss.item() made every call of the step come first."""
    import gzip
    with open(raw, "rb") as f:
        data = f.read()
    out = raw + ".gz"
    with gzip.open(out, "wb") as g:
        pos = 0
        for k, off in enumerate(offsets):
            if off < pos:
                continue
            g.write(data[pos:off])
            g.write(f"# step {k + 1}\n".encode())
            pos = off
        g.write(data[pos:])
    os.remove(raw)
    return out


def w_spread_note(med: float, base: list) -> str:
    """Where gpuguard's median step is above the default's, whether the gap is smaller than the spread
    of the default's own runs (max - min over their median): such a gap ranks processes, not
    allocators, and more rounds are what would tell."""
    import statistics
    if not base or len(base) < 2:
        return ""
    times = [x["median_ms"] for x in base]
    mid = statistics.median(times)
    if med <= mid:
        return ""
    gap = (med - mid) / mid
    spread = (max(times) - min(times)) / mid
    where = "inside" if gap <= spread else "outside"
    return f" (gpuguard +{gap * 100:.1f}%: {where} the default's run-to-run spread of {spread * 100:.1f}%)"


def part_w(args: argparse.Namespace) -> int:
    import importlib.util
    import statistics
    names = [w for w in args.workloads.split(",") if w]
    bad = [w for w in names if w not in W_WORKLOADS]
    if bad:
        print(f"bench_python: unknown workload(s) {', '.join(bad)} (known: {', '.join(W_WORKLOADS)})")
        return 2
    run = []
    for w in names:
        pkg = W_WORKLOADS[w][0]
        if not args.dry and importlib.util.find_spec(pkg) is None:
            print(f"\nskip: workload {w}: the package {pkg} is not installed")
        else:
            run.append(w)
    if not run:
        return 0
    native = args.gpuguard == "native" or (args.gpuguard == "auto" and not args.dry and w_gpuguard_native())
    want = [a for a in args.allocators.split(",") if a]
    known = [mode for _, mode, _ in W_ALLOCATORS]
    if any(a not in known for a in want):
        print(f"bench_python: unknown allocator(s) in --allocators {args.allocators} (known: {', '.join(known)})")
        return 2
    allocs = [(label, mode, w_gpuguard_env(native) if mode == "gpuguard" else env)
              for label, mode, env in W_ALLOCATORS if mode in want]
    print(f"\n(w) workloads {', '.join(run)}: {args.steps} steps, {args.rounds} alternating rounds, one process "
          f"per run; gpuguard through {'the native backend (GPUGUARD_TORCH=1)' if native else 'use_arena'}; "
          f"runs pinned to CPUs {','.join(map(str, args.cpu_list)) or '(none: not pinned)'}", flush=True)
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
    res: dict = {}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):  # alternate, so a drift of the machine hits every allocator alike
        for w in run:
            for label, mode, env in allocs:
                trace = os.path.join(os.path.abspath(args.trace), f"{w}-r{rnd + 1}.trace") \
                    if args.trace and mode == "gpuguard" else ""
                r = w_run(w, mode, env, args, trace)
                if not r:
                    continue
                # The backend writes TRACE.PID (one file per process): the training process's is the largest.
                for f in sorted(glob.glob(trace + ".[0-9]*") if trace else [], key=os.path.getsize)[-1:]:
                    os.replace(f, trace)
                if trace and os.path.exists(trace):
                    r["trace"] = w_merge_trace(trace, r.get("offsets", []))
                elif trace:
                    r["trace"] = "(none written: the backend writes GPUGUARD_PLUGIN_TRACE.PID at its first allocation)"
                res.setdefault((w, label), []).append(r)
                ratio = r["peak_reserved"] / max(1, r["peak_allocated"])
                print(f"  run {rnd + 1}: {w:7s} {label:20s} median {r['median_ms']:7.2f} ms (queued in "
                      f"{r.get('queued_ms', -1):.2f}), peak reserved/allocated "
                      f"{ratio:.3f}, host waits/step {r['waits_per_step']:.2f}, driver allocs+frees/step "
                      f"{r.get('device_calls_per_step', -1):.1f}, held after empty_cache "
                      f"{r['held_after'] / MiB:.1f} MiB, final loss {r['final_loss']:.6f} [{r['backend']}, "
                      f"build {r['build_s']:.1f} s]" + (f" trace {r['trace']}" if r.get("trace") else ""), flush=True)
    print(f"\n(w) took {time.perf_counter() - t0:.0f} s")
    verdicts = []
    for w in run:
        rows = []
        base = res.get((w, "PyTorch default"))
        base_ms = statistics.median(x["median_ms"] for x in base) if base else None
        exp = res.get((w, "expandable_segments"))
        exp_ms = statistics.median(x["median_ms"] for x in exp) if exp else None
        base_loss = base[0]["final_loss"] if base else None
        for label, _, _ in allocs:
            rs = res.get((w, label))
            if not rs:
                rows.append([label, "failed", "", "", "", "", "", "", "", ""])
                continue
            med = statistics.median(x["median_ms"] for x in rs)
            ratio = statistics.median(x["peak_reserved"] / max(1, x["peak_allocated"]) for x in rs)
            waits = statistics.median(x["waits_per_step"] for x in rs)
            held = max(x["held_after"] for x in rs)
            losses = [x["final_loss"] for x in rs]
            same = base_loss is not None and all(abs(v - base_loss) <= 1e-3 * max(1.0, abs(base_loss)) for v in losses)
            calls = statistics.median(x.get("device_calls_per_step", -1) for x in rs)
            queued = statistics.median(x.get("queued_ms", -1) for x in rs)
            rows.append([label, " / ".join(f"{x['median_ms']:.2f}" for x in rs), f"{med:.2f}", f"{queued:.2f}",
                         f"{med / base_ms:.3f}x" if base_ms else "-", f"{ratio:.3f}",
                         f"{waits:.2f}" if label == "gpuguard" else "-", f"{calls:.1f}" if calls >= 0 else "-",
                         f"{held / MiB:.1f}",
                         " / ".join(f"{v:.4f}" for v in losses) + ("" if same else " (differs from default)")])
            if label == "gpuguard":
                goals = [("step <= 1.00x default", base_ms is not None and med <= base_ms),
                         ("step <= expandable_segments", exp_ms is not None and med <= exp_ms),
                         ("peak ratio <= 1.01", ratio <= 1.01), ("0 host waits a step", waits == 0),
                         ("0 bytes held after empty_cache", held == 0)]
                verdicts.append(f"{w}: " + ", ".join(f"{n} {'met' if ok else 'NOT met'}" for n, ok in goals)
                                + w_spread_note(med, base))
        any_run = next((x[0] for lbl, _, _ in allocs for x in [res.get((w, lbl))] if x), None)
        if any_run is None:
            print(f"\n(w) {w}: every run failed")
            continue
        table(f"(w) {w}: {W_WORKLOADS[w][1]}, bf16 autocast, seed 0, {any_run['steps']} steps "
              f"({any_run['warm']} warm-up left out)",
              ["allocator", "median step ms (per run)", "median of runs", "host done queuing the step (ms)",
               "vs default", "peak reserved / peak allocated",
               "host waits a step after warm-up", "driver allocs + frees a step after warm-up",
               "held after empty_cache beyond live MiB (worst run)",
               "final loss (per run)"], rows)
    print("\n(gpuguard: reserved = the arena's peak_mapped, allocated = its peak_in_use; others: "
          "torch.cuda.max_memory_reserved / max_memory_allocated. Host waits: every wait for the GPU the "
          "gpuguard allocator made, from its counters. Final losses differ between allocators only where "
          "cudnn.benchmark picks other kernels.)")
    print("\n" + "\n".join(verdicts))
    return 0

