"""bench/model/finetune.py --tiny end to end on the CPU (reference engine, forward and backward):
sparsity-aware fine-tuning vs a dense control from a tiny recipe checkpoint (README in
bench/model, "Sparsity-aware fine-tuning")."""
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "model"))

MODELS = ("base", "aware_target", "aware_max", "control")


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory):
    import finetune
    out = tmp_path_factory.mktemp("model_finetune_tiny")
    threads = torch.get_num_threads()
    try:  # no --ckpt: finetune.py trains the tiny checkpoint itself (40 steps, deterministic)
        rc = finetune.main(["--out", str(out), "--tiny"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    with open(out / "results.json") as f:
        return out, json.load(f)


def test_every_row_and_no_errors(ft_run):
    out, R = ft_run
    assert not R["errors"], R["errors"]
    assert R["tokens_match_ckpt_run"]
    assert set(R["settings"]) == {"target", "max"}
    names = {"dense", *R["settings"], *R["frontier"]}
    assert set(R["eval"]) == set(MODELS)
    for m in MODELS:
        assert set(R["eval"][m]) == names, m
        for n, r in R["eval"][m].items():
            assert math.isfinite(r["loss"]) and len(r["per_seq"]) == R["eval_seqs"], (m, n)
            assert len(r["sparsity_per_layer"]) == R["model"]["n_layers"]
            if n == "dense":
                assert r["sparsity"] == 0.0
            else:
                assert 0.0 < r["sparsity"] < 1.0, (m, n, r["sparsity"])
    assert set(R["summary"]) == {"target", "max"}
    for s in R["summary"].values():
        for k in ("posthoc_gap", "aware_gap", "aware_dense_minus_control_dense"):
            assert math.isfinite(s[k]), k
    # the tables: every model row, the summary rows; and nothing else written (no checkpoints)
    md = (out / "results.md").read_text()
    for m in MODELS:
        assert f"| {m} |" in md, m
    assert "| target |" in md and "| max |" in md
    assert sorted(os.listdir(out)) == ["log.txt", "results.json", "results.md"]


def test_settings_rule(ft_run):
    _, R = ft_run
    sel, st = R["selection"], R["settings"]
    cap = sel["lambda_cap"]
    assert st["target"]["order"] == "max_first" and 0 < st["target"]["lambda"] <= cap
    # the target setting's lambda reaches its target on the training-text curve
    assert abs(st["target"]["calib_sparsity"] - sel["target_used"]) < 0.02
    assert sel["target_used"] <= sel["max_first_curve_at_cap"]
    # 'max' is the candidate at the cap whose post-hoc loss increase is the larger
    c = sel["candidates_at_cap"]
    best = max(c, key=lambda n: c[n]["loss_delta"])
    assert st["max"]["lambda"] == cap and st["max"]["from"] == best
    assert st["max"]["order"] == c[best]["order"]


def test_same_steps_batches_and_lr(ft_run):
    _, R = ft_run
    arms = {a["name"]: a for a in R["arms"]}
    assert set(arms) == {"aware_target", "aware_max", "control"}
    K = R["fixed_steps"]
    assert K == 20
    for a in arms.values():
        assert a["steps"] == K and len(a["losses"]) == K and not a["truncated"]
        assert a["lr"] == arms["control"]["lr"]
    # warm-up: the LR rises to the peak
    lr = arms["control"]["lr"]
    assert lr[0] < lr[R["params"]["warmup"]] == pytest.approx(R["params"]["lr"])


def test_aware_forward_skips_and_differs_from_dense(ft_run):
    _, R = ft_run
    arms = {a["name"]: a for a in R["arms"]}
    for name in ("aware_target", "aware_max"):
        ts = arms[name]["train_sparsity"]
        assert len(ts) >= 2 and ts[0]["step"] == 0 and ts[-1]["step"] == R["fixed_steps"]
        assert all(t["sparsity"] > 0.05 for t in ts), ts
        # same weights, same first batch: the skip changed the training forward
        assert abs(arms[name]["losses"][0] - arms["control"]["losses"][0]) > 1e-5
        # and the skip's gradients changed the weights: a different dense model afterwards
        assert abs(R["eval"][name]["dense"]["loss"] - R["eval"]["control"]["dense"]["loss"]) > 1e-5
    assert arms["control"]["train_sparsity"] == []


def test_gradients_finite_and_nonzero(ft_run):
    _, R = ft_run
    for a in R["arms"]:
        assert all(math.isfinite(g) and g > 0 for g in a["grad_norm"]), a["name"]
        q = a["qkv_grad_norm"]
        assert len(q) == a["steps"]  # --tiny logs every step
        assert all(math.isfinite(x["norm"]) and x["norm"] > 0 for x in q), a["name"]


def test_finetune_lowers_heldout_loss(ft_run):
    _, R = ft_run
    E = R["eval"]
    base = E["base"]["dense"]["loss"]
    for m in ("aware_target", "aware_max", "control"):
        assert E[m]["dense"]["loss"] < base - 0.02, (m, E[m]["dense"]["loss"], base)
    for s in R["settings"]:  # the aware model evaluated with its own skip, vs the base's skip
        assert E[f"aware_{s}"][s]["loss"] < E["base"][s]["loss"] - 0.02
    assert all(math.isfinite(x) for a in R["arms"] for x in a["losses"])
