#!/usr/bin/env python3
"""bench/holders_demo.py — "why is my GPU memory still held?" answered on a real GPU with PyTorch:
prints gpuguard's holders table for the three classic cases (a stored traceback, a returned tensor with
its autograd graph, the optimizer state of a deleted model), the rounds warning on the loss
accumulation leak (and its silence once fixed), writes the HTML memory timeline of a short training run,
and prints a notebook session driven through IPython's InteractiveShell (when IPython is installed).

    GPUGUARD_LIBRARY=build/.../libgpuguard.so python3 bench/holders_demo.py --html OUT/memory.html

Without torch or without a CUDA device it says so and exits 0. About 20 s on an H200."""
import argparse
import contextlib
import gc
import io
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--html", default="memory.html", help="where to write the timeline's HTML (default memory.html)")
ap.add_argument("--jsonl", default=None, help="the timeline's JSON lines (default: next to --html)")
args = ap.parse_args()

try:
    import torch
except ImportError:
    print("holders_demo: SKIP: PyTorch is not installed (pip install torch)")
    sys.exit(0)
if not torch.cuda.is_available():
    print("holders_demo: SKIP: no CUDA device is visible to PyTorch")
    sys.exit(0)

import gpuguard  # noqa: E402
from gpuguard.diagnostics.holding import format_bytes, holders  # noqa: E402

T0 = time.time()
DEV = "cuda"
MiB = 1 << 20
torch.manual_seed(0)


def section(title):
    print(f"\n=== {title} " + "=" * max(3, 96 - len(title)))
    print(f"(torch.cuda.memory_allocated: {format_bytes(torch.cuda.memory_allocated())})")


def clean():
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    torch.cuda.empty_cache()


print(f"holders_demo: torch {torch.__version__}, {torch.cuda.get_device_name()}, gpuguard {gpuguard.version()}")

# ---- 1. a stored traceback keeps every frame's tensors --------------------------------------------
section("1. stored traceback: the last exception keeps its frames' tensors (IPython stores it)")


def train_step(batch):
    activations = torch.empty(512 * MiB, dtype=torch.uint8, device=DEV)  # noqa: F841 (held by the frame)
    raise RuntimeError("simulated failure in train_step")


try:
    train_step(None)
except RuntimeError:
    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()  # what an interactive shell does
print(holders(top=5))
clean()
print("after `sys.last_traceback = None`:", format_bytes(torch.cuda.memory_allocated()), "in use")

# ---- 2. a returned tensor keeps its autograd graph ------------------------------------------------
section("2. returned tensor: its graph keeps the forward pass's activations")
w1 = torch.randn(4096, 4096, device=DEV, requires_grad=True)
w2 = torch.randn(4096, 1024, device=DEV, requires_grad=True)


def forward(n, w1, w2):
    x = torch.randn(n, 4096, device=DEV)
    hidden = torch.relu(x @ w1)
    return (hidden @ w2).sum()


out = forward(8192, w1, w2)
print(holders(top=6))
del out
print("after `del out`:", format_bytes(torch.cuda.memory_allocated()), "in use")
del w1, w2
clean()

# ---- 3. the optimizer of a deleted model keeps parameters, gradients and state ---------------------
section("3. optimizer state of a deleted model")
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).to(DEV)
opt = torch.optim.Adam(model.parameters())
model(torch.randn(256, 4096, device=DEV)).pow(2).mean().backward()
opt.step()
print("while the model lives:")
print(holders(top=4))
del model
print("after `del model` (the optimizer still holds everything):")
print(holders(top=8))
del opt
clean()

# ---- 4. rounds: the loss accumulation leak -------------------------------------------------------
section("4. rounds: `total_loss += loss` instead of `loss.item()`")
net = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).to(DEV)


def evaluate(keep_tensor):
    total_loss = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gpuguard.rounds(name="epoch") as r:
            for _epoch in range(6):
                for _ in range(4):
                    x = torch.randn(1024, 4096, device=DEV)
                    loss = net(x).pow(2).mean()
                    total_loss += loss if keep_tensor else loss.item()
                r.step()
    print(f"in use after each epoch: {[format_bytes(v) for v in r.history]}")
    got = [w for w in caught if issubclass(w.category, gpuguard.MemoryGrowthWarning)]
    for w in got:
        print(f"MemoryGrowthWarning ({os.path.basename(w.filename)}:{w.lineno}):\n{w.message}")
    return got


leak = evaluate(keep_tensor=True)
print(f"-> {len(leak)} warning(s) with the leak")
fixed = evaluate(keep_tensor=False)
print(f"-> {len(fixed)} warning(s) with loss.item()")
clean()

# ---- 5. a memory timeline of a short training run -------------------------------------------------
section("5. timeline of a training run (gpuguard.record + python -m gpuguard.diagnostics.plot)")
from gpuguard.diagnostics.plot import main as plot_main  # noqa: E402
from gpuguard.diagnostics.timeline import record  # noqa: E402

jsonl = args.jsonl or os.path.splitext(args.html)[0] + ".jsonl"
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 4096)).to(DEV)
opt = torch.optim.AdamW(model.parameters())
kept = []
with record(jsonl, interval=0.05, name="holders_demo: 3 epochs of training, a leaky evaluation, an OOM") as rec:
    with gpuguard.rounds(name="epoch", warn=False) as r:
        for _epoch in range(3):
            for _ in range(12):
                x = torch.randn(2048, 4096, device=DEV)
                loss = model(x).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                rec.step()
            for _ in range(6):  # evaluation without torch.no_grad(), keeping the outputs: their graphs stay
                kept.append(model(torch.randn(2048, 4096, device=DEV)))
                rec.step()
            r.step()
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device=DEV)
    except torch.cuda.OutOfMemoryError as e:
        rec.step()
        if not any(m.get("kind") == "oom" for m in rec.records if m.get("type") == "mark"):
            rec.mark("oom", str(e).splitlines()[0][:160])
print(f"samples: {sum(1 for x in rec.records if x['type'] == 'sample')}, marks: "
      f"{[m['kind'] for m in rec.records if m['type'] == 'mark']}")
plot_main([jsonl, "-o", args.html])
del kept, model, opt
clean()

# ---- 6. a notebook session -----------------------------------------------------------------------
section("6. notebook session: %load_ext gpuguard in IPython's InteractiveShell")
try:
    from IPython.core.interactiveshell import InteractiveShell
except ImportError:
    print("SKIP: IPython is not installed (pip install ipython)")
else:
    shell = InteractiveShell.instance(colors="NoColor")
    cells = [
        "%load_ext gpuguard",
        "import torch\nx = torch.empty(768 << 20, dtype=torch.uint8, device='cuda')",
        "small = torch.ones(1024, device='cuda')",
        "def step():\n    act = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n    raise ValueError('boom')\nstep()",
        "%gpuguard holders",
        "%gpuguard trim",
        "del x",
        "%gpuguard trim",
        "%gpuguard",
    ]
    for n, code in enumerate(cells, 1):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            shell.run_cell(code)
        print(f"In [{n}]: " + code.replace("\n", "\n   ...: "))
        text = buf.getvalue()
        if "Traceback" in text:  # keep the transcript short: the error's last line
            text = "\n".join(ln for ln in text.splitlines() if ln.startswith(("ValueError", "gpuguard")))
        if text.strip():
            print(text.rstrip())
        print()

print(f"holders_demo: done in {time.time() - T0:.1f} s; timeline: {args.html}")
