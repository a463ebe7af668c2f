#!/usr/bin/env python3
"""bench_python.py — the Python binding's costs and PyTorch through a gpuguard arena, as tables.

  GPUGUARD_LIBRARY=build/libgpuguard.so python3 bench/bench_python.py [--quick] [--parts a,b,c]

(a) Python overhead per call: scope enter+exit and alloc+free through the binding (goal <= 2 us each);
    runs on any backend (the host backend without a GPU).
(b) torch.empty + del through gpuguard's native backend, a MemPool and the global use_arena form against
    PyTorch's caching allocator and expandable_segments, 256 B .. 64 MiB and a mix with 256 tensors live:
    each column its own process, the columns interleaved --rounds times (--cpus pins them), medians.
(c) a transformer training loop (nn.TransformerEncoder, 8 layers, d_model 1024, AdamW, 120 steps, sequence
    length drawn from 64..2048 and batch from 4..16 with one seed), each allocator in its own process:
    peak reserved / peak allocated, and what the allocator and the driver still hold after the model is
    deleted, gc'd and the cache emptied / the arena trimmed.
(d) a decoder-only transformer of the kind people train (12 layers, d_model 1024, causal attention, bf16
    autocast, fused AdamW, batch 4, a step of tens of ms, sequence length drawn per step from 128..1024 in steps of 64), each
    allocator in its own process: median step time (and its ratio to PyTorch's default allocator), peak
    reserved / peak allocated, what is held after trim, and the arena's host waits, trims and maps.
(s) side streams: torch.empty + fill_ + del on a second stream (a prefetch or all-gather stream), each
    allocator in its own process: host us per pair with the GPU idle, and host ms to queue 100 such pairs
    behind a ~50 ms kernel on the default stream (an allocator that waits on the host for a stream stalls
    the Python thread for the kernel's length; one that orders streams on the device does not).
(w) workloads: third-party model code (a Hugging Face GPT-2 from a config, a GPT-like model with fp32
    logits into a 32k-vocabulary cross-entropy, the same model held in bf16 with its sequence length drawn
    each step from 7 lengths 128..2048 at a constant 12k tokens, a timm ViT-B/16, a torchvision ResNet-50 with
    cudnn.benchmark), each varying its shapes from step to step, bf16 autocast, seed 0; one process per
    run, allocators alternating (PyTorch default, expandable_segments, cudaMallocAsync, gpuguard) for
    --rounds rounds: every run printed, then per workload the median of runs: step time and its ratio to
    the default, peak reserved / peak allocated, gpuguard's host waits a step after warm-up, bytes held
    after empty_cache, final losses. --workloads, --steps, --trace DIR (gpuguard runs' allocation traces
    for bench_replay), --gpuguard auto|native|arena (auto: the native backend, GPUGUARD_TORCH=1, where
    gpuguard.torch.native_available() says so, else use_arena); a workload whose package is missing is
    skipped, saying so. --dry checks the tables without torch. A default run (5 x 4 x 3) takes ~7-9
    minutes on an H200.
(b), (c), (d), (s) and (w) need torch and a CUDA device; without them they print a skip line and the run fails
(exit 1) unless only (a) was asked for."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_common import MiB, SCRIPT, decoder_model, table
from bench_python_w import child_w, part_w, w_cpus, w_gpuguard_native


# ---- (a) ------------------------------------------------------------------------------------------


def part_a(quick: bool) -> None:
    import gpuguard
    n = 20000 if quick else 200000
    with gpuguard.Arena(capacity=256 * MiB, name="bench") as arena:
        arena.free(arena.alloc(256))  # map the first chunk
        rows = []

        def timed(label: str, fn, goal: bool = True) -> None:
            fn(1000)
            best = min(_time(fn, n) for _ in range(3))
            rows.append([label, f"{best * 1e6:.2f}", ("yes" if best <= 2e-6 else "no") if goal else "-"])

        def scope(k: int) -> None:
            s = arena.scope
            for _ in range(k):
                with s():
                    pass

        def alloc_free(k: int) -> None:
            a = arena.alloc
            for _ in range(k):
                a(256).free()

        def alloc_free_in_scope(k: int) -> None:
            a = arena.alloc
            for _ in range(k):
                with arena.scope():
                    a(256)

        timed("scope enter + exit (`with arena.scope()`)", scope)
        timed("alloc(256) + free() (Allocation object)", alloc_free)
        timed("scope + alloc(256) released by the scope (both together)", alloc_free_in_scope, goal=False)
        backend = arena.backend
    table(f"(a) Python overhead per call ({backend} backend, best of 3 x {n})", ["operation", "us / pair",
                                                                                 "<= 2 us"], rows)


def _time(fn, n: int) -> float:
    t = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t) / n


# ---- helpers for torch subprocesses -----------------------------------------------------------------


def have_cuda_torch() -> str:
    """'' when torch and a CUDA device are usable, else why not."""
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
        return "" if r.stdout.strip() == "True" else "torch.cuda.is_available() is False (no CUDA device)"
    except Exception as e:
        return str(e)


def child(mode: str, args: argparse.Namespace, env_extra: dict) -> dict:
    env = {**os.environ, "GPUGUARD_BACKEND": "cuda", "GPUGUARD_TORCH": "0", **env_extra}  # PyTorch's unless asked
    cmd = [sys.executable, SCRIPT, "--child", mode] + (["--quick"] if args.quick else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"bench child {mode} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")
    return json.loads(lines[-1])


SIZES = [256, 4096, 65536, MiB, 16 * MiB, 64 * MiB]


def _empty_loop(torch, sizes, n: int) -> dict:
    """Best of 3 for each size and the mix, the three passes each over every case in turn: a process
    whose speed shifts part-way (the H200's VM does that) then shifts every case alike."""
    import random
    rng = random.Random(0)
    k_mix = max(1000, n * 2)
    mix_sizes = [int(512 * 2 ** (rng.random() * 16)) for _ in range(k_mix)]
    mix_slots = [rng.randrange(256) for _ in range(k_mix)]
    live = [torch.empty(512, dtype=torch.uint8, device="cuda") for _ in range(256)]

    def pairs(size: int, k: int) -> None:
        for _ in range(k):
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t

    def mix() -> None:
        """256 tensors live, a random one replaced each time by one of a log-uniform size, 512 B..32 MiB
        (the same sizes in every process): where a training step's host time goes, unlike a pair that
        reuses one block."""
        for size, j in zip(mix_sizes, mix_slots):
            live[j] = torch.empty(size, dtype=torch.uint8, device="cuda")

    counts = {size: max(50, n // (1 + size // MiB)) for size in sizes}  # fewer pairs for larger sizes
    cases = [(str(size), lambda size=size: pairs(size, counts[size]), counts[size]) for size in sizes] + \
        [("mix", mix, k_mix)]
    for size in sizes:
        pairs(size, 50)
    out = {name: float("inf") for name, _, _ in cases}
    for _ in range(3):
        for name, fn, k in cases:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out[name] = min(out[name], (time.perf_counter() - t0) / k)
    del live
    return {name: best * 1e6 for name, best in out.items()}


def child_b(mode: str, quick: bool) -> dict:
    cpus = {int(c) for c in os.environ.get("GG_BENCH_W_CPUS", "").split(",") if c}
    if cpus:  # before torch starts its threads: they inherit the mask
        os.sched_setaffinity(0, cpus)
    import torch
    import gpuguard
    import gpuguard.torch as ggt
    n = 2000 if quick else 20000
    if mode == "b-native":  # GPUGUARD_TORCH=1, set by the parent
        ggt.use_native()
        return {"gpuguard native": _empty_loop(torch, SIZES, n)}
    if mode == "b-expandable":
        return {"expandable_segments": _empty_loop(torch, SIZES, n)}
    if mode == "b-global":
        arena = gpuguard.Arena(capacity=32 << 30, name="bench-global")
        ggt.use_arena(arena)
        return {"gpuguard global": _empty_loop(torch, SIZES, n)}
    if mode == "b-mempool":  # a MemPool drawing from an arena, on the native backend (mem_pool needs it)
        ggt.use_native()
        torch.zeros(1, device="cuda")
        arena = gpuguard.Arena(capacity=32 << 30, name="bench-pool")
        with ggt.mem_pool(arena):
            return {"gpuguard MemPool": _empty_loop(torch, SIZES, n)}
    torch.zeros(1, device="cuda")
    return {"pytorch caching": _empty_loop(torch, SIZES, n)}


def part_b(args: argparse.Namespace) -> None:
    """Each column is its own process; on the H200's VM one process's figures move by up to ~1.3 us a
    pair from the next one's (a whole process, or half of one, runs at one speed or the other, under
    every allocator alike). So the columns run interleaved, ``--rounds`` times, the first column of a
    round rotating, each pinned to ``--cpus`` when given, and the table gives each cell's median over
    the rounds; the mix's ratio per round comes below it."""
    cols = [("pytorch caching", "b-pool", {}),
            ("expandable_segments", "b-expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})]
    if w_gpuguard_native():
        cols += [("gpuguard native", "b-native", {"GPUGUARD_TORCH": "1"}),
                 ("gpuguard MemPool", "b-mempool", {}), ("gpuguard global", "b-global", {})]
    pin = {"GG_BENCH_W_CPUS": ",".join(map(str, args.cpu_list))} if args.cpu_list else {}
    runs: dict = {}
    rounds = max(1, args.rounds)
    for rnd in range(rounds):
        for i in range(len(cols)):
            key, mode, env = cols[(i + rnd) % len(cols)]
            runs.setdefault(key, []).append(child(mode, args, {**env, **pin})[key])
    med = {k: {s: statistics.median(r[s] for r in rs) for s in rs[0]} for k, rs in runs.items()}
    base = med["pytorch caching"]
    labels = {"expandable_segments": "expandable_segments", "gpuguard native": "gpuguard native (GPUGUARD_TORCH=1)",
              "gpuguard MemPool": "gpuguard MemPool", "gpuguard global": "gpuguard global use_arena"}
    shown = [k for k, _, _ in cols[1:]]
    rows = []
    for size in SIZES + ["mix"]:
        s = str(size)
        rows.append([_fmt_size(size) if size != "mix" else "mix: 256 live, 512 B..32 MiB",
                     f"{base[s]:.2f}"] + [f"{med[k][s]:.2f} ({med[k][s] / base[s]:.2f}x)" for k in shown])
    table(f"(b) torch.empty + del, us per pair, median of {rounds} interleaved runs a column "
          "(ratio to PyTorch's caching allocator)", ["size", "PyTorch caching"] + [labels[k] for k in shown], rows)
    every = [[_fmt_size(size) if size != "mix" else "mix"] +
             [" / ".join(f"{r[str(size)]:.2f}" for r in runs[k]) for k in ["pytorch caching"] + shown]
             for size in SIZES + ["mix"]]
    table("(b) every run, in round order (us per pair)", ["size", "PyTorch caching"] + [labels[k] for k in shown],
          every)


def _fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else (f"{n // 1024} KiB" if n >= 1024 else f"{n} B")


# ---- (s) ------------------------------------------------------------------------------------------


def child_s(mode: str, quick: bool) -> dict:
    import torch
    if mode == "s-global":
        import gpuguard
        import gpuguard.torch as ggt
        ggt.use_arena(gpuguard.Arena(capacity=8 << 30, name="bench-side"))
    side, n = torch.cuda.Stream(), 1 << 18  # 1 MiB blocks

    def pairs(k: int) -> None:
        with torch.cuda.stream(side):
            for _ in range(k):
                y = torch.empty(n, device="cuda")
                y.fill_(1.0)
                del y
    pairs(500)
    torch.cuda.synchronize()
    k = 1000 if quick else 10000
    t0 = time.perf_counter()
    pairs(k)
    idle = (time.perf_counter() - t0) / k
    torch.cuda.synchronize()
    busy = []
    for _ in range(3):
        torch.cuda._sleep(100_000_000)  # ~50 ms on the default stream
        t0 = time.perf_counter()
        pairs(100)
        busy.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return {"idle_us": idle * 1e6, "busy_ms": min(busy) * 1e3}


def part_s(args: argparse.Namespace) -> None:
    rows = []
    for mode, label in (("s-caching", "PyTorch caching"), ("s-global", "gpuguard global use_arena")):
        r = child(mode, args, {})
        rows.append([label, f"{r['idle_us']:.1f}", f"{r['busy_ms']:.1f}"])
    table("(s) side stream: torch.empty + fill_ + del of 1 MiB on a second stream (host time)",
          ["allocator", "us per pair, GPU idle", "ms to queue 100 pairs behind a 50 ms kernel"], rows)


# ---- (c) ------------------------------------------------------------------------------------------


def train_transformer(torch, nn, steps: int):
    """The training loop of part (c), also used by torch_trace.py: returns (model, opt, layer, seconds)."""
    import random
    torch.backends.cuda.matmul.allow_tf32 = True  # same math in every configuration; keeps the run short
    torch.manual_seed(0)
    rng = random.Random(0)
    layer = nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=8, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    for _ in range(steps):
        seq, batch = rng.randint(64, 2048), rng.randint(4, 16)
        x = torch.randn(batch, seq, 1024, device="cuda")
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
    torch.cuda.synchronize()
    return model, opt, layer, time.perf_counter() - t0


def child_c(mode: str, quick: bool) -> dict:
    import gc
    import torch
    from torch import nn
    arena = None
    if mode.startswith("c-gpuguard"):
        import gpuguard
        import gpuguard.torch as ggt
        chunk = {"c-gpuguard-2m": 2 << 20, "c-gpuguard-64m": 64 << 20}.get(mode)  # None: the default, 8 MiB
        arena = gpuguard.Arena(capacity=None, chunk_size=chunk, name="bench-train")  # capacity: device size
        ggt.use_arena(arena)  # before CUDA is initialised
    steps = 20 if quick else 120
    model, opt, layer, elapsed = train_transformer(torch, nn, steps)
    if arena is not None:
        s = arena.stats()
        peak_reserved, peak_alloc = s["peak_mapped"], s["peak_in_use"]
    else:
        peak_reserved, peak_alloc = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    del model, opt, layer
    gc.collect()
    torch.cuda.synchronize()
    if arena is not None:
        ggt.trim(arena)  # gc, sync, cuBLAS workspaces dropped, empty_cache, arena trim
        st = arena.stats()
        held, live = st["bytes_mapped"], st["bytes_in_use"]
        waits = st["n_stream_waits"]
    else:  # the same steps for PyTorch's allocator
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        held, live = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        waits = 0
    free, total = torch.cuda.mem_get_info()
    return {"peak_reserved": peak_reserved, "peak_allocated": peak_alloc, "held_after": held, "live_after": live,
            "driver_used_after": total - free, "seconds": elapsed, "steps": steps, "stream_waits": waits}


# ---- (d) ------------------------------------------------------------------------------------------


def train_decoder(torch, nn, steps: int, batch: int = 4, vocab: int = 32768):
    """bf16 autocast, fused AdamW, sequence length drawn per step; loss.item() every step (as a training
    loop that logs does). Returns (per-step seconds, model, opt)."""
    import random
    torch.manual_seed(0)
    rng = random.Random(0)
    model = decoder_model(torch, nn, vocab=vocab).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    times = []
    torch.cuda.synchronize()
    last = time.perf_counter()
    for _ in range(steps):
        seq = 64 * rng.randint(2, 16)  # bucketed, as data loaders do: kernels for each shape warm up
        idx = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().view(-1, vocab), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        now = time.perf_counter()
        times.append(now - last)
        last = now
        del idx, logits, loss
    return times, model, opt


def child_d(mode: str, quick: bool) -> dict:
    import gc
    import statistics
    import torch
    from torch import nn
    arena = None
    if mode.startswith("d-gpuguard"):
        import gpuguard
        import gpuguard.torch as ggt
        chunk = {"d-gpuguard-64m": 64 << 20}.get(mode)
        arena = gpuguard.Arena(capacity=None, chunk_size=chunk, name="bench-decoder")
        ggt.use_arena(arena)
    steps = 30 if quick else 100
    times, model, opt = train_decoder(torch, nn, steps)
    warm = times[20:]  # the first steps pick kernels for each shape and grow the pool
    out = {"median_ms": statistics.median(warm) * 1e3, "mean_ms": statistics.mean(warm) * 1e3,
           "steps": steps}
    if arena is not None:
        s = arena.stats()
        out.update(peak_reserved=s["peak_mapped"], peak_allocated=s["peak_in_use"],
                   waits=s["n_stream_waits"], trims=s["n_trims"], maps=s.get("n_maps", -1))
    else:
        out.update(peak_reserved=torch.cuda.max_memory_reserved(), peak_allocated=torch.cuda.max_memory_allocated(),
                   waits=0, trims=0, maps=-1)
    del model, opt
    gc.collect()
    if arena is not None:
        ggt.trim(arena)
        out["held_after"] = arena.stats()["bytes_mapped"] - arena.stats()["bytes_in_use"]
    else:
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        out["held_after"] = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return out


def part_d(args: argparse.Namespace) -> None:
    configs = [("PyTorch default", "d-torch", {}),
               ("expandable_segments:True", "d-torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
               ("backend:cudaMallocAsync", "d-torch", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
               ("gpuguard use_arena (defaults)", "d-gpuguard", {}),
               ("gpuguard use_arena, 64 MiB chunks", "d-gpuguard-64m", {})]
    rounds = 1 if args.quick else args.rounds
    res: dict = {}
    for rnd in range(rounds):  # alternate the configurations, so a drift of the machine hits all of them
        for label, mode, env in configs:
            res.setdefault(label, []).append(child(mode, args, env))
    base = min(r["median_ms"] for r in res["PyTorch default"])
    rows = []
    for label, _, _ in configs:
        rs = res[label]
        med = min(r["median_ms"] for r in rs)
        r = rs[-1]
        rows.append([label, " / ".join(f"{x['median_ms']:.2f}" for x in rs), f"{med / base:.3f}x",
                     f"{r['peak_reserved'] / MiB:.0f}", f"{r['peak_allocated'] / MiB:.0f}",
                     f"{r['peak_reserved'] / r['peak_allocated']:.3f}", f"{r['held_after'] / MiB:.1f}",
                     r["waits"], r["trims"]])
    table(f"(d) decoder 12 x 1024, bf16 autocast, fused AdamW, batch 4, seq 128..1024, {rs[-1]['steps']} steps",
          ["allocator", "median step ms (per run)", "vs default (best run)", "peak reserved MiB", "peak allocated MiB",
           "ratio", "held after trim beyond live MiB", "arena host waits", "arena trims"], rows)


def part_c(args: argparse.Namespace) -> None:
    configs = [("PyTorch default", "c-torch", {}),
               ("expandable_segments:True", "c-torch", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
               ("backend:cudaMallocAsync", "c-torch", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
               ("gpuguard use_arena (default 8 MiB chunks)", "c-gpuguard", {}),
               ("gpuguard use_arena, 2 MiB chunks", "c-gpuguard-2m", {}),
               ("gpuguard use_arena, 64 MiB chunks", "c-gpuguard-64m", {})]
    rows = []
    for label, mode, env in configs:
        r = child(mode, args, env)
        rows.append([label, f"{r['peak_reserved'] / MiB:.0f}", f"{r['peak_allocated'] / MiB:.0f}",
                     f"{r['peak_reserved'] / r['peak_allocated']:.3f}", f"{r['held_after'] / MiB:.1f} ({(r['held_after'] - r['live_after']) / MiB:.1f} free)",
                     f"{r['driver_used_after'] / MiB:.0f}", f"{r['seconds']:.1f}", r["stream_waits"]])
    table(f"(c) TransformerEncoder 8 x 1024, AdamW, {r['steps']} steps, seq 64..2048, batch 4..16 (seed 0)",
          ["allocator", "peak reserved MiB", "peak allocated MiB", "ratio", "allocator holds after MiB (of it free)",
           "driver used after MiB", "train s", "arena stream waits"], rows)
    print("\n(gpuguard: reserved = the arena's peak_mapped, allocated = its peak_in_use; 'holds after' is "
          "after del + gc + dropping cuBLAS workspaces + empty_cache / gpuguard.torch.trim; 'free' is what the "
          "allocator holds beyond the tensors still alive.)")



def main() -> int:
    ap = argparse.ArgumentParser(description="gpuguard Python binding benchmarks")
    ap.add_argument("--quick", action="store_true", help="short run (fewer iterations, 20 training steps)")
    ap.add_argument("--parts", default="a,b,c,d,s", help="comma-separated subset of a,b,c,d,s,w")
    ap.add_argument("--rounds", type=int, default=3,
                    help="(b), (d), (w): runs of each allocator, alternating (default 3)")
    ap.add_argument("--workloads", default="gpt2,gptce,gptbf16,vit,resnet",
                    help="(w): comma-separated subset of gpt2,gptce,gptbf16,vit,resnet")
    ap.add_argument("--steps", type=int, default=30, help="(w): training steps a run (default 30)")
    ap.add_argument("--allocators", default="default,expandable,async,gpuguard",
                    help="(w): which allocators run, comma-separated (default: all four)")
    ap.add_argument("--trace", metavar="DIR",
                    help="(w): write each gpuguard run's allocation trace (GPUGUARD_PLUGIN_TRACE) to DIR, "
                         "with a '# step' line after each step, for bench_replay --catch-up step")
    ap.add_argument("--dry", action="store_true", help="(w): no torch, made-up results: checks the tables")
    ap.add_argument("--gpuguard", choices=("auto", "native", "arena"), default="auto",
                    help="(w): gpuguard's form: the native backend (GPUGUARD_TORCH=1), use_arena, or auto "
                         "(native when gpuguard.torch.native_available(), else use_arena)")
    ap.add_argument("--cpus", default="none",
                    help="(b), (w): CPUs every run is pinned to: none (the default), auto (the last four, where "
                         "there are 8 or more) or a comma-separated list")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cpu_list = w_cpus(args.cpus) if not args.child and {"b", "w"} & set(args.parts.split(",")) else []
    if args.child and args.child.startswith("w:"):
        print(json.dumps(child_w(args.child, args)))
        return 0
    if args.child:
        fn = {"b": child_b, "c": child_c, "d": child_d, "s": child_s}[args.child[0]]
        print(json.dumps(fn(args.child, args.quick)))
        return 0
    parts = set(args.parts.split(","))
    print(f"gpuguard bench_python: parts {','.join(sorted(parts))}{' (quick)' if args.quick else ''}")
    if "a" in parts:
        part_a(args.quick)
    if "w" in parts and args.dry:
        return part_w(args)
    if parts & {"b", "c", "d", "s", "w"}:
        why = have_cuda_torch()
        if why:
            print(f"\nskip: parts (b), (c), (d), (s) and (w) need PyTorch and a CUDA device: {why}")
            return 0 if parts <= {"a"} else 1
        if "b" in parts:
            part_b(args)
        if "c" in parts:
            part_c(args)
        if "d" in parts:
            part_d(args)
        if "s" in parts:
            part_s(args)
        if "w" in parts and part_w(args):
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
