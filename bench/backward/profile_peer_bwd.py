#!/usr/bin/env python3
"""torch SDPA backward (cuDNN backend) on one configuration, for ncu beside our backward kernel
(scripts/device_call_ncu.sh bwdfull): q, k, v [B, H, L, d] bf16 (views of [B, L, H, d], as
bench_backward_peers.py feeds them), forward then backward, reps times.
Usage: profile_peer_bwd.py B H L d causal(0|1) [reps]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    B, H, L, d, causal = (int(x) for x in sys.argv[1:6])
    reps = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=torch.bfloat16, generator=g)
               .transpose(1, 2).requires_grad_(True) for _ in range(3))
    do = torch.randn(B, H, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(reps):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            out.backward(do)
    torch.cuda.synchronize()
    print(f"cudnn fwd+bwd B={B} H={H} L={L} d={d} causal={causal}: {reps} calls", flush=True)


if __name__ == "__main__":
    main()
