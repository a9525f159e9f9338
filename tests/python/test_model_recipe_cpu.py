"""bench/model/recipe.py --tiny end to end on the CPU (reference engine): the training recipe and
the accuracy benchmark of bench/model (README there) at toy scale.

The corpus is the Python source of the installed packages (torch, numpy, ...), so the tiny model
differs from one machine to the next (the GPU machine's torch is not CI's): the assertions do not
need every layer to be fitted (on the device's corpus one layer's calibration reached fewer than
two targets and fell to the pooled fit, 2026-12-07)."""
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "model"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import recipe
    out = tmp_path_factory.mktemp("model_tiny")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = recipe.main(["--out", str(out), "--tiny"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    with open(out / "results.json") as f:
        return out, json.load(f)


def test_tokenizer_roundtrip_and_split():
    import corpus
    text = "def f(x):\n    return x + 1  # ünï\n\n\tclass A: pass\n"
    merges = corpus.train_bpe([text * 20], 40)
    tok = corpus.Tokenizer(merges)
    ids = tok.encode_doc(text)
    assert ids[0] == corpus.BOS
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) + 1  # merges shorten the encoding
    assert corpus.split_of("torch/nn/modules/linear.py", 5) == corpus.split_of(
        "torch/nn/modules/linear.py", 5)


def test_training_loss_decreases(tiny_run):
    _, R = tiny_run
    curve = R["train"]["curve"]
    assert R["train"]["steps"] >= 20
    first = sum(c["loss"] for c in curve[:3]) / 3
    last = sum(c["loss"] for c in curve[-3:]) / 3
    assert last < first - 1.0, (first, last)
    assert last < R["baselines"]["unigram_loss"]


def test_blasst_dense_equals_torch(tiny_run):
    _, R = tiny_run
    for ctx in R["params"]["contexts"]:
        rows = [r for r in R["rows"] if r["ctx"] == ctx and r["mode"] == "dense"]
        sd = next(r for r in rows if r["kind"] == "sdpa")
        bd = next(r for r in rows if r["kind"] == "blasst")
        assert abs(sd["loss"] - bd["loss"]) < 1e-4, (sd, bd)
        assert abs(sd["copy_loss"] - bd["copy_loss"]) < 1e-4
        assert bd["sparsity"] == 0.0


def test_every_row_present_and_skipping_skips(tiny_run):
    out, R = tiny_run
    assert not R["errors"], R["errors"]
    targets = [0.3, 0.5, 0.7, 0.9]
    for ctx in R["params"]["contexts"]:
        for order in ("natural", "max_first"):
            for mode in ("per_layer", "fixed"):
                for t in targets:
                    rows = [r for r in R["rows"] if (r["ctx"], r["order"], r["mode"], r["target"])
                            == (ctx, order, mode, t)]
                    assert len(rows) == 1, (ctx, order, mode, t)
                    r = rows[0]
                    assert "error" not in r
                    assert math.isfinite(r["loss"]) and math.isfinite(r["copy_loss"])
                    assert 0.0 <= r["sparsity"] <= 1.0
                    assert len(r["sparsity_per_layer"]) == R["model"]["n_layers"]
    top = [r for r in R["rows"] if r["mode"] != "dense" and r["target"] == 0.9]
    assert max(r["sparsity"] for r in top) > 0.0
    # where the calibration curve reaches the target, the achieved sparsity on held-out text
    # follows it (different text, small samples: loosely)
    fixed = [r for r in R["rows"] if r["mode"] == "fixed" and r["reachable"]]
    assert fixed
    for r in fixed:
        assert abs(r["sparsity"] - r["target"]) < 0.2, r
    a = R["attention_analysis"]["layers"]
    assert len(a) == R["model"]["n_layers"] and all(0 <= l["sink_mass"] <= 1 for l in a)
    # sequences start at a document start: key 0 is a BOS, so its mass is part of the BOS mass
    assert R["attention_analysis"]["bos_keys_per_seq"] >= 1
    assert all(l["sink_mass"] - 1e-6 <= l["bos_mass"] <= 1 + 1e-6 for l in a), a
    for l in a:
        assert abs(sum(l["mass_by_log2_distance"]) - 1.0) < 1e-3
        assert abs(sum(l["mass_by_tile_distance"]) - 1.0) < 1e-3
    assert (out / "results.md").exists()
    ck = R["checkpoint"]
    assert ck and all((out / n).stat().st_size < 15 * 1024 * 1024 for n in ck)


def test_checkpoint_reloads(tiny_run):
    import recipe
    from model import LM, ModelConfig
    out, R = tiny_run
    cfg = ModelConfig(**{k: v for k, v in R["model"].items() if k != "n_params"})
    m = LM(cfg)
    sd = recipe.load_checkpoint(str(out), R["checkpoint"])
    m.load_state_dict({k: v.float() for k, v in sd.items()})


@pytest.fixture(scope="module")
def tiny_eval_only(tiny_run, tmp_path_factory):
    import recipe
    src, _ = tiny_run
    out = tmp_path_factory.mktemp("model_tiny_eval_only")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = recipe.main(["--out", str(out), "--eval-only", "--ckpt", str(src)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    with open(out / "results.json") as f:
        return out, json.load(f)


def test_eval_only_roundtrip(tiny_run, tiny_eval_only):
    _, A = tiny_run
    out, B = tiny_eval_only
    assert B["eval_only"] and B["tiny"] and "train_s" not in B["phases"]
    assert B["tokens_match_ckpt_run"] and not B["errors"], B["errors"]
    assert B["checkpoint"] == A["checkpoint"]
    # the tokenizer came from the checkpoint folder, not retrained
    with open(out / "tokenizer.json") as f, open(os.path.join(B["ckpt_dir"], "tokenizer.json")) as g:
        assert json.load(f)["merges"] == json.load(g)["merges"]
    key = lambda r: (r["ctx"], r["kind"], r["order"], r["mode"], r["target"])  # noqa: E731
    a = {key(r): r for r in A["rows"]}
    b = {key(r): r for r in B["rows"]}
    assert a.keys() == b.keys()
    for k, r in a.items():  # same weights, same held-out split, same draws: the same numbers
        assert b[k]["loss"] == r["loss"], k
        assert b[k].get("sparsity") == r.get("sparsity"), k
    dense = [r for r in B["rows"] if r["mode"] == "dense"]
    assert len(dense) == 2 * len(B["params"]["contexts"])


def test_calibrated_config(tiny_run):
    import blasst
    import calib
    out, R = tiny_run
    C = R["calibration"]
    n = R["model"]["n_layers"]
    assert C["order"] == "max_first" and C["phase"] == "prefill" and len(C["layers"]) == n
    assert C["lengths"] == sorted(R["params"]["contexts"])
    cfg = blasst.load_config(str(out / C["config_file"]))  # blasst's own (C++) parser
    assert cfg.present and cfg.group_names[-1] == "all_layers"
    for l in range(n):
        f = C["layers"][l]
        if "error" in f:
            # a layer whose fit failed (e.g. its curve reaches fewer than two targets on this
            # corpus) is a note, and every calibrated row flags it as using the pooled fit
            assert any(x.startswith(f"calibration prefill layer {l}:") for x in R["notes"])
            cal = [r for r in R["rows"] if r["mode"].startswith("cal_")]
            assert cal and all("pooled fit" in r["layer_flags"][l] for r in cal)
            continue
        assert f"layer_{l}" in cfg.group_names
        assert f["knots"]["target_sparsity"] == f["in_range"] and len(f["in_range"]) >= 2
        s = cfg.skip_softmax(layer=calib.layer_name(l), phase="prefill", target_sparsity=0.5)
        assert s.order == "max_first" and s.enabled
        assert s.fields()[11] is not None  # the piecewise form is what the loader applies
        assert (s.tile_keys, s.vote_rows) == (16, 4)  # the vote it was counted at
        # lambda_for_sparsity: the smallest bin edge that reaches the target
        L = C["lengths"][-1]
        lam = f["lambdas"][str(f["in_range"][-1])][str(L)]
        assert lam < 1
    rows = [r for r in R["rows"] if r["mode"].startswith("cal_")]
    for L in R["params"]["contexts"]:
        for form in ("cal_piecewise", "cal_exp"):
            for t in (0.3, 0.5, 0.7, 0.9):
                got = [r for r in rows if (r["ctx"], r["mode"], r["target"]) == (L, form, t)]
                assert len(got) == 1, (L, form, t)
                r = got[0]
                assert "error" not in r
                assert 0.0 <= r["sparsity"] <= 1.0 and math.isfinite(r["loss"])
                assert abs(r["abs_error"] - abs(r["sparsity"] - t)) < 1e-12
                assert r["within_tolerance"] == (r["abs_error"] <= r["tolerance"])
                assert len(r["sparsity_per_layer"]) == n and len(r["layer_flags"]) == n
                for l in range(n):  # nothing capped silently: lambda >= 1 is flagged and dense
                    if r["lambdas"][l] >= 1:
                        assert "lambda >= 1: dense" in r["layer_flags"][l]
                        assert r["sparsity_per_layer"][l] == 0.0
                    ext = t not in (C["layers"][l].get("in_range") or C["pooled"]["in_range"])
                    assert ext == any(x.startswith("extrapolated") for x in r["layer_flags"][l])
    # both forms of the same fit: with 2 knots the piecewise line is the exponential
    md = open(out / "results.md").read()
    assert "## Calibrated config" in md and "Within tolerance at every length" in md


def test_lambda_for_sparsity_is_the_first_bin_edge():
    import blasst
    import calib
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 128, 2, 16, generator=g)
    k = torch.randn(1, 128, 1, 16, generator=g) * 3
    st = blasst.SkipStats(histogram=True)
    blasst.attention(q, k, k, causal=True, stats=st,
                     skip=blasst.SkipSoftmax(threshold=1e-30, order="max_first", tile_keys=16,
                                             vote_rows=4))
    for s in (0.1, 0.3):
        lam = calib.lambda_for_sparsity([st], s)
        if lam is None:
            assert calib.pooled_curve([st], math.exp(-1 / 16)) < s
            continue
        assert calib.pooled_curve([st], lam) >= s
        assert calib.pooled_curve([st], lam * math.exp(-1 / 16)) < s


def test_decode_rows(tiny_run):
    import blasst
    out, R = tiny_run
    n = R["model"]["n_layers"]
    rows = [r for r in R["rows"] if r["mode"].startswith("dec_")]
    for L in R["params"]["contexts"]:
        d = [r for r in rows if r["ctx"] == L and r["mode"] == "dec_dense"]
        assert len(d) == 1 and "error" not in d[0]
        # dense decode over the KV cache == torch SDPA on the same tokens
        assert abs(d[0]["loss"] - d[0]["sdpa_loss_same_tokens"]) < 1e-4
        assert d[0]["sparsity"] == 0.0
    D = R["calibration_decode"]
    assert D["phase"] == "decode" and D["vote"]["heads"] == R["model"]["n_heads"] // R["model"]["n_kv_heads"]
    cfg = blasst.load_config(str(out / R["calibration"]["config_file"]))
    s = cfg.skip_softmax(layer="layers.0", phase="decode", target_sparsity=0.3)
    assert s.order == "max_first" and s.split_tiles == D["vote"]["split_tiles"]
    cal = [r for r in rows if r["mode"] == "dec_cal_piecewise"]
    assert len(cal) == 8 * len(R["params"]["contexts"])  # --cal-targets 0.2 ... 0.9
    for r in cal:
        assert "error" not in r and 0.0 <= r["sparsity"] <= 1.0 and len(r["layer_flags"]) == n
        for l in range(n):
            if r["lambdas"][l] >= 1:
                assert "lambda >= 1: dense" in r["layer_flags"][l]
                assert r["sparsity_per_layer"][l] == 0.0
    assert max(r["sparsity"] for r in cal) > 0.0
    assert "## Decode" in open(out / "results.md").read()


def test_analysis_masses_of_uniform_attention():
    """AnalysisAttn on q = 0 (uniform causal attention, p[i, j] = 1 / (i + 1) for j <= i):
    sink mass = mean over rows of 1 / (i + 1); BOS mass with BOS keys {0, 5} adds 1 / (i + 1)
    for the rows i >= 5 (the formulas, float64)."""
    import recipe
    L, B = 16, 2
    an = recipe.AnalysisAttn(1, L, 4, bos_mask=__import__("numpy").zeros((B, L), bool))
    an.bos_mask[:, [0, 5]] = True
    q = torch.zeros(B, L, 2, 8)
    k = torch.randn(B, L, 1, 8, generator=torch.Generator().manual_seed(0))
    an(q, k, k, 0)
    r = an.result()[0]
    sink = sum(1 / (i + 1) for i in range(L)) / L
    bos = sum((1 + (i >= 5)) / (i + 1) for i in range(L)) / L
    assert abs(r["sink_mass"] - sink) < 1e-6 and abs(r["bos_mass"] - bos) < 1e-6, (r, sink, bos)


def test_a_layer_without_a_fit_is_a_note_and_its_rows_use_the_pooled_fit():
    # the case the device's corpus produced (2026-12-07): one layer's curve reaches fewer than two
    # targets; its rows use the pooled fit (flagged), the run is not in error. The pooled fit
    # failing is an error.
    import types
    import recipe

    def fit_phase(curves_by_len, targets):
        if curves_by_len[256] == ["bad"]:
            raise ValueError("fewer than 2 targets are reached at every length")
        return {"in_range": [0.3, 0.5]}

    calib = types.SimpleNamespace(fit_phase=fit_phase)
    R = {"errors": [], "notes": []}
    C = {"layers": [], "errors": []}
    H = {256: {0: ["good"], 1: ["bad"]}}
    fits, pooled = recipe._fit_layers(calib, H, [256], 2, [0.3, 0.5], "prefill", C, R)
    assert fits[0] is not None and fits[1] is None and pooled is not None
    assert R["errors"] == [] and len(R["notes"]) == 1 and "layer 1" in R["notes"][0]
    assert "pooled fit" in recipe._layer_flags(fits, pooled, 1, 0.3, 0.01)
    assert recipe._layer_flags(fits, pooled, 0, 0.3, 0.01) == []

    H = {256: {0: ["bad"], 1: ["bad"]}}  # pooled = ["bad", "bad"] fits here; make it fail too
    calib.fit_phase = lambda c, t: (_ for _ in ()).throw(ValueError("no fit"))
    R = {"errors": [], "notes": []}
    C = {"layers": [], "errors": []}
    fits, pooled = recipe._fit_layers(calib, H, [256], 2, [0.3, 0.5], "prefill", C, R)
    assert pooled is None and len(R["notes"]) == 2
    assert R["errors"] == ["calibration prefill pooled: no fit"]
    assert "no fit: dense" in recipe._layer_flags(fits, pooled, 0, 0.3, None)
