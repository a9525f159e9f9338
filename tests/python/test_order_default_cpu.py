"""SPEC §2a default (revised) through the Python API: threshold= / factor= visit max-first unless
order= says otherwise; a defaulted max-first falls back to natural where the CUDA prefill kernel
cannot run it (full mask, Lq != Lk), on the reference too; calibration=(a, b) and configs that
name no order are natural; a config's own order is kept; the stats report the order used."""
import json
import math
import pickle

import numpy as np
import pytest

import blasst

H, D = 2, 32


def towering_key(Lq, Lk, key=None, seed=0, d=D):
    """Every query leans along e0 and one key (default: the last) towers there, so the two orders
    skip different tiles (max-first reaches a group's own tile early, natural the last tile last)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, Lq, H, d)).astype(np.float32)
    k = rng.standard_normal((1, Lk, H, d)).astype(np.float32)
    v = rng.standard_normal((1, Lk, H, d)).astype(np.float32)
    q[..., 0] += 6.0
    k[0, Lk - 1 if key is None else key, :, 0] = 16.0 * math.sqrt(d / D)  # logit ~ 17 at any d
    return q, k, v


def run(q, k, v, skip, causal=False):
    stats = blasst.SkipStats()
    out = blasst.attention(q, k, v, causal=causal, skip=skip, stats=stats)
    return out, stats


def test_defaults_per_source():
    for s in (blasst.SkipSoftmax(threshold=0.05), blasst.SkipSoftmax(factor=20.0)):
        assert s.order == "max_first" and not s.order_explicit
    c = blasst.SkipSoftmax(calibration=(2.0, 3.0), target_sparsity=0.5)
    assert c.order == "natural"
    for s in (blasst.SkipSoftmax(threshold=0.05, order="natural"),
              blasst.SkipSoftmax(threshold=0.05, order="max_first"),
              blasst.SkipSoftmax(calibration=(2.0, 3.0), target_sparsity=0.5, order="max_first")):
        assert s.order_explicit
    # Explicitness is part of the settings: kept through fields() (the torch ops), pickling, eq.
    d = blasst.SkipSoftmax(threshold=0.05)
    e = blasst.SkipSoftmax(threshold=0.05, order="max_first")
    assert d != e
    for s in (d, e):
        assert blasst.SkipSoftmax.from_fields(s.fields()) == s
        t = pickle.loads(pickle.dumps(s))
        assert t == s and t.order_explicit == s.order_explicit
    assert "order=None" in repr(d) and "order='max_first'" in repr(e)


@pytest.mark.parametrize("Lq,Lk,causal", [(500, 500, False), (300, 700, True)])
def test_threshold_default_runs_max_first(Lq, Lk, causal):
    q, k, v = towering_key(Lq, Lk, key=Lk - Lq if causal else None, seed=11)
    out, st = run(q, k, v, blasst.SkipSoftmax(threshold=0.05), causal)
    assert st.granularity["order"] == "max_first"
    out_mf, st_mf = run(q, k, v, blasst.SkipSoftmax(threshold=0.05, order="max_first"), causal)
    out_nat, st_nat = run(q, k, v, blasst.SkipSoftmax(threshold=0.05, order="natural"), causal)
    assert np.array_equal(out, out_mf) and st.skipped == st_mf.skipped
    assert st_mf.total_skipped > 0
    assert not np.array_equal(out_mf, out_nat)  # the order matters on this data


@pytest.mark.parametrize("Lq,Lk", [(200, 700), (700, 300)])
def test_cross_attention_default_falls_back_to_natural(Lq, Lk):
    q, k, v = towering_key(Lq, Lk, seed=12)
    out, st = run(q, k, v, blasst.SkipSoftmax(threshold=0.05))
    assert st.granularity["order"] == "natural"
    assert "natural" in st.counted_at
    out_nat, st_nat = run(q, k, v, blasst.SkipSoftmax(threshold=0.05, order="natural"))
    assert np.array_equal(out, out_nat) and st.skipped == st_nat.skipped
    # Explicit max-first is kept (the reference runs it; the CUDA kernel refuses it).
    out_mf, st_mf = run(q, k, v, blasst.SkipSoftmax(threshold=0.05, order="max_first"))
    assert st_mf.granularity["order"] == "max_first"
    assert st_mf.total_skipped > 0 and not np.array_equal(out_mf, out_nat)
    # factor= the same.
    _, st_f = run(q, k, v, blasst.SkipSoftmax(factor=0.05 * Lk))
    assert st_f.granularity["order"] == "natural"


def test_calibration_without_order_is_natural():
    q, k, v = towering_key(500, 500, seed=13)
    _, st = run(q, k, v, blasst.SkipSoftmax(calibration=(0.05 * 500 / math.exp(1.5), 3.0),
                                            target_sparsity=0.5))
    assert st.granularity["order"] == "natural"


BLOCK = {
    "config_groups": {
        "group_0": {
            "threshold_scale_factor": {"formula": "a * exp(b * target_sparsity)",
                                       "prefill": {"a": 2.0, "b": 3.0}},
            "target_sparsity": 0.5,
        }
    }
}


@pytest.mark.parametrize("ext,want", [(None, "natural"), ({"visit_order": "max_first"}, "max_first"),
                                      ({"visit_order": "natural"}, "natural")])
def test_configs_keep_their_order(ext, want):
    block = json.loads(json.dumps(BLOCK))
    if ext is not None:
        block["config_groups"]["group_0"]["blasst"] = ext
    s = blasst.SkipSoftmax.from_config(block, layer="blocks.0.attn1")
    assert s.order == want and s.order_explicit
    for Lq, Lk in ((500, 500), (200, 700)):  # no fallback for a config's own order
        q, k, v = towering_key(Lq, Lk, seed=14)
        _, st = run(q, k, v, s)
        assert st.granularity["order"] == want, (Lq, Lk)


def test_torch_op_keeps_the_default_and_its_fallback():
    torch = pytest.importorskip("torch")
    q, k, v = towering_key(200, 700, seed=15)
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    stats = blasst.SkipStats()
    out = blasst.attention(qt, kt, vt, skip=blasst.SkipSoftmax(threshold=0.05), stats=stats)
    assert stats.granularity["order"] == "natural"
    want, _ = run(q, k, v, blasst.SkipSoftmax(threshold=0.05, order="natural"))
    assert np.array_equal(out.numpy(), want)
    q, k, v = towering_key(500, 500, seed=16)
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    stats = blasst.SkipStats()
    blasst.attention(qt, kt, vt, skip=blasst.SkipSoftmax(threshold=0.05), stats=stats)
    assert stats.granularity["order"] == "max_first"


@pytest.mark.gpu
def test_gpu_cross_attention_default_runs_and_explicit_max_first_is_refused(cuda):
    import torch
    q, k, v = towering_key(200, 700, seed=17, d=128)
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16).cuda() for x in (q, k, v))
    st = blasst.SkipStats()
    blasst.attention(q, k, v, skip=blasst.SkipSoftmax(threshold=0.05), stats=st)
    assert st.granularity["order"] == "natural"
    with pytest.raises(Exception, match=r"Lq == Lk"):
        blasst.attention(q, k, v, skip=blasst.SkipSoftmax(threshold=0.05, order="max_first"))
    sq = torch.randn(1, 512, H, 128, dtype=torch.bfloat16, device="cuda")
    st = blasst.SkipStats()
    blasst.attention(sq, sq, sq, skip=blasst.SkipSoftmax(threshold=0.05), stats=st)
    assert st.granularity["order"] == "max_first"
