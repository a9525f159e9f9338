"""attn_implementation="blasst" in a small randomly initialised Llama (transformers LlamaConfig).

CPU (float32, reference engine): logits of prefill and of cached decode steps match SDPA tightly.
GPU (bf16, kernels): logits match SDPA within bf16 tolerance; a skip configuration in
config.sparse_attention_config reports per-layer sparsity and honours the ignore list.
"""
import os

import pytest

import blasst

torch = pytest.importorskip(
    "torch", reason="torch is not installed here: the transformers path runs on the GPU machine "
                    "(scripts/device_python.sh)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import blasst.transformers as bt  # noqa: E402

pytestmark = pytest.mark.transformers
REQUIRE_GPU = os.environ.get("BLASST_REQUIRE_GPU") == "1"


def tiny_llama(attn, dtype, device, sparse=None, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=64, max_position_embeddings=4096)
    if sparse is not None:
        cfg.sparse_attention_config = sparse
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    return model


def with_attn(model, attn):
    model.config._attn_implementation = attn
    for m in model.modules():
        if hasattr(m, "config") and hasattr(m.config, "_attn_implementation"):
            m.config._attn_implementation = attn
    return model


def prefill_and_decode(model, ids, steps):
    """Logits of the prompt and of `steps` greedy decode steps through the KV cache."""
    out = model(input_ids=ids, use_cache=True)
    logits = [out.logits]
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    for _ in range(steps):
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        logits.append(out.logits)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
    return logits


@pytest.fixture(scope="module", autouse=True)
def registered():
    return bt.register()


def test_register_names_the_implementation():
    from transformers import AttentionInterface
    assert AttentionInterface()["blasst"] is bt.attention_forward


def test_cpu_dense_logits_match_sdpa():
    model = tiny_llama("sdpa", torch.float32, "cpu")
    ids = torch.randint(0, 512, (2, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = prefill_and_decode(model, ids, steps=3)
        with bt.record_stats() as rec:
            got = prefill_and_decode(with_attn(model, "blasst"), ids, steps=3)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    # both phases went through blasst (not through the SDPA fallback)
    assert any(k.endswith(":prefill") for k in rec.layers)
    assert any(k.endswith(":decode") for k in rec.layers)
    assert rec.sparsity() == 0.0


def test_cpu_per_layer_settings_and_ignore_list():
    sparse = {"config_groups": {"group_0": {
        "algorithm": "skip_softmax", "threshold_scale_factor": 50.0,
        "ignore": ["model.layers.1.*"]}}}
    model = tiny_llama("blasst", torch.float32, "cpu", sparse=sparse)
    attn0 = model.model.layers[0].self_attn
    attn1 = model.model.layers[1].self_attn
    s0, s1 = bt.skip_for(attn0, "prefill"), bt.skip_for(attn1, "prefill")
    assert s0 is not None and s0.lambda_for(1000) == pytest.approx(0.05)
    assert s1 is None
    ids = torch.randint(0, 512, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), bt.record_stats() as rec:
        model(input_ids=ids)
    assert rec.layers["model.layers.1.self_attn:prefill"]["skipped"] == 0
    assert rec.layers["model.layers.0.self_attn:prefill"]["visited"] > 0


def _gpu_or_skip():
    problem = None
    if not torch.cuda.is_available():
        problem = "torch sees no CUDA device"
    elif not blasst.cuda_available():
        problem = "blasst has no usable CUDA kernels (built without CUDA or no sm_90 GPU)"
    if problem:
        if REQUIRE_GPU:
            pytest.fail(f"BLASST_REQUIRE_GPU=1 but {problem}")
        pytest.skip(f"GPU test: {problem}")


@pytest.mark.gpu
def test_gpu_dense_logits_match_sdpa_bf16():
    _gpu_or_skip()
    model = tiny_llama("sdpa", torch.bfloat16, "cuda")
    ids = torch.randint(0, 512, (2, 1000), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        want = prefill_and_decode(model, ids, steps=4)
        got = prefill_and_decode(with_attn(model, "blasst"), ids, steps=4)
    for w, g in zip(want, got):
        # bf16 activations through two layers: compare at bf16 resolution of the logit scale
        torch.testing.assert_close(g.float(), w.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_gpu_skip_mode_reports_sparsity():
    _gpu_or_skip()
    sparse = {"config_groups": {"group_0": {
        "algorithm": "skip_softmax",
        "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                                   "prefill": {"a": 20.0, "b": 4.0},
                                   "decode": {"a": 0.5, "b": 4.0}},
        "target_sparsity": {"prefill": 0.5, "decode": 0.5}}}}
    model = tiny_llama("blasst", torch.bfloat16, "cuda", sparse=sparse)
    ids = torch.randint(0, 512, (1, 2048), generator=torch.Generator().manual_seed(4)).cuda()
    with torch.no_grad(), bt.record_stats() as rec:
        prefill_and_decode(model, ids, steps=2)
    v, s = rec.totals("prefill")
    assert v > 0 and 0 <= s <= v
    print(f"tiny Llama skip mode: prefill sparsity {rec.sparsity('prefill'):.3f}, "
          f"decode sparsity {rec.sparsity('decode'):.3f} ({rec})")


def test_cpu_generate_runs_through_blasst():
    """generate() passes an all-ones attention mask; SDPA's mask function drops it, so both
    phases still run blasst (not the SDPA fallback) and the tokens equal SDPA's."""
    model = tiny_llama("sdpa", torch.float32, "cpu")
    ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False)
        with bt.record_stats() as rec:
            got = with_attn(model, "blasst").generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
    assert rec.layers["model.layers.0.self_attn:prefill"]["calls"] == 1
    assert rec.layers["model.layers.0.self_attn:decode"]["calls"] == 3
