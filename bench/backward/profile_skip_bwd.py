#!/usr/bin/env python3
"""Our skip backward on a workload's recorded skip set, for ncu (the llm rows of
bench_backward_peers.py without the timing loop): the workload (bench_prefill.gen, the peers' seed), lambda
from the forward's one-pass curve at the target (bench_backward_peers.lambda_for, max-first), one
forward recording its skip set, then `reps` backward calls through torch.autograd.grad. Prints the
achieved sparsity. For ncu, skip the first backward call's kernels (the warm-up), e.g.
  ncu --kernel-name regex:backward_wgmma --launch-skip 1 --launch-count 1 --set full \\
      python3 bench/backward/profile_skip_bwd.py llm 8192 128 0.7
Usage: profile_skip_bwd.py KIND(llm|dit|random) L d target [reps]   (B 1, H 32; llm: Hk 8, causal)"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_backward_peers as peers  # noqa: E402  (inputs, lambda_for, achieved)

import blasst  # noqa: E402


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    kind, L, d, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    if kind not in ("llm", "dit", "random") or not 0.0 < target < 1.0:
        sys.exit(__doc__)
    Hk, causal = (8, True) if kind == "llm" else (32, False)
    (q, k, v), do = peers.inputs(kind, 1, L, 32, Hk, d, 1234 + L, torch.bfloat16, "cuda")  # the peers rows' seed
    lam = peers.lambda_for(q, k, v, causal, target, "max_first")
    if lam is None:
        sys.exit(f"{kind} L {L}: target {target} unreachable at lambda < 1")
    skip = blasst.SkipSoftmax(threshold=lam, order="max_first")
    ach = peers.achieved(q, k, v, causal, skip)
    out = blasst.attention(q, k, v, causal=causal, skip=skip)
    for _ in range(reps):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    print(f"{kind} L {L} d {d}: lambda {lam:.3e}, achieved sparsity {ach:.3f}, {reps} backward calls", flush=True)


if __name__ == "__main__":
    main()
