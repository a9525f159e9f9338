import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
for (H, Hk, L, d) in [(32, 8, 8192, 128), (32, 8, 16384, 128), (32, 32, 8192, 128), (32, 32, 16384, 128), (32, 32, 8192, 64), (32, 32, 16384, 64)]:
    q = torch.randn(1, H, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, Hk, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, Hk, L, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(1, H, L, d, device="cuda", dtype=torch.bfloat16)
    res = []
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != Hk)
            for _ in range(3): torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize(); ts = []
            for _ in range(10):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); torch.autograd.grad(o, (q, k, v), do, retain_graph=True); b.record(); b.synchronize()
                ts.append(a.elapsed_time(b))
            ms = sorted(ts)[5]
            res.append(f"{name} {ms:.3f} ms {2.5 * 4 * H * L * L * d * 0.5 / ms / 1e9:.1f} TFLOP/s")
        except Exception as e:
            res.append(f"{name} error {str(e).splitlines()[0][:60]}")
    print(f"H {H}/{Hk} L {L} d {d} causal: " + "; ".join(res), flush=True)
