import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
for B in (8, 64, 1):
    L, H, Hk, d = 32768, 32, 8, 128
    q = torch.randn(B, 1, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(B, L, Hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(B, L, Hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(3): F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(40): F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        b.record(); b.synchronize()
    us = a.elapsed_time(b) * 1e3 / 40
    print(f"cuDNN B={B} L={L}: {us:.1f} us per call (eager), {B * L * Hk * d * 4 / us / 1e6:.2f} TB/s", flush=True)
    del q, k, v
