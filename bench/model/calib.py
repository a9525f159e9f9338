"""SPEC §6 calibration from a model run (bench/model/README.md, "Calibration").

The fit is the package's own (C++ calibrate(), src/calibration/fit.cpp) through
blasst.calibration.fit on the one-pass curves of blasst's SkipStats histograms; fit_phase
reshapes its result into the dict recipe.py reports (lambda per (target, length), in-range targets,
knots of the richer form, the paper's inverse law). The finite-size variant of the richer form is
not asked for (mask=None), as before.

Kept in Python here, with no C++ binding of the same shape:
- pooled_curve / lambda_for_sparsity: the curve read back at one lambda for the per-layer report
  (recipe.py "calib_sparsity"); the C++ fit does this internally and reports only its own points;
- make_config: recipe.py fits every layer separately so that one layer the data cannot fit falls
  back to the pooled group (an error in blasst.calibration.fit with {layer: samples} would fail
  every layer), and it names groups layer_N / all_layers, which its test and report read.
"""
from __future__ import annotations

import json
import math

BIN_LO, BIN_W, N_EDGES = -64.0, 1.0 / 16.0, 1024  # edges -64 + i/16, i = 0..1023 (< 0)


def pooled_curve(stats_list, lam):
    v = sum(s.total_visited for s in stats_list)
    return sum(s.sparsity_at(lam) * s.total_visited for s in stats_list) / v if v else 0.0


def lambda_for_sparsity(stats_list, s):
    """docs/calibration.md §1 (histogram): the smallest bin edge with sparsity >= s; None if no
    lambda < 1 reaches s."""
    if pooled_curve(stats_list, math.exp(BIN_LO + (N_EDGES - 1) * BIN_W)) < s:
        return None
    lo, hi = 0, N_EDGES - 1  # invariant: curve(edge hi) >= s
    if pooled_curve(stats_list, math.exp(BIN_LO)) >= s:
        return math.exp(BIN_LO)
    while hi - lo > 1:
        m = (lo + hi) // 2
        if pooled_curve(stats_list, math.exp(BIN_LO + m * BIN_W)) >= s:
            hi = m
        else:
            lo = m
    return math.exp(BIN_LO + hi * BIN_W)


def fit_phase(curves_by_len, targets):
    """curves_by_len: {L: [SkipStats, ...]} (one layer or pooled). Returns a dict with a, b, r2,
    range, knots, per-(target, L) lambdas, inverse law; raises ValueError when the C++ fit cannot
    fit (e.g. fewer than 2 targets reached at every length)."""
    import blasst
    lens = sorted(curves_by_len)
    cal = blasst.calibration.fit([(curves_by_len[L], L) for L in lens], list(targets))
    f = cal.fit_for()
    extrapolated = [t for t in targets if t in f["extrapolated"]]
    in_range = [t for t in targets if t not in extrapolated]
    if len(in_range) < 2:
        raise ValueError("fewer than 2 targets are reached at every length (max sparsity with "
                         "lambda < 1: " + ", ".join(f"L={L}: {m:.3f}" for L, m in
                                                    zip(f["lengths"], f["max_sparsity"])) + ")")
    lam = {t: {L: None for L in lens} for t in targets}
    for p in f["points"]:
        if p["lambda"] < 1.0:
            lam[p["target"]][p["length"]] = p["lambda"]
    knots_t, knots_y, _ = f["piecewise"]
    inverse = [{"target": i["target"], "a_prime": i["a_prime"],
                "p": None if i["exponent"] != i["exponent"] else i["exponent"]}
               for i in f["inverse_law"] if i["target"] in in_range]
    return {"a": f["a"], "b": f["b"], "r2": f["r2"], "range": [in_range[0], in_range[-1]],
            "in_range": in_range, "extrapolated": extrapolated,
            "knots": {"target_sparsity": list(knots_t), "log_factor": list(knots_y)},
            "lengths": lens, "max_sparsity": {str(L): m for L, m in zip(f["lengths"],
                                                                        f["max_sparsity"])},
            "lambdas": {str(t): {str(L): lam[t][L] for L in lens} for t in targets},
            "inverse_law": inverse, "fit": "blasst.calibration.fit (C++ calibrate)"}


def layer_name(l):
    return f"layers.{l}"


def make_config(layer_fits, pooled_fit, order, vote, target=0.5, layer_fits_decode=None,
                pooled_decode=None, vote_decode=None):
    """SPEC §7 block: one group per layer with its own prefill fit (layers = ["layers.N"]), then
    a catch-all group with the pooled fit (first group that applies wins). Each group carries the
    interop (a, b) and the blasst extension (visit order, vote, piecewise form) per phase; the
    decode phase, when fitted, uses the layer's decode fit or else the pooled one."""
    layer_fits_decode = layer_fits_decode or {}

    def group(fit, dfit, layers):
        tsf = {"formula": "a * exp(b * target_sparsity)"}
        ext_tsf = {"form": "piecewise_linear_log_factor"}
        votes, ts = {}, {}
        for ph, f, v in (("prefill", fit, vote), ("decode", dfit, vote_decode)):
            if f is None:
                continue
            tsf[ph] = {"a": f["a"], "b": f["b"]}
            ext_tsf[ph] = dict(f["knots"])
            votes[ph] = v
            ts[ph] = target
        g = {"algorithm": "skip_softmax", "threshold_scale_factor": tsf, "target_sparsity": ts,
             "blasst": {"visit_order": order, "vote": votes, "threshold_scale_factor": ext_tsf}}
        if layers:
            g["layers"] = layers
        return g
    groups = {}
    for l in sorted(layer_fits):
        if layer_fits[l] is not None:
            groups[f"layer_{l}"] = group(layer_fits[l], layer_fits_decode.get(l) or pooled_decode,
                                         [layer_name(l)])
    if pooled_fit is not None:
        groups["all_layers"] = group(pooled_fit, pooled_decode, None)
    return {"sparse_attention_config": {"config_groups": groups}}


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
