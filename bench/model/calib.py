"""SPEC §6 calibration from a model run, in Python (bench/model/README.md, "Calibration").

The package's fit (src/calibration/fit.cpp, `blasst calibrate`) is not exposed to Python and the
CLI takes Q/K/V .npy files, not histograms, so this module follows SPEC §6 and
docs/calibration.md §2 step by step on the one-pass curves of blasst's SkipStats histograms:

- lambda_s at length L: the smallest histogram bin edge e (ln units, -64 + i/16) whose pooled
  sparsity_at(exp(e)) >= s (where a histogram curve is exact); unreachable (None) when no
  lambda < 1 reaches s;
- in range: a target reached at every length; only in-range targets enter the fit;
- interop form: least squares of log(factor) = log(a) + b * s over (s, L_i) points, R^2 in log
  space;
- richer form: ln factor piecewise linear over the in-range targets, knot value = mean over the
  lengths of ln(factor), made non-decreasing by pooling adjacent violators (as fit.cpp does).
  The finite-size term is not fitted here (it is optional; see the README);
- the paper's inverse law per target: log a' = mean log(lambda * L), and the free exponent p of
  lambda ~ L^-p.
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


def _ols(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    la = my - b * mx
    ss_res = sum((y - (la + b * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return la, b, (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


def _pava(ys):
    blocks = []  # [sum, count]
    for v in ys:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            blocks[-2][0] += blocks[-1][0]
            blocks[-2][1] += blocks[-1][1]
            blocks.pop()
    out = []
    for s_, c in blocks:
        out += [s_ if c == 1 else s_ / c] * c
    return out


def fit_phase(curves_by_len, targets):
    """curves_by_len: {L: [SkipStats, ...]} (one layer or pooled). Returns a dict with a, b, r2,
    range, knots, per-(target, L) lambdas, inverse law; raises ValueError with the max sparsity
    per length when fewer than 2 targets are reached at every length."""
    lens = sorted(curves_by_len)
    lam = {t: {L: lambda_for_sparsity(curves_by_len[L], t) for L in lens} for t in targets}
    max_sp = {L: pooled_curve(curves_by_len[L], math.exp(BIN_LO + (N_EDGES - 1) * BIN_W))
              for L in lens}
    in_range = [t for t in targets if all(lam[t][L] is not None for L in lens)]
    if len(in_range) < 2:
        raise ValueError("fewer than 2 targets are reached at every length (max sparsity with "
                         "lambda < 1: " + ", ".join(f"L={L}: {max_sp[L]:.3f}" for L in lens) + ")")
    xs, ys = [], []
    for t in in_range:
        for L in lens:
            xs.append(t)
            ys.append(math.log(lam[t][L] * L))
    la, b, r2 = _ols(xs, ys)
    knots_y = _pava([sum(math.log(lam[t][L] * L) for L in lens) / len(lens) for t in in_range])
    inverse = []
    for t in in_range:
        lx = [math.log(L) for L in lens]
        ly = [math.log(lam[t][L]) for L in lens]
        la_inv = sum(math.log(lam[t][L] * L) for L in lens) / len(lens)
        p = -_ols(lx, ly)[1] if len(set(lx)) > 1 else None
        inverse.append({"target": t, "a_prime": math.exp(la_inv), "p": p})
    return {"a": math.exp(la), "b": b, "r2": r2, "range": [in_range[0], in_range[-1]],
            "in_range": in_range, "extrapolated": [t for t in targets if t not in in_range],
            "knots": {"target_sparsity": in_range, "log_factor": knots_y},
            "lengths": lens, "max_sparsity": {str(L): max_sp[L] for L in lens},
            "lambdas": {str(t): {str(L): lam[t][L] for L in lens} for t in targets},
            "inverse_law": inverse}


def piecewise_factor(knots, s):
    """ln factor linear between knots, end slopes outside (docs/config.md)."""
    xs, ys = knots["target_sparsity"], knots["log_factor"]
    i = 0 if s <= xs[0] else (len(xs) - 2 if s >= xs[-1] else
                              max(j for j in range(len(xs) - 1) if xs[j] <= s))
    sl = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return math.exp(ys[i] + sl * (s - xs[i]))


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
