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
(b), (c), (d) and (s) need torch and a CUDA device; without them they print a skip line and the run fails (exit 1)
unless only (a) was asked for."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

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
    env = dict(os.environ, GPUGUARD_BACKEND="cuda", **env_extra)
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
    return out


def child_b(mode: str, quick: bool) -> dict:
    import torch
    import gpuguard
    import gpuguard.torch as ggt
    n = 2000 if quick else 20000
    if mode == "b-global":
        arena = gpuguard.Arena(capacity=32 << 30, name="bench-global")
        ggt.use_arena(arena)
        return {"gpuguard global": _empty_loop(torch, SIZES, n)}
    torch.zeros(1, device="cuda")
    res = {"pytorch caching": _empty_loop(torch, SIZES, n)}
    arena = gpuguard.Arena(capacity=32 << 30, name="bench-pool")
    with ggt.mem_pool(arena):
        res["gpuguard MemPool"] = _empty_loop(torch, SIZES, n)
    return res


def part_b(args: argparse.Namespace) -> None:
    res = child("b-pool", args, {})
    res.update(child("b-global", args, {}))
    base = res["pytorch caching"]
    rows = []
    for size in SIZES:
        s = str(size)
        rows.append([_fmt_size(size), f"{base[s]:.2f}"] + [
            f"{res[k][s]:.2f} ({res[k][s] / base[s]:.2f}x)" for k in ("gpuguard MemPool", "gpuguard global")])
    table("(b) torch.empty + del, us per pair (ratio to PyTorch's caching allocator)",
          ["size", "PyTorch caching", "gpuguard MemPool", "gpuguard global use_arena"], rows)


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


def main() -> int:
    ap = argparse.ArgumentParser(description="gpuguard Python binding benchmarks")
    ap.add_argument("--quick", action="store_true", help="short run (fewer iterations, 20 training steps)")
    ap.add_argument("--parts", default="a,b,c,d,s", help="comma-separated subset of a,b,c,d,s")
    ap.add_argument("--rounds", type=int, default=3, help="(d): runs of each allocator, alternating (default 3)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = {"b": child_b, "c": child_c, "d": child_d, "s": child_s}[args.child[0]]
        print(json.dumps(fn(args.child, args.quick)))
        return 0
    parts = set(args.parts.split(","))
    print(f"gpuguard bench_python: parts {','.join(sorted(parts))}{' (quick)' if args.quick else ''}")
    if "a" in parts:
        part_a(args.quick)
    if parts & {"b", "c", "d", "s"}:
        why = have_cuda_torch()
        if why:
            print(f"\nskip: parts (b), (c), (d) and (s) need PyTorch and a CUDA device: {why}")
            return 0 if parts <= {"a"} else 1
        if "b" in parts:
            part_b(args)
        if "c" in parts:
            part_c(args)
        if "d" in parts:
            part_d(args)
        if "s" in parts:
            part_s(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
