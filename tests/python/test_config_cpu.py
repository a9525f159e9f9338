"""SkipSoftmax.from_config / blasst.load_config on SPEC §7 files (parsed by the C++ config module)."""
import json
import math

import pytest

import blasst

SPEC_BLOCK = {
    "config_groups": {
        "group_0": {
            "algorithm": "skip_softmax",
            "threshold_scale_factor": {
                "formula": "a * exp(b * target_sparsity)",
                "prefill": {"a": 1443.49, "b": 4.3037},
                "decode": {"a": 0.119, "b": 9.86},
            },
            "target_sparsity": {"prefill": 0.5, "decode": 0.5},
            "disabled_until_timestep": 0.86,
            "ignore": ["*cross_attn*", "model.layers.3.*"],
        }
    }
}


@pytest.fixture
def config_path(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                             "sparse_attention_config": SPEC_BLOCK}))
    return p


@pytest.mark.parametrize("phase,a,b", [("prefill", 1443.49, 4.3037), ("decode", 0.119, 9.86)])
def test_calibrated_factor_per_phase(config_path, phase, a, b):
    s = blasst.SkipSoftmax.from_config(str(config_path), layer="model.layers.0.self_attn",
                                       phase=phase)
    assert s.enabled
    factor = a * math.exp(b * 0.5)
    assert s.lambda_for(100000) == pytest.approx(factor / 100000, rel=1e-9)
    assert s.disabled_until_timestep == pytest.approx(0.86)


def test_target_override(config_path):
    s = blasst.SkipSoftmax.from_config(config_path, layer="model.layers.1.self_attn",
                                       phase="prefill", target_sparsity=0.7)
    assert s.lambda_for(1 << 20) == pytest.approx(1443.49 * math.exp(4.3037 * 0.7) / (1 << 20))


def test_ignored_layers_are_dense(config_path):
    for layer in ("model.layers.3.self_attn", "blocks.0.cross_attn"):
        s = blasst.SkipSoftmax.from_config(config_path, layer=layer, phase="prefill")
        assert not s.enabled, layer


def test_dict_inputs_whole_and_bare(config_path):
    whole = json.loads(config_path.read_text())
    a = blasst.SkipSoftmax.from_config(whole, layer="x", phase="decode")
    b = blasst.SkipSoftmax.from_config(SPEC_BLOCK, layer="x", phase="decode")
    assert a.lambda_for(5000) == pytest.approx(b.lambda_for(5000))


def test_model_directory(config_path):
    s = blasst.SkipSoftmax.from_config(config_path.parent, layer="x", phase="prefill")
    assert s.enabled


def test_scalar_factor_wins_over_target(tmp_path):
    block = json.loads(json.dumps(SPEC_BLOCK))
    block["config_groups"]["group_0"]["threshold_scale_factor"] = 250.0
    s = blasst.SkipSoftmax.from_config(block, phase="prefill")
    assert s.lambda_for(1000) == pytest.approx(0.25)


def test_config_without_block_is_dense(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama"}))
    cfg = blasst.load_config(p)
    assert not cfg.present
    assert not blasst.SkipSoftmax.from_config(p, phase="prefill").enabled


def test_unknown_formula_is_rejected(tmp_path):
    block = json.loads(json.dumps(SPEC_BLOCK))
    block["config_groups"]["group_0"]["threshold_scale_factor"]["formula"] = "a / L"
    with pytest.raises(ValueError, match=r"formula"):
        blasst.load_config(block)


def test_malformed_number_names_the_path(tmp_path):
    block = json.loads(json.dumps(SPEC_BLOCK))
    block["config_groups"]["group_0"]["threshold_scale_factor"]["prefill"]["a"] = "big"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"sparse_attention_config": block}))
    with pytest.raises(ValueError, match=r"bad\.json.*prefill.*a"):
        blasst.load_config(p)


def test_missing_file():
    with pytest.raises(ValueError, match=r"no_such_config\.json"):
        blasst.load_config("/nonexistent/no_such_config.json")


def test_bad_phase(config_path):
    with pytest.raises(ValueError, match=r"phase"):
        blasst.SkipSoftmax.from_config(config_path, phase="training")


def test_config_drives_attention(rng, config_path):
    """The loaded settings change the computation: with the SPEC §7 example's prefill fit and its
    target 0.5, a 16384-key sequence gets lambda = 1443.49 * exp(4.3037 * 0.5) / 16384 = 0.758
    (< 1, so skipping is on), gated by disabled_until_timestep = 0.86."""
    from test_skip_cpu import dominant_first_tile
    s = blasst.SkipSoftmax.from_config(config_path, layer="l", phase="prefill")
    Lk = 16384
    lam = 1443.49 * math.exp(4.3037 * 0.5) / Lk
    assert 0.75 < lam < 0.76
    q, k, v = dominant_first_tile(rng, n_tiles=Lk // 128)  # later tiles: delta = -8 < ln(0.758)
    groups = 2  # one 64-row vote group per head, 2 heads
    blasst.diffusion.record_denoise_step(900, 1000)  # t = 0.9 > 0.86: gated, dense
    stats = {}
    blasst.attention(q, k, v, skip=s, stats=stats)
    assert stats["gated"] and stats["skipped"] == 0 and stats["visited"] == groups * 128
    blasst.diffusion.record_denoise_step(100, 1000)  # t = 0.1 <= 0.86: skipping allowed
    stats = {}
    blasst.attention(q, k, v, skip=s, stats=stats)
    assert not stats["gated"]
    assert stats["lambdas"] == [pytest.approx(lam, rel=1e-9)]
    assert stats["skipped"] == groups * 127 and stats["visited"] == groups * 128


def test_multi_component_model_dir(tmp_path):
    for name, block in (("transformer", SPEC_BLOCK), ("transformer_2", None), ("vae", None)):
        (tmp_path / name).mkdir()
        cfg = {"_class_name": "X"}
        if block is not None:
            cfg["sparse_attention_config"] = block
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    comps = blasst.load_model_configs(tmp_path)
    assert set(comps) == {"transformer"}
    s = comps["transformer"].skip_softmax(layer="blocks.0.attn1", phase="prefill")
    assert s.enabled and s.disabled_until_timestep == pytest.approx(0.86)


# ---- the "blasst" extension (SPEC §7 revised): order, vote granularity, richer form -------------

EXT_BLOCK = {
    "config_groups": {
        "group_0": {
            "threshold_scale_factor": {
                "formula": "a * exp(b * target_sparsity)",
                "prefill": {"a": 2.0, "b": 3.0},
            },
            "target_sparsity": 0.2,
            "blasst": {
                "visit_order": "max_first",
                "vote": {"prefill": {"tile_keys": 128, "rows": 64, "heads": 1, "split_tiles": 0}},
                "threshold_scale_factor": {
                    "form": "piecewise_linear_log_factor",
                    "prefill": {"target_sparsity": [0.2, 0.6], "log_factor": [1.0, 2.0],
                                "finite_size": {"mask": "causal", "rows": 64, "tile_keys": 128}},
                },
            },
        }
    }
}


def test_extension_gives_order_and_richer_form():
    s = blasst.SkipSoftmax.from_config(EXT_BLOCK, layer="x", phase="prefill")
    assert s.order == "max_first"
    # L = 256, 64-row groups on 128-key tiles, causal: 4 of the 6 visited pairs never skip, so
    # s = 0.2 is read at s' = 0.2 / (1 - 4/6) = 0.6: ln factor 2.
    assert s.lambda_for(256) == pytest.approx(math.exp(2.0) / 256, rel=1e-14)
    # L = 4096: f0 = 64 / 1056, s' = 0.2 / (1 - f0), on the segment (0.2, 1) - (0.6, 2).
    s1 = 0.2 / (1 - 64 / 1056)
    assert s.lambda_for(4096) == pytest.approx(math.exp(1 + 2.5 * (s1 - 0.2)) / 4096, rel=1e-14)
    # Settings survive the primitive description (torch ops) and pickling.
    import pickle
    assert blasst.SkipSoftmax.from_fields(s.fields()) == s
    t = pickle.loads(pickle.dumps(s))
    assert t == s and t.lambda_for(4096) == s.lambda_for(4096)
    assert "piecewise" in repr(s)


def test_without_extension_order_is_natural_and_fit_is_interop():
    plain = json.loads(json.dumps(EXT_BLOCK))
    del plain["config_groups"]["group_0"]["blasst"]
    s = blasst.SkipSoftmax.from_config(plain, layer="x", phase="prefill")
    assert s.order == "natural"
    assert s.lambda_for(4096) == 2.0 * math.exp(3.0 * 0.2) / 4096


def test_malformed_extension_names_the_path():
    bad = json.loads(json.dumps(EXT_BLOCK))
    bad["config_groups"]["group_0"]["blasst"]["threshold_scale_factor"]["prefill"]["log_factor"] = [2.0, 1.0]
    with pytest.raises(ValueError, match=r"blasst\.threshold_scale_factor\.prefill\.log_factor\[1\]"):
        blasst.load_config(bad)
