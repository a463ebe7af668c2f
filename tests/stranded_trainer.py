"""stranded_trainer.py KIDS [N] — a stand-in trainer for the shell tests: starts N (default 3)
multiprocessing spawn children that sleep 60 s, writes their pids to KIDS, and sleeps too. SIGKILLed
in a session of its own, it leaves its children stranded, as a crashed training job does."""
import multiprocessing as mp
import sys
import time

if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ps = [mp.get_context("spawn").Process(target=time.sleep, args=(60,)) for _ in range(n)]
    for p in ps:
        p.start()
    with open(sys.argv[1], "w") as f:
        f.write(" ".join(str(p.pid) for p in ps))
    time.sleep(60)
