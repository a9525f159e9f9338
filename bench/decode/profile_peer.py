#!/usr/bin/env python3
"""torch SDPA decode (cuDNN backend) on one configuration, for ncu beside our kernel
(scripts/device_decode.sh profile): q [B, Hq, 1, d], K/V [B, Hk, L, d] views of [B, L, Hk, d]
bf16 caches, as bench_decode.py feeds it. Usage: profile_peer.py B L Hq Hk [reps]"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    B, L, hq, hk = (int(x) for x in sys.argv[1:5])
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    d = 128
    q = torch.randn(B, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(reps):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    torch.cuda.synchronize()
    print(f"cudnn decode B={B} L={L} {hq}/{hk}: {reps} calls", flush=True)


if __name__ == "__main__":
    main()
