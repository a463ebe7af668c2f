#!/usr/bin/env python3
"""torch_trace.py — records the allocation trace of bench_python.py's training loop (part c) for
bench_replay, which plays it through a gpuguard arena on any backend (the host one needs no GPU).

  python3 bench/torch_trace.py OUT.trace [--steps 120]

Runs under PyTorch's caching allocator with its memory history on, and writes one line per event, in
order: `a ADDR SIZE` when a tensor's block is allocated, `f ADDR` when the tensor dies (the moment
PyTorch would call a pluggable allocator's free). SIZE is the block size PyTorch's caching allocator
gave (requests rounded to 512 bytes). The same format as the library's own GPUGUARD_PLUGIN_TRACE, which
records what PyTorch really asks a gpuguard arena for. Needs torch and a CUDA device."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    import torch
    from torch import nn
    from bench_python import train_transformer
    if not torch.cuda.is_available():
        print("torch_trace: needs a CUDA device", file=sys.stderr)
        return 1
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=10_000_000)
    model, opt, layer, seconds = train_transformer(torch, nn, args.steps)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live: set = set()
    n_alloc = n_free = 0
    with open(args.out, "w") as f:
        f.write(f"# torch_trace: TransformerEncoder 8 x 1024, AdamW, {args.steps} steps, seq 64..2048, "
                f"batch 4..16 (seed 0), torch {torch.__version__}\n")
        for ev in snap["device_traces"][torch.cuda.current_device()]:
            act, addr = ev["action"], ev["addr"]
            if act == "alloc":
                live.add(addr)
                f.write(f"a {addr:#x} {ev['size']}\n")
                n_alloc += 1
            elif act == "free_requested" and addr in live:
                live.discard(addr)
                f.write(f"f {addr:#x}\n")
                n_free += 1
    print(f"torch_trace: {n_alloc} allocations, {n_free} frees, {len(live)} live at the end; "
          f"peak allocated {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB, "
          f"peak reserved {torch.cuda.max_memory_reserved() / 2**20:.0f} MiB; {seconds:.1f} s")
    del model, opt, layer
    return 0


if __name__ == "__main__":
    sys.exit(main())
