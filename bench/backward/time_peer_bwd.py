#!/usr/bin/env python3
"""torch SDPA backward alone (cuDNN and flash backends), timed on the shapes bench_backward takes,
so that a device call that A/Bs our kernel trees (scripts/device_call_bwd_ab.sh, PEER=1) puts the
peers' figures beside them on the same GPU in the same call without building the Python package.
bench_backward_peers.py remains the same-process, same-tensors comparison.

q, k, v: [B, L, H, d] bf16 normal(0, 1) as transposed views (as bench_backward_peers.py feeds
SDPA), dO normal; the forward runs once, then torch.autograd.grad with the graph kept is timed
with CUDA events after warm-up; median of --iters. FLOPs = 2.5 x 4 B H L^2 d (x 0.5 causal).

  time_peer_bwd.py --shapes "8192 128 0" "16384 64 1" [--b 1] [--h 32] [--iters 20]
Prints one line per (shape, backend): backend L d mask ms TFLOP/s.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", required=True, help='"L d causal(0|1)" each')
    ap.add_argument("--b", type=int, default=1)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for shape in args.shapes:
        L, d, causal = (int(x) for x in shape.split())
        g = torch.Generator(device="cuda").manual_seed(L + d + causal)
        q, k, v = (torch.randn(args.b, L, args.h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   .transpose(1, 2).requires_grad_(True) for _ in range(3))
        do = torch.randn(args.b, args.h, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
        flops = 2.5 * 4 * args.b * args.h * L * L * d * (0.5 if causal else 1.0)
        for name, backend in backends.items():
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            times = []
            for it in range(args.warmup + args.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                end.record()
                end.synchronize()
                if it >= args.warmup:
                    times.append(start.elapsed_time(end))
            ms = statistics.median(times)
            mask = "causal" if causal else "full"
            print(f"{name} {L} {d} {mask} {ms:.3f} {flops / ms / 1e9:.1f}", flush=True)
            del out


if __name__ == "__main__":
    main()
