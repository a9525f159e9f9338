#!/usr/bin/env python3
"""Runs the FP8 screen's comparison kernels once each at the DiT shape for ncu (issue 19): our
dense kernel, the skip kernel and the screen (strict) at 70 % sparsity in max-first order, lambda
from the max-first one-pass curve exactly as bench_prefill.py --screen takes it. Launch order per
rep: dense, skip, screen (its quantisation pre-kernel, then the screen kernel).
Usage: profile_screen.py LIB.so [L] [reps] [margin] [target]
margin: bench_prefill.py's code (1 strict, 2 tight z = 6, + 4 ahead: its screen-ahead kernel before
the pass); target: the sparsity (default 0.7)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import HIST_SLOTS, MAX_FIRST, Ours, gen, lambda_for, load_lib  # noqa: E402


def main():
    lib = load_lib(sys.argv[1])
    L = int(sys.argv[2]) if len(sys.argv) > 2 else 32760
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    margin = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    target = float(sys.argv[5]) if len(sys.argv) > 5 else 0.7
    H, d = 40, 128
    q, k, v = gen("dit", 1, L, H, H, d, 4321, torch.bfloat16)
    ours = Ours(lib, q, k, v, False)
    cnt = ours.counters(True)
    ours(0.0, 1, cnt, MAX_FIRST)
    torch.cuda.synchronize()
    lam, _ = lambda_for(cnt[2].view(H, HIST_SLOTS).sum(0).double(), target)
    print(f"lambda at {target:.0%}: {lam}", flush=True)
    for _ in range(reps):
        ours()
        ours(lam, 0, None, MAX_FIRST)
        ours.screen(lam, margin, 6.0)
    torch.cuda.synchronize()
    print(f"dense, skip, screen: {reps} launches each", flush=True)


if __name__ == "__main__":
    main()
