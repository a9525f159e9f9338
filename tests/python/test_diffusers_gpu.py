"""blasst.diffusers on the GPU: a few denoise steps of a random-weight Wan-style transformer at
16,384 tokens (bf16, head dim 128, the sm_90a kernels). Skips without a usable GPU (a failure with
BLASST_REQUIRE_GPU=1). The dense reference is diffusers' native backend (torch SDPA) on the same
model and inputs.

    BLASST_REQUIRE_GPU=1 python -m pytest tests/python/test_diffusers_gpu.py -q
"""

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import blasst  # noqa: E402
import blasst.diffusers as bd  # noqa: E402
from test_diffusers_cpu import local_wan  # noqa: E402

pytestmark = pytest.mark.gpu

LATENT = (1, 4, 4, 128, 128)   # 4 x 64 x 64 = 16,384 tokens after the 1x2x2 patch
TEXT = (1, 16, 64)
UNTIL = 0.5
TIMESTEPS = (999, 800, 450, 200)   # two gated (dense) steps, then two skipping steps


def wan(device):
    """Random weights with DiT-like locality (test_diffusers_cpu.local_wan), head dim 128."""
    return local_wan(0, torch.bfloat16, 4.0, device, attention_head_dim=128, text_dim=64,
                     freq_dim=64, ffn_dim=512, rope_max_seq_len=1024)


def latents(device):
    g = torch.Generator().manual_seed(7)
    low = torch.randn(LATENT[0], LATENT[1], 2, 8, 8, generator=g)
    x = torch.nn.functional.interpolate(low, size=LATENT[2:], mode="trilinear", align_corners=True)
    x = x + 0.1 * torch.randn(*LATENT, generator=g)
    return x.to(device, torch.bfloat16), torch.randn(*TEXT, generator=g).to(device, torch.bfloat16)


def test_gpu_wan_denoise_steps_gate_then_skip(cuda):
    model = wan(cuda)
    x, enc = latents(cuda)

    def step(t):
        with torch.no_grad():
            return model(x, torch.tensor([t], device=cuda), enc, return_dict=False)[0].float()

    dense = {t: step(t) for t in TIMESTEPS}        # diffusers' native backend
    cfg = {"sparse_attention_config": {"config_groups": {"g": {
        "algorithm": "skip_softmax", "threshold_scale_factor": 0.05 * 16384,
        "disabled_until_timestep": UNTIL, "ignore": ["*attn2*"]}}}}
    h = bd.enable(model, config=cfg)
    try:
        with bd.record_stats() as rec:
            outs = {t: step(t) for t in TIMESTEPS}
    finally:
        bd.disable(model)
    assert [s["t"] for s in rec.steps] == [t / 1000 for t in TIMESTEPS]
    assert [s["blasst"] for s in rec.steps] == [2] * 4 and h.fallbacks == {"ignored": 8}
    gated = [t / 1000 > UNTIL for t in TIMESTEPS]
    for s, g in zip(rec.steps, gated):
        assert (s["gated"] == 2) == g
        assert (s["skipped"] == 0) == g, s           # dense steps, then sparse ones
    print("per-step:", rec.steps, "sparsity:", rec.sparsity())
    for t, g in zip(TIMESTEPS, gated):
        ref, out = dense[t], outs[t]
        rel = ((out - ref).norm() / ref.norm()).item()
        assert torch.isfinite(out).all()
        assert rel < (2e-2 if g else 6e-2), (t, rel)  # bf16 kernels vs SDPA; skips add a little


def test_gpu_wan_training_step_through_blasst(cuda):
    """One training step of the bf16 model with its self-attention through blasst (the sm_90a
    forward and backward kernels): every parameter's gradient against the same step on diffusers'
    native backend (torch SDPA), dense; then with skipping, the step runs, skips tiles (statistics
    of a no-grad call at the same setting) and its gradients stay finite and near the dense ones."""
    model = wan(cuda)
    x, enc = latents(cuda)
    t = torch.tensor([500], device=cuda)

    def step():
        model.zero_grad()
        out = model(x, t, enc, return_dict=False)[0].float()
        (out * torch.linspace(-1, 1, out.numel(), device=cuda).view(out.shape)).sum().backward()
        return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])

    native = step()
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    try:
        dense = step()
        assert h.blasst_calls["transformer"] == 2 and set(h.fallbacks) == {"ignored"}, h
    finally:
        bd.disable(model)
    rel = ((dense - native).norm() / native.norm()).item()
    assert torch.isfinite(dense).all() and rel < 2e-2, rel  # bf16 kernels vs SDPA, both ways
    skip = blasst.SkipSoftmax(threshold=0.05, order="max_first")
    h = bd.enable(model, skip=skip)
    try:
        with torch.no_grad(), bd.record_stats() as rec:
            model(x, t, enc, return_dict=False)
        sparse = step()
    finally:
        bd.disable(model)
    rel_skip = ((sparse - native).norm() / native.norm()).item()
    print(f"training step: dense grads vs SDPA {rel:.2e}; skip at sparsity {rec.sparsity():.3f}: "
          f"{rel_skip:.2e}")
    assert rec.sparsity() > 0 and torch.isfinite(sparse).all() and rel_skip < 0.2, rel_skip
