"""blasst.diffusers on CPU tensors (reference engine): a tiny randomly initialised
WanTransformer3DModel (2 layers, 2 heads of 16, 512 tokens) and a two-expert WanPipeline around
two of them (Wan 2.2 layout: transformer for t >= boundary, transformer_2 below).

Expected values come from diffusers' own native backend (torch SDPA) on the same model, in float64,
and from a float64 softmax written here for the LSE. Every test also asserts that the case it is
about happened (calls routed to blasst, steps gated, tiles skipped, fallbacks counted).
"""
import math

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import blasst  # noqa: E402
import blasst.diffusers as bd  # noqa: E402
from blasst import _diffusers_registry as registry  # noqa: E402
from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel  # noqa: E402
from diffusers.models import attention_dispatch as ad  # noqa: E402

LATENT = (1, 4, 2, 32, 32)   # [B, C, F, H, W] -> 2 x 16 x 16 = 512 tokens after the 1x2x2 patch
TEXT = (1, 8, 32)
# The reference engine accumulates in float32 (also for float64 inputs): a dense blasst call
# matches float64 SDPA to ~1e-6 (test_attention_cpu.py: test_f64_inputs); through two blocks
# the model output stays within this bound. Skipping moves it by orders of magnitude more.
DENSE_ATOL = 5e-6
SHARPEN = 4.0                # scales q and k (RMSNorm weights): peaked attention, as trained DiTs


def local_wan(seed=0, dtype=torch.float64, sharpen=SHARPEN, device="cpu", **dims):
    """A random-weight Wan transformer whose self-attention has the locality of trained DiTs:
    keys share the queries' projection (q_i . k_i large) and q, k are scaled up (sharpen), so
    smooth latents give attention that falls off with distance and whole key tiles can be
    skipped. dims: WanTransformer3DModel arguments over this tiny default (2 heads x 16, 2
    layers), e.g. the GPU tests' head_dim 128."""
    torch.manual_seed(seed)
    args = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                num_layers=2, rope_max_seq_len=64)
    args.update(dims)
    m = WanTransformer3DModel(**args).eval()
    with torch.no_grad():
        for blk in m.blocks:
            a = blk.attn1
            a.to_k.weight.copy_(a.to_q.weight)
            a.to_k.bias.copy_(a.to_q.bias)
            a.norm_q.weight.mul_(sharpen)
            a.norm_k.weight.copy_(a.norm_q.weight)
    return m.to(device=device, dtype=dtype)


def tiny_wan(seed, dtype=torch.float64, sharpen=SHARPEN):
    return local_wan(seed, dtype, sharpen)


def smooth_latents(dtype=torch.float64, seed=7, shape=LATENT):
    """Latents that vary smoothly over the frame grid (upsampled from 2 x 4 x 4) plus noise."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(shape[0], shape[1], 2, 4, 4, generator=g, dtype=torch.float64)
    x = torch.nn.functional.interpolate(low, size=shape[2:], mode="trilinear", align_corners=True)
    return (x + 0.1 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def inputs(dtype=torch.float64, seed=7):
    g = torch.Generator().manual_seed(seed + 1)
    return smooth_latents(dtype, seed), torch.randn(*TEXT, generator=g).to(dtype)


def run(model, t, x, enc):
    with torch.no_grad():
        return model(x, torch.tensor([t]), enc, return_dict=False)[0]


def config(factor=None, until=None, ignore=("*attn2*",), target=None):
    group = {"algorithm": "skip_softmax"}
    if factor is not None:
        group["threshold_scale_factor"] = factor
    else:  # calibrated: factor = a * exp(b * s)
        group["threshold_scale_factor"] = {"formula": "a * exp(b * target_sparsity)",
                                           "prefill": {"a": 5.0, "b": 4.0}}
        group["target_sparsity"] = {"prefill": target}
    if until is not None:
        group["disabled_until_timestep"] = until
    if ignore is not None:
        group["ignore"] = list(ignore)
    return {"sparse_attention_config": {"config_groups": {"group_0": group}}}


@pytest.fixture
def model():
    m = tiny_wan(0)
    yield m
    bd.disable(m)


def test_dense_matches_native_backend(model):
    x, enc = inputs()
    ref = run(model, 500, x, enc)                      # diffusers' native backend (SDPA)
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    out = run(model, 500, x, enc)
    assert h.blasst_calls["transformer"] == 2          # attn1 of both blocks went to blasst
    assert h.fallbacks == {"ignored": 2}               # attn2 (cross-attention) stayed native
    assert torch.allclose(out, ref, rtol=0, atol=DENSE_ATOL), (out - ref).abs().max()
    bd.disable(model)
    assert torch.equal(run(model, 500, x, enc), ref)   # processors got their backend back
    for _, m in bd._attention_modules(model):
        assert not registry.is_ours(getattr(m.processor, "_attention_backend", None))
    assert h.blasst_calls["transformer"] == 2          # nothing routed after disable


def test_skip_changes_little_and_counts(model):
    x, enc = inputs()
    ref = run(model, 500, x, enc)
    h = bd.enable(model, config=config(factor=150.0))
    with bd.record_stats() as rec:
        out = run(model, 500, x, enc)
    sa = [rec.layers[f"transformer/blocks.{i}.attn1"] for i in range(2)]
    assert all(e["blasst"] == 1 and e["gated"] == 0 for e in sa)
    skipped, visited = sum(e["skipped"] for e in sa), sum(e["visited"] for e in sa)
    assert 0 < skipped < visited
    err = (out - ref).abs().max().item()
    assert 0 < err < 0.05 * ref.abs().max().item(), err
    assert h.blasst_calls["transformer"] == 2


def test_return_lse_matches_float64_softmax(model):
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    backend = ad.AttentionBackendName(h.layers["transformer/blocks.0.attn1"]["backend"])
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 300, 4, 32, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = ad.dispatch_attention_fn(q, k, v, scale=0.3, backend=backend,
                                        attention_kwargs={"return_lse": True})
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
    ref_lse = torch.logsumexp(s, dim=-1)                               # [B, H, S]
    ref_out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    assert lse.shape == (2, 4, 300)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5)           # lse is float32
    assert torch.allclose(out, ref_out, rtol=0, atol=DENSE_ATOL)
    assert h.blasst_calls["transformer"] == 1


def test_gating_switches_at_the_published_timestep(model):
    x, enc = inputs()
    refs = {t: run(model, t, x, enc) for t in (999, 501)}
    bd.enable(model, config=config(factor=150.0, until=0.5))
    outs = {}
    with bd.record_stats() as rec:
        for t in (999, 750, 501, 500, 250, 0):         # t / 1000 <= 0.5 from 500 on
            outs[t] = run(model, t, x, enc)
    assert [s["t"] for s in rec.steps] == [0.999, 0.75, 0.501, 0.5, 0.25, 0.0]
    assert [s["blasst"] for s in rec.steps] == [2] * 6
    assert [s["gated"] for s in rec.steps] == [2, 2, 2, 0, 0, 0]
    assert all(s["skipped"] == 0 for s in rec.steps[:3])
    assert all(s["skipped"] > 0 for s in rec.steps[3:])
    for t in (999, 501):                               # gated steps are the dense function
        assert torch.allclose(outs[t], refs[t], rtol=0, atol=DENSE_ATOL)


def test_gated_without_timestep_runs_dense_and_warns(model):
    # An attention module called on its own: no component forward, so no timestep published.
    bd.enable(model, config=config(factor=150.0, until=0.5))
    attn = dict(bd._attention_modules(model))["blocks.0.attn1"]
    hidden = torch.randn(1, 300, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with bd.record_stats() as rec, pytest.warns(RuntimeWarning, match="no denoise step"):
        with torch.no_grad():
            attn(hidden)
    entry = rec.layers["transformer/blocks.0.attn1"]
    assert entry["blasst"] == 1 and entry["gated"] == 1 and entry["skipped"] == 0
    assert blasst.diffusion.current() is None


def test_calibrated_target_sparsity_override(model):
    x, enc = inputs()
    sparsity = {}
    for target in (0.2, 0.8):
        bd.enable(model, config=config(target=0.5), target_sparsity=target)
        assert bd.enabled(model).skip_for("transformer", "blocks.0.attn1").target_sparsity == target
        with bd.record_stats() as rec:
            run(model, 500, x, enc)
        sparsity[target] = rec.sparsity()
    assert sparsity[0.8] > sparsity[0.2]   # a higher target gives a larger factor, more skips


def pipeline(with_second=True):
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=3.0)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=sched,
                       transformer=tiny_wan(0, torch.float32),
                       transformer_2=tiny_wan(1, torch.float32) if with_second else None,
                       boundary_ratio=0.5 if with_second else None)


def denoise(pipe, steps=6):
    g = torch.Generator().manual_seed(1)
    pe, ne = torch.randn(*TEXT, generator=g), torch.randn(*TEXT, generator=g)
    with torch.no_grad():
        return pipe(prompt_embeds=pe, negative_prompt_embeds=ne, height=256, width=256,
                    num_frames=5, num_inference_steps=steps, output_type="latent",
                    latents=smooth_latents(torch.float32, seed=2)).frames


def test_pipeline_per_component_configs():
    pipe = pipeline()
    ref = denoise(pipe)
    # transformer: skipping, gated until t <= 0.8; transformer_2: no block, stays dense.
    h = bd.enable(pipe, config={"transformer": config(factor=150.0, until=0.8)})
    assert h.components == {"transformer": "routed (timestep-gated)",
                            "transformer_2": "dense (no sparse_attention_config)"}
    assert h.num_train_timesteps == 1000.0
    with bd.record_stats() as rec:
        out = denoise(pipe)
    comps = [s["component"] for s in rec.steps]
    assert comps == ["transformer"] * 10             # 5 steps x (cond, uncond) at t >= 500
    assert [s["gated"] > 0 for s in rec.steps] == [True] * 6 + [False] * 4
    assert all(s["skipped"] > 0 for s in rec.steps[6:])
    assert not any(k.startswith("transformer_2/") for k in rec.layers)   # left alone
    assert torch.isfinite(out).all() and not torch.equal(out, ref)
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()
    bd.disable(pipe)
    assert torch.equal(denoise(pipe), ref)


def test_pipeline_two_configs_and_model_folder(tmp_path):
    import json
    pipe = pipeline()
    for name, factor in (("transformer", 150.0), ("transformer_2", 30.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config(factor=factor)))
    h = bd.enable(pipe, config=str(tmp_path))
    assert h.skip_for("transformer", "blocks.1.attn1").factor == 150.0
    assert h.skip_for("transformer_2", "blocks.1.attn1").factor == 30.0
    assert h.skip_for("transformer_2", "blocks.1.attn2") is None           # ignored
    with bd.record_stats() as rec:
        denoise(pipe)
    assert {s["component"] for s in rec.steps} == {"transformer", "transformer_2"}
    assert rec.layers["transformer_2/blocks.0.attn1"]["blasst"] == 2
    assert rec.layers["transformer_2/blocks.0.attn2"]["fallback"] == 2
    assert rec.fallbacks == {"ignored": 24}                # 12 forwards x 2 cross-attentions
    bd.disable(pipe)


def test_ignore_patterns_honoured(model):
    x, enc = inputs()
    ref = run(model, 500, x, enc)
    h = bd.enable(model, config=config(factor=150.0, ignore=("blocks.1.*", "*attn2*")))
    with bd.record_stats() as rec:
        out = run(model, 500, x, enc)
    assert rec.layers["transformer/blocks.0.attn1"]["blasst"] == 1
    assert rec.layers["transformer/blocks.1.attn1"] == {"calls": 1, "blasst": 0, "gated": 0,
                                                       "fallback": 1, "visited": 0, "skipped": 0}
    assert h.fallbacks == {"ignored": 3}
    assert not torch.equal(out, ref)
    # skip= with its own patterns: nothing ignored routes cross-attention to blasst too.
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense(), ignore=())
    run(model, 500, x, enc)
    assert h.blasst_calls["transformer"] == 4 and not h.fallbacks


@pytest.mark.parametrize("case", ["mask", "dtype", "heads"])
def test_unsupported_calls_fall_back_to_native(model, case):
    h = bd.enable(model, skip=blasst.SkipSoftmax(threshold=0.5, order="natural"))
    backend = ad.AttentionBackendName(h.layers["transformer/blocks.0.attn1"]["backend"])
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 70, 2, 16, generator=g) for _ in range(3))
    kw = {}
    if case == "mask":
        kw["attn_mask"] = torch.rand(1, 70, generator=g) > 0.3
    elif case == "dtype":  # mixed dtypes: the native backend refuses them itself
        k, v = k.double(), v.double()
    elif case == "heads":  # one KV head without enable_gqa: SDPA broadcasts it, blasst declines
        k, v = k[:, :, :1], v[:, :, :1]
    kw_native = dict(kw)
    if case == "dtype":
        with pytest.raises(RuntimeError):
            ad.dispatch_attention_fn(q, k, v, backend=backend, **kw)
        assert h.fallbacks == {"dtype": 1} and not h.blasst_calls
        return
    out = ad.dispatch_attention_fn(q, k, v, backend=backend, **kw)
    ref = ad.dispatch_attention_fn(q, k, v, backend=ad.AttentionBackendName.NATIVE, **kw_native)
    assert torch.equal(out, ref)
    assert h.fallbacks == {{"mask": "attn_mask"}.get(case, case): 1} and not h.blasst_calls


def _backend_of(h):
    return ad.AttentionBackendName(h.layers["transformer/blocks.0.attn1"]["backend"])


def test_training_runs_through_blasst(model):
    """Inputs that need gradients run blasst's differentiable op (SPEC §9). Expected values: dense,
    torch SDPA's gradient on the same float64 values (diffusers' native backend); with skipping,
    the gradient of blasst.attention called directly with the same setting (its own gradient is
    checked against a float64 masked softmax in test_backward_cpu.py), on inputs where tiles are
    skipped; a whole training step of the model, dense, against the native backend's."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 300, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    do = torch.randn(1, 300, 2, 16, generator=g, dtype=torch.float64)

    def grads(fn):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        fn(*leaves).backward(do)
        return [x.grad for x in leaves]

    native = ad.AttentionBackendName.NATIVE
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    got = grads(lambda *t: ad.dispatch_attention_fn(*t, backend=_backend_of(h)))
    want = grads(lambda *t: ad.dispatch_attention_fn(*t, backend=native))
    assert h.blasst_calls["transformer"] == 1 and not h.fallbacks
    assert all(float((a - b).abs().max()) <= 1e-10 * float(b.abs().max()) for a, b in zip(got, want))
    bd.disable(model)
    q[..., 0], k[:, 0, :, 0] = 3.0, 40.0  # a sink: the far tiles fall below it (skipped)
    skip = blasst.SkipSoftmax(threshold=1e-3, tile_keys=128, vote_rows=64, order="natural")
    st = {}
    blasst.attention(q, k, v, skip=skip, stats=st)
    assert st["skipped"] > 0, st
    h = bd.enable(model, skip=skip)
    with bd.record_stats() as rec:  # under autograd: counted as a blasst call, no statistics
        got = grads(lambda *t: ad.dispatch_attention_fn(*t, backend=_backend_of(h)))
    want = grads(lambda *t: blasst.attention(*t, skip=skip))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    (layer,) = rec.layers.values()  # (a direct call: outside the model's layers)
    assert layer["blasst"] == 1 and layer["visited"] == 0 and not rec.fallbacks, layer
    # inside blasst.calibration.record() the probe needs statistics: the native backend runs
    with blasst.calibration.record():
        grads(lambda *t: ad.dispatch_attention_fn(*t, backend=_backend_of(h)))
    assert h.fallbacks == {"autograd": 1}, h.fallbacks
    bd.disable(model)
    # one training step of the model: dense blasst against the native backend
    x, enc = inputs()

    def step():
        model.zero_grad()
        out = model(x, torch.tensor([500]), enc, return_dict=False)[0]
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = step()
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    got = step()
    assert h.blasst_calls["transformer"] == 2 and set(h.fallbacks) == {"ignored"}, h
    assert got.keys() == want.keys() and len(got) > 10
    for n in want:
        scale = max(float(want[n].abs().max()), 1e-30)
        assert float((got[n] - want[n]).abs().max()) <= 1e-8 * scale, n


def test_fallback_runs_the_processors_own_backend(model):
    # A processor set to another backend (here _native_math) keeps it for the calls blasst skips.
    for _, m in bd._attention_modules(model):
        m.processor._attention_backend = ad.AttentionBackendName._NATIVE_MATH
    h = bd.enable(model, skip=blasst.SkipSoftmax.dense())
    x, enc = inputs()
    run(model, 500, x, enc)
    assert h.fallbacks == {"ignored": 2}
    bd.disable(model)
    for _, m in bd._attention_modules(model):
        assert m.processor._attention_backend is ad.AttentionBackendName._NATIVE_MATH


def test_clear_errors():
    m = tiny_wan(0)
    with pytest.raises(TypeError, match="expected a diffusers pipeline or model"):
        bd.enable(object(), skip=blasst.SkipSoftmax.dense())
    with pytest.raises(ValueError, match="no sparse_attention_config found"):
        bd.enable(m)
    with pytest.raises(ValueError, match="threshold_scale_factor|formula|unknown"):
        bd.enable(m, config={"sparse_attention_config": {"config_groups": {"g": {
            "algorithm": "skip_softmax", "threshold_scale_factor": {"formula": "a * b",
                                                                    "prefill": {"a": 1, "b": 2}}}}}})
    with pytest.raises(ValueError, match="no component named"):
        bd.enable(pipeline(), config={"transformer_3": config(factor=150.0)})
    with pytest.raises(TypeError, match="skip"):
        bd.enable(m, skip=0.5)
    with pytest.raises(ValueError, match="has no attention module"):
        bd.enable(torch.nn.Linear(2, 2), skip=blasst.SkipSoftmax.dense())
    assert bd.enabled(m) is None   # a failed enable leaves the model alone


def test_registry_refuses_a_different_dispatcher():
    import types
    fake = types.SimpleNamespace(AttentionBackendName=ad.AttentionBackendName,
                                 _AttentionBackendRegistry=type("R", (), {"_backends": {}}),
                                 dispatch_attention_fn=lambda query, key, value: None)
    with pytest.raises(RuntimeError, match=r"missing: _AttentionBackendRegistry._constraints.*"
                                           r"dispatch_attention_fn\(attn_mask=\)"):
        registry.check(fake)
    assert registry.check() is ad


def test_registry_members_are_dispatcher_values():
    m = registry.member(12345)
    assert ad.AttentionBackendName("blasst_12345") is m and m.value == "blasst_12345"
    assert isinstance(m, ad.AttentionBackendName) and registry.is_ours(m)
    assert "BLASST_12345" not in ad.AttentionBackendName.__members__   # not offered by name
    assert not registry.is_ours(ad.AttentionBackendName.NATIVE)
    assert registry.native_backend(m) is ad.AttentionBackendName.NATIVE
    assert registry.native_backend(None) is ad._AttentionBackendRegistry.get_active_backend()[0]
    with pytest.raises(ValueError, match="not a blasst backend"):
        registry.register(ad.AttentionBackendName.NATIVE, lambda query: None)


def test_under_torch_compile_the_gate_is_read_at_run_time(model):
    # backend="eager" (no C++ compiler needed): the traced graph calls the blasst op, which reads
    # the published t when it runs; the component hook publishes t outside the graph.
    x, enc = inputs(torch.float32)
    model = model.float()
    h = bd.enable(model, config=config(factor=150.0, until=0.5))
    ref_dense = run(model, 999, x, enc)
    ref_skip = run(model, 250, x, enc)
    assert not torch.equal(ref_dense, ref_skip)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    for t, ref in ((999, ref_dense), (250, ref_skip), (999, ref_dense)):
        with torch.no_grad():
            out = compiled(x, torch.tensor([t]), enc, return_dict=False)[0]
        assert torch.allclose(out, ref, rtol=0, atol=1e-6), (t, (out - ref).abs().max())
    assert math.isclose(blasst.diffusion.current(), 0.999)
    del h
    torch._dynamo.reset()
