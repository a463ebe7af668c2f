#!/usr/bin/env python3
"""gen_trace.py — writes a synthetic allocation trace of a GPT-like training loop for bench_replay, with
a `# step` line after every step: steps whose sequence length varies at a constant token count, so that
some steps outgrow the memory layout of the ones before (what the recorded traces did not show).

  python3 bench/gen_trace.py OUT.trace[.gz] [--steps 40] [--layers 12] [--d 1024] [--vocab 32768]
                             [--tokens 8192] [--seq 128..2048] [--eager] [--batch LO..HI] [--jitter 4]
                             [--seed 0]

The blocks are what bf16 autocast training of such a model keeps and frees, in order, as PyTorch would
ask a pluggable allocator for them (sizes rounded to 512 bytes): fp32 parameters, gradients made by
backward and freed by zero_grad(set_to_none=True), AdamW's states, per layer the bf16 weight casts and
the activations saved for backward, fp32 logits into cross-entropy, and the optimizer's temporaries.
--eager adds the attention scores and probabilities of an attention without a fused kernel (the
Hugging Face GPT-2's eager path), whose size grows with the sequence length; --jitter K blocks of 1..64
MiB made at random points of each forward pass live for 1..3 steps (workspaces, caches), so that a
step's free memory is not where the next one needs it. Needs only Python."""
from __future__ import annotations

import argparse
import gzip
import random


class Trace:
    def __init__(self, f):
        self.f, self.next = f, 1

    def alloc(self, n: int) -> int:
        n = max(512, (n + 511) // 512 * 512)
        a, self.next = self.next, self.next + 1
        self.f.write(f"a {a:#x} {n} 0\n")
        return a

    def free(self, *ids: int) -> None:
        for a in ids:
            self.f.write(f"f {a:#x} 0\n")


def step(t: Trace, a: argparse.Namespace, rng: random.Random, params: list, grads: list, adam: list,
         kept: list) -> None:
    lo, hi = (int(x) for x in a.seq.split(".."))
    if a.batch:  # a batch drawn per step at a fixed sequence length (a ViT: 197 tokens an image)
        blo, bhi = (int(x) for x in a.batch.split(".."))
        seq = lo
        T = seq * 32 * rng.randint(max(1, blo // 32), bhi // 32)
    else:
        seq = 128 * rng.randint(max(1, lo // 128), hi // 128)
        T = a.tokens // seq * seq
    d, V, H = a.d, a.vocab, a.d // 64
    idx = t.alloc((T // seq) * (seq + 1) * 8)
    x = t.alloc(T * d * 4)  # the embedding's output (fp32 residual stream)
    saved = []
    for _ in range(a.layers):
        s = {"w": t.alloc(12 * d * d * 2)}  # autocast's bf16 copies of the layer's weights
        s["ln1"], s["qkv"] = t.alloc(T * d * 2), t.alloc(T * 3 * d * 2)
        s["att"] = ([t.alloc(T * H * seq * 2), t.alloc(T * H * seq * 2)] if a.eager
                    else [t.alloc(T // seq * H * seq * 4)])  # scores and probabilities, or the logsumexp
        s["o"], s["proj"] = t.alloc(T * d * 2), t.alloc(T * d * 2)
        s["x2"] = t.alloc(T * d * 4)
        s["ln2"], s["fc"], s["gelu"] = t.alloc(T * d * 2), t.alloc(T * 4 * d * 2), t.alloc(T * 4 * d * 2)
        s["out"] = t.alloc(T * d * 2)
        s["x"], x = x, t.alloc(T * d * 4)
        t.free(t.alloc(T * d * 4))  # a temporary of the residual add
        saved.append(s)
        # Blocks that outlive the step (workspaces, caches, metrics), made at random points: they leave
        # the next step's layout holes in other places than this one's.
        for _ in range(a.jitter):
            if rng.random() < 1 / a.layers:
                kept.append((rng.randint(1, 3), t.alloc(rng.randint(1, 64) << 20)))
    ln = t.alloc(T * d * 2)
    logits = t.alloc(T * V * 2)
    logits32 = t.alloc(T * V * 4)
    logp = t.alloc(T * V * 4)
    loss = t.alloc(4)
    # backward
    glogp = t.alloc(T * V * 4)
    t.free(logp)
    glog = t.alloc(T * V * 2)
    t.free(glogp, logits32, logits)
    if not grads:
        grads.extend(t.alloc(n) for n in params)
    gx = t.alloc(T * d * 4)
    t.free(glog, ln, x)
    for s in reversed(saved):
        g1, g2 = t.alloc(T * 4 * d * 2), t.alloc(T * 4 * d * 2)
        t.free(s["fc"], s["gelu"], s["out"])
        gq = t.alloc(T * 3 * d * 2)
        t.free(g1, g2)
        gatt = t.alloc(T * d * 2)
        t.free(s["qkv"], *s["att"], s["o"], s["proj"])
        t.free(gatt, gq)
        ngx = t.alloc(T * d * 4)
        t.free(gx, s["w"], s["ln1"], s["x2"], s["ln2"], s["x"])
        gx = ngx
    t.free(gx, idx, loss)
    # AdamW (foreach): states at the first step, a temporary per parameter
    if not adam:
        adam.extend(t.alloc(n) for n in params for _ in range(2))
    for n in params:
        t.free(t.alloc(n))
    t.free(*grads)  # zero_grad(set_to_none=True)
    grads.clear()
    for i, (left, blk) in enumerate(kept):
        kept[i] = (left - 1, blk)
    t.free(*(blk for left, blk in kept if left <= 0))
    kept[:] = [(left, blk) for left, blk in kept if left > 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq", default="128..2048")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--batch", help="LO..HI: a batch (a multiple of 32) drawn per step, the sequence fixed "
                                    "at --seq's lower bound (a ViT: --seq 197..197 --vocab 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jitter", type=int, default=4, help="blocks a step keeps for 1..3 steps (1..64 MiB)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    opener = gzip.open if a.out.endswith(".gz") else open
    with opener(a.out, "wt") as f:
        f.write(f"# gen_trace: GPT-like {a.layers} x {a.d}, vocabulary {a.vocab}, {a.tokens} tokens a step, "
                f"sequence {a.seq}{', eager attention' if a.eager else ''}, {a.steps} steps, seed {a.seed}\n")
        t = Trace(f)
        params = [12 * a.d * a.d * 4 // 6] * (6 * a.layers) + [a.vocab * a.d * 4, 2 * a.d * 4]
        weights = [t.alloc(n) for n in params]
        grads: list = []
        adam: list = []
        kept: list = []
        for k in range(a.steps):
            step(t, a, rng, params, grads, adam, kept)
            f.write(f"# step {k + 1}\n")
        t.free(*adam, *weights, *(blk for _, blk in kept))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
