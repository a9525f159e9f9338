#!/usr/bin/env python3
"""Runs one prefill configuration a few times per kernel kind, for ncu (scripts/device_prefill.sh
profile): dense, the skip kernel at 0 % (lambda off), the skip kernel with the delta histogram
(statistics), the skip kernel at 0 % in max-first order, in that order, each `reps` times.
Random bf16 inputs. Usage: profile_prefill.py LIB.so L causal(0|1) d [reps]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import MAX_FIRST, Ours, gen, load_lib  # noqa: E402


def main():
    lib = load_lib(sys.argv[1])
    L, causal, d = int(sys.argv[2]), bool(int(sys.argv[3])), int(sys.argv[4])
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    q, k, v = gen("random", 1, L, 32, 32, d, 11, torch.bfloat16)
    ours = Ours(lib, q, k, v, causal)
    cnt = ours.counters(True)
    for name, fn in (("dense", lambda: ours()), ("skip0", lambda: ours(0.0, 1)),
                     ("skip0_hist", lambda: ours(0.0, 1, cnt)),
                     ("skip0_maxfirst", lambda: ours(0.0, 1, None, MAX_FIRST))):
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        print(f"{name}: {reps} launches", flush=True)


if __name__ == "__main__":
    main()
