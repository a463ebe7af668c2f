#!/usr/bin/env python3
"""bench_python.py — the Python binding's costs and PyTorch through a gpuguard arena, as tables.

  GPUGUARD_LIBRARY=build/libgpuguard.so python3 bench/bench_python.py [--quick] [--parts a,b,c]

(a) Python overhead per call: scope enter+exit and alloc+free through the binding (goal <= 2 us each);
    runs on any backend (the host backend without a GPU).
(b) torch.empty + del through the gpuguard allocator (MemPool form; and the global use_arena form, in its
    own process) against PyTorch's caching allocator in the same run, 256 B .. 64 MiB.
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
    logits into a 32k-vocabulary cross-entropy, a timm ViT-B/16, a torchvision ResNet-50 with
    cudnn.benchmark), each varying its shapes from step to step, bf16 autocast, seed 0; one process per
    run, allocators alternating (PyTorch default, expandable_segments, cudaMallocAsync, gpuguard) for
    --rounds rounds: every run printed, then per workload the median of runs: step time and its ratio to
    the default, peak reserved / peak allocated, gpuguard's host waits a step after warm-up, bytes held
    after empty_cache, final losses. --workloads, --steps, --trace DIR (gpuguard runs' allocation traces
    for bench_replay), --gpuguard auto|native|arena (auto: the native backend, GPUGUARD_TORCH=1, where
    gpuguard.torch.native_available() says so, else use_arena); a workload whose package is missing is
    skipped, saying so. --dry checks the tables without torch. A default run (4 x 4 x 3) takes ~5-7
    minutes on an H200.
(b), (c), (d), (s) and (w) need torch and a CUDA device; without them they print a skip line and the run fails
(exit 1) unless only (a) was asked for."""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "bindings", "python")
sys.path.insert(0, PKG)
MiB = 1 << 20


def table(title: str, header: list, rows: list) -> None:
    print(f"\n## {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


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
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode] + (["--quick"] if args.quick else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"bench child {mode} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")
    return json.loads(lines[-1])


SIZES = [256, 4096, 65536, MiB, 16 * MiB, 64 * MiB]


def _empty_loop(torch, sizes, n: int) -> dict:
    out = {}
    for size in sizes:
        k = max(50, n // (1 + size // MiB))
        for _ in range(50):
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(k):
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
                del t
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / k)
        out[str(size)] = best * 1e6
    out["mix"] = _mix_loop(torch, n)
    return out


def _mix_loop(torch, n: int) -> float:
    """us per allocation and free with 256 tensors live, a random one replaced each time by one of a
    log-uniform size, 512 B..32 MiB (the same sizes in every process): where a training step's host time
    goes, unlike a pair that reuses one block."""
    import random
    rng = random.Random(0)
    k = max(1000, n * 2)
    sizes = [int(512 * 2 ** (rng.random() * 16)) for _ in range(k)]
    slots = [rng.randrange(256) for _ in range(k)]
    live = [torch.empty(512, dtype=torch.uint8, device="cuda") for _ in range(256)]
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for size, j in zip(sizes, slots):
            live[j] = torch.empty(size, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / k)
    del live
    return best * 1e6


def child_b(mode: str, quick: bool) -> dict:
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
    res = child("b-pool", args, {})
    res.update(child("b-expandable", args, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    if w_gpuguard_native():
        res.update(child("b-native", args, {"GPUGUARD_TORCH": "1"}))
        res.update(child("b-mempool", args, {}))
        res.update(child("b-global", args, {}))
    base = res["pytorch caching"]
    cols = [(k, label) for k, label in (("expandable_segments", "expandable_segments"),
                                        ("gpuguard native", "gpuguard native (GPUGUARD_TORCH=1)"),
                                        ("gpuguard MemPool", "gpuguard MemPool"),
                                        ("gpuguard global", "gpuguard global use_arena")) if k in res]
    rows = []
    for size in SIZES + ["mix"]:
        s = str(size)
        rows.append([_fmt_size(size) if size != "mix" else "mix: 256 live, 512 B..32 MiB",
                     f"{base[s]:.2f}"] + [f"{res[k][s]:.2f} ({res[k][s] / base[s]:.2f}x)" for k, _ in cols])
    table("(b) torch.empty + del, us per pair (ratio to PyTorch's caching allocator)",
          ["size", "PyTorch caching"] + [label for _, label in cols], rows)


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


def decoder_model(torch, nn, layers: int = 12, d: int = 1024, heads: int = 16, vocab: int = 32768):
    """A GPT-style decoder (pre-norm blocks, causal scaled-dot-product attention, GELU MLP)."""
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).transpose(1, 3).unbind(2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return Decoder()


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


# ---- (w) ------------------------------------------------------------------------------------------

# Third-party model code, each with the shapes it varies over: a step draws one per step (the same
# sequence in every process), after a first pass over all of them that warms the kernels up.
W_WORKLOADS = {
    "gpt2": ("transformers", "Hugging Face GPT-2 124M from GPT2Config, AdamW, seq 128..1024 at 8k tokens",
             [128, 256, 512, 1024]),
    "gptce": ("torch", "GPT-like 12 x 1024, 32k vocabulary, fp32 logits into cross-entropy, fused AdamW, "
              "seq 128..2048 at 8k tokens", [128, 256, 512, 1024, 2048]),
    "vit": ("timm", "timm vit_base_patch16_224, AdamW, batch 32..128", [32, 64, 96, 128]),
    "resnet": ("torchvision", "torchvision resnet50, channels_last, cudnn.benchmark, SGD, batch 64, "
               "160..256 px", [160, 192, 224, 256]),
}
W_ALLOCATORS = [("PyTorch default", "default", {}),
                ("expandable_segments", "expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
                ("cudaMallocAsync", "async", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
                ("gpuguard", "gpuguard", {})]
W_TOKENS = 8192


def w_gpuguard_native() -> bool:
    """Whether the installed gpuguard.torch offers its native PyTorch backend (GPUGUARD_TORCH=1): its
    ``native_available()`` says so. Asked in a child process, so this one never imports torch."""
    code = ("import gpuguard.torch as g, sys; f = getattr(g, 'native_available', None); "
            "sys.stdout.write('1' if f is not None and f() else '0')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, os.environ.get("PYTHONPATH", "")]))
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
    elif workload == "gptce":
        from torch import nn as tnn
        vocab = 32768
        model = decoder_model(torch, tnn, vocab=vocab).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def batch(seq, g):
            idx = torch.randint(0, vocab, (W_TOKENS // seq, seq + 1), device="cuda", generator=g)
            return idx[:, :-1], idx[:, 1:]

        def loss(m, x, y):
            logits = m(x)
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


def _usage(msg: str) -> NoReturn:
    """A bad command line: the message on stderr, exit status 2 (as argparse's own errors)."""
    print(msg, file=sys.stderr)
    raise SystemExit(2)


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
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"w:{workload}:{alloc}", "--steps",
           str(args.steps)]
    if args.dry:
        return w_dry_result(workload, alloc, args, trace)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"  run failed: {workload} / {alloc}: still running after 600 s", flush=True)
        return {}
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
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


def main() -> int:
    ap = argparse.ArgumentParser(description="gpuguard Python binding benchmarks")
    ap.add_argument("--quick", action="store_true", help="short run (fewer iterations, 20 training steps)")
    ap.add_argument("--parts", default="a,b,c,d,s", help="comma-separated subset of a,b,c,d,s,w")
    ap.add_argument("--rounds", type=int, default=3,
                    help="(d), (w): runs of each allocator, alternating (default 3)")
    ap.add_argument("--workloads", default="gpt2,gptce,vit,resnet",
                    help="(w): comma-separated subset of gpt2,gptce,vit,resnet")
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
                    help="(w): CPUs every run is pinned to: none (the default), auto (the last four, where "
                         "there are 8 or more) or a comma-separated list")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cpu_list = w_cpus(args.cpus) if not args.child and "w" in args.parts.split(",") else []
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
