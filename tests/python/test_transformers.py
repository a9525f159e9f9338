"""attn_implementation="blasst" in a small randomly initialised Llama (transformers LlamaConfig).

CPU (float32, reference engine): logits of prefill and of cached decode steps match SDPA tightly.
GPU (bf16, kernels): logits match SDPA within bf16 tolerance; a skip configuration in
config.sparse_attention_config reports per-layer sparsity and honours the ignore list.
"""
import math

import pytest


torch = pytest.importorskip(
    "torch", reason="torch is not installed here: the transformers path runs on the GPU machine "
                    "(scripts/device_python.sh)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import blasst.transformers as bt  # noqa: E402

pytestmark = pytest.mark.transformers


def tiny_llama(attn, dtype, device, sparse=None, layers=2, sink=False, sink_strength=3.0):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=64, max_position_embeddings=4096, attention_bias=sink)
    if sparse is not None:
        cfg.sparse_attention_config = sparse
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    if sink:
        add_attention_sink(model, sink_strength)
    return model.to(device=device, dtype=dtype).eval()


SINK_TOKEN = 0


def add_attention_sink(model, strength=3.0):
    """Make token SINK_TOKEN an attention sink in every layer (a random-init model has nearly
    uniform attention: a 64-row vote never skips it). Its embedding is one direction u with a
    large norm (so it stays dominant in layer 1's input); every query gets a bias `strength` on
    the lowest-frequency RoPE channel of its head (dim 31: it turns by < 0.3 rad over 2048
    positions) and every key reads `strength` * u into that channel. The sink key at position 0
    then scores ~2 * strength**2 = 18 for every query and the other keys far less (layer 0 at
    2048 tokens: sink >= 12.0, others <= 5.2, the smallest gap over all rows 9.4), so every
    tile after tile 0 has delta < -9 (skipped at lambda = 0.05, ln = -3, with a wide margin)."""
    cfg = model.config
    hd, dim = cfg.head_dim, cfg.head_dim // 2 - 1
    with torch.no_grad():
        u = torch.randn(cfg.hidden_size, generator=torch.Generator().manual_seed(123))
        u /= u.norm()
        model.model.embed_tokens.weight[SINK_TOKEN] = 16.0 * u
        for layer in model.model.layers:
            attn = layer.self_attn
            for h in range(cfg.num_attention_heads):
                attn.q_proj.bias[h * hd + dim] = strength
            for h in range(cfg.num_key_value_heads):
                attn.k_proj.weight[h * hd + dim] = strength * u


def sink_prompt(length, seed):
    """Token ids with the sink first and nowhere else."""
    ids = torch.randint(1, 512, (1, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = SINK_TOKEN
    return ids


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


@pytest.mark.parametrize("length", [40, 6])
def test_cpu_training_step_matches_sdpa(length):
    """A training step (loss.backward()) through attn_implementation="blasst": every parameter's
    gradient equals SDPA's (float32, reference engine). At 6 tokens a no-grad call would be a
    decode step (q_len <= 8, blasst.decode, which has no gradient): under autograd it runs the
    differentiable blasst.attention, so the attention weights get their gradients too."""
    ids = torch.randint(0, 512, (2, length), generator=torch.Generator().manual_seed(3))

    def grads(model):
        model.train()
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = grads(tiny_llama("sdpa", torch.float32, "cpu"))
    with bt.record_stats() as rec:
        got = grads(tiny_llama("blasst", torch.float32, "cpu"))
    assert got.keys() == want.keys() and any("q_proj" in n for n in got)
    for n in want:
        torch.testing.assert_close(got[n], want[n], atol=1e-5, rtol=1e-4, msg=n)
    # the calls went through blasst (prefill phase, no statistics under autograd)
    assert set(rec.layers) == {f"model.layers.{i}.self_attn:prefill" for i in range(2)}
    assert all(e["calls"] == 1 and e["visited"] == 0 for e in rec.layers.values()), rec.layers


LAYER = "model.layers.{}.self_attn:prefill"


@pytest.mark.parametrize("ignore", [[], ["model.layers.1.*"], ["*cross_attn*", "model.layers.0.*"]])
def test_cpu_per_layer_settings_and_ignore_list(ignore):
    """A raw factor of 15 (lambda = 15 / 300 = 0.05) on a model with an attention sink: a
    configured layer skips every tile after tile 0 of each vote group, a layer named by an ignore
    pattern skips nothing (and the run without ignore patterns shows it would have)."""
    sparse = {"config_groups": {"group_0": {
        "algorithm": "skip_softmax", "threshold_scale_factor": 15.0, "ignore": ignore}}}
    model = tiny_llama("blasst", torch.float32, "cpu", sparse=sparse, sink=True)
    ignored = {i for i in range(2) if f"model.layers.{i}.*" in ignore}
    for i in range(2):
        s = bt.skip_for(model.model.layers[i].self_attn, "prefill")
        if i in ignored:
            assert s is None, i
        else:
            assert s is not None and s.lambda_for(300) == pytest.approx(0.05), i
    with torch.no_grad(), bt.record_stats() as rec:
        model(input_ids=sink_prompt(300, seed=2))
    # causal, 300 rows: 64-row vote groups see 1, 1, 2, 2, 3 key tiles; 4 query heads
    visited, first_tiles = 4 * (1 + 1 + 2 + 2 + 3), 4 * 5
    for i in range(2):
        e = rec.layers[LAYER.format(i)]
        assert e["calls"] == 1 and e["visited"] == visited, (i, e)
        assert e["skipped"] == (0 if i in ignored else visited - first_tiles), (i, e)


@pytest.mark.gpu
def test_gpu_dense_logits_match_sdpa_bf16(cuda):
    model = tiny_llama("sdpa", torch.bfloat16, "cuda")
    ids = torch.randint(0, 512, (2, 1000), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        want = prefill_and_decode(model, ids, steps=4)
        got = prefill_and_decode(with_attn(model, "blasst"), ids, steps=4)
    for w, g in zip(want, got):
        # bf16 activations through two layers: compare at bf16 resolution of the logit scale
        torch.testing.assert_close(g.float(), w.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_gpu_skip_mode_reports_sparsity(cuda):
    """bf16 kernels on a model with an attention sink: lambda = 13.86 * exp(4 * 0.5) / 2048 = 0.05
    in prefill; layer 0 skips every tile after tile 0 of each 64-row vote group (SPEC §2: every
    later tile's delta is < -9 < ln(0.05) = -3, see add_attention_sink), layer 1 is ignored and
    skips nothing. The CPU reference gives the same counts on this model in bf16 and float32."""
    a = 0.05 * 2048 / math.exp(2.0)
    sparse = {"config_groups": {"group_0": {
        "algorithm": "skip_softmax",
        "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                                   "prefill": {"a": a, "b": 4.0},
                                   "decode": {"a": a, "b": 4.0}},
        "target_sparsity": {"prefill": 0.5, "decode": 0.5},
        "ignore": ["model.layers.1.*"]}}}
    model = tiny_llama("blasst", torch.bfloat16, "cuda", sparse=sparse, sink=True)
    with torch.no_grad(), bt.record_stats() as rec:
        prefill_and_decode(model, sink_prompt(2048, seed=4).cuda(), steps=2)
    # 32 vote groups of 64 rows per head; group g sees key tiles 0 .. g // 2
    visited = 4 * sum(g // 2 + 1 for g in range(32))
    l0, l1 = rec.layers[LAYER.format(0)], rec.layers[LAYER.format(1)]
    assert l0["visited"] == visited and l1["visited"] == visited, rec.layers
    assert l0["skipped"] == visited - 4 * 32, rec.layers
    assert l1["skipped"] == 0 and rec.layers["model.layers.1.self_attn:decode"]["skipped"] == 0
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
