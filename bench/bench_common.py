"""bench_common.py — what bench_python.py's parts share: the table printer, the path to the binding, the
GPT-style decoder of parts (d) and (w), and the usage error."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "bindings", "python")
SCRIPT = os.path.join(HERE, "bench_python.py")  # children of every part run this file with --child
# The binding from the source tree when GPUGUARD_LIBRARY names a built library (how the docstring says to
# run it) or no gpuguard is installed; else the installed package, as a user runs it (the source tree
# has no library of its own, so it must not shadow an installed wheel).
FROM_SOURCE = bool(os.environ.get("GPUGUARD_LIBRARY")) or importlib.util.find_spec("gpuguard") is None
if FROM_SOURCE:
    sys.path.insert(0, PKG)
MiB = 1 << 20


def table(title: str, header: list, rows: list) -> None:
    print(f"\n## {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


def _usage(msg: str) -> NoReturn:
    """A bad command line: the message on stderr, exit status 2 (as argparse's own errors)."""
    print(msg, file=sys.stderr)
    raise SystemExit(2)



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

