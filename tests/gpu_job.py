"""A trainer-like job for the GPU tests: holds 1 GiB on the GPU and starts three multiprocessing workers
(spawn start method, as DataLoader workers with CUDA must use) that each hold 1 GiB too, then waits.
Writes READY to the file named in argv[1] once every worker holds its memory."""
import multiprocessing as mp
import os
import sys
import time


def worker(q):
    import torch
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(7)
    torch.cuda.synchronize()
    q.put(os.getpid())
    time.sleep(600)


def main():
    import torch
    ready = sys.argv[1]
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(q,)) for _ in range(3)]
    for p in procs:
        p.start()
    pids = [q.get(timeout=120) for _ in procs]
    with open(ready + ".tmp", "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + pids))
    os.rename(ready + ".tmp", ready)
    time.sleep(600)


if __name__ == "__main__":
    main()
