#!/usr/bin/env python3
"""torch_train.py — a small real PyTorch training loop whose per-step memory comes from a gpuguard arena,
with DataLoader workers that die with the trainer.

  GPUGUARD_LIBRARY=build/libgpuguard.so PYTHONPATH=bindings/python python3 examples/torch_train.py [--steps N]

What it shows:
- A scope per step: each step runs inside ``gpuguard.torch.mem_pool(arena)``, on gpuguard's PyTorch
  backend (installed before the first CUDA call). Inside the step tensors come from a MemPool that draws
  from the arena; as they die their blocks go back to the arena ("in use" drops to 0 at the step's end).
  The arena keeps that memory mapped (no driver calls from step 2 on) until ``trim`` gives it back to the
  driver at the end. The model, its optimizer state and cuBLAS's workspace are made before the loop in the
  backend's own arena, so they never pin a step's memory.
- Workers: two DataLoader workers are adopted into the guard (teardown on every exit path: exception,
  Ctrl-C, SIGTERM), armed to die with the trainer even on SIGKILL (``arm_child`` in worker_init_fn), and
  drop their inherited /dev/nvidia* descriptors (which would otherwise keep the trainer's device memory
  alive after it dies).
- Without a GPU it runs on the CPU and the host backend (first line says so); without torch it says so
  and exits 0."""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

try:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
except ImportError:
    print("gpuguard torch_train: skipped: PyTorch is not installed (pip install torch)")
    sys.exit(0)

import gpuguard  # noqa: E402

MiB = 1 << 20


class Synthetic(Dataset):
    """y = sin(x @ w) with a fixed w: deterministic per index, nothing downloaded."""

    def __init__(self, n: int, dim: int) -> None:
        self.n, self.dim = n, dim
        self.w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.randn(self.dim, generator=torch.Generator().manual_seed(i))
        return x, torch.sin(x @ self.w)


def worker_init(_: int) -> None:
    gpuguard.arm_child()          # SIGKILL when the trainer dies, however it dies
    gpuguard.close_device_fds()   # a CPU-only worker must not keep the trainer's device memory alive


def mb(n: int) -> str:
    return f"{n / MiB:8.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dim", type=int, default=1024)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        import gpuguard.torch as ggt
        ggt.use_native()  # gpuguard's PyTorch backend, before the first CUDA call: mem_pool draws through it
        dev = torch.device("cuda", 0)
        print(f"gpuguard torch_train: CUDA device 0 ({torch.cuda.get_device_name(0)}), per-step MemPool "
              "from a gpuguard arena")
    else:
        dev = torch.device("cpu")
        os.environ.setdefault("GPUGUARD_BACKEND", "host")
        print("gpuguard torch_train: no CUDA device: running on the CPU; the arena is on the host backend "
              "(a simulated device) and backs a staging buffer per step, not PyTorch's CPU tensors")

    torch.manual_seed(0)
    with gpuguard.Guard(name="torch_train", child_grace_ms=1000) as guard:
        arena = gpuguard.Arena(device=0, capacity=(8 << 30) if cuda else (256 * MiB), name="steps")
        model = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim),
                              nn.GELU(), nn.Linear(args.dim, 1)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = DataLoader(Synthetic(args.steps * args.batch, args.dim), batch_size=args.batch,
                            num_workers=2, persistent_workers=True, worker_init_fn=worker_init)

        def step(x, y) -> float:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)  # grads die inside the step: nothing pins its segments
            return loss.item()

        it = iter(loader)
        x, y = next(it)
        # Warm-up outside any pool: optimizer state and cuBLAS's workspace live as long as the model.
        step(x.to(dev), y.to(dev))
        workers = multiprocessing.active_children()
        for w in workers:
            gpuguard.adopt(w.pid, guard=guard)
        print(f"adopted {len(workers)} DataLoader workers: {[w.pid for w in workers]}")
        if cuda:
            base = torch.cuda.memory_allocated()
            print(f"model + optimizer state (PyTorch's allocator): {mb(base)}")

        if cuda:
            import gpuguard.torch as ggt
            region = lambda: ggt.mem_pool(arena)  # noqa: E731
        else:
            region = arena.scope
        t0 = time.perf_counter()
        for i, (x, y) in enumerate(it, start=1):
            with region():
                if not cuda:
                    arena.alloc(x.numel() * 4, tag="staging")  # released by the scope's end
                loss = step(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
                during = arena.stats()
            after = arena.stats()
            print(f"step {i:3d} loss {loss:.4f} | arena in use during {mb(during['bytes_in_use'])}, after "
                  f"{mb(after['bytes_in_use'])}, mapped {mb(after['bytes_mapped'])}")
        dt = time.perf_counter() - t0
        s = arena.stats()
        print(f"{args.steps - 1} steps in {dt:.2f} s; arena peak in use {mb(s['peak_in_use'])}, peak mapped "
              f"{mb(s['peak_mapped'])}, allocations {s['n_allocs']}, frees {s['n_frees']}")
        if cuda:
            import gpuguard.torch as ggt
            free0 = torch.cuda.mem_get_info()[0]
            returned = ggt.trim(arena)
            free1 = torch.cuda.mem_get_info()[0]
            print(f"trim gave {mb(returned)} back; the driver's free memory rose by {mb(free1 - free0)}")
            for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_ooms"):
                print(f"  {k} = {ggt.memory_stats(arena)[k]}")
        else:
            arena.trim()
            print(f"trim: mapped now {mb(arena.stats()['bytes_mapped'])}")
        del it, loader  # workers shut down by the DataLoader; the guard's teardown ends any left
        arena.close()
    print("final: guard torn down; no worker left:", not multiprocessing.active_children())
    return 0


if __name__ == "__main__":
    sys.exit(main())
