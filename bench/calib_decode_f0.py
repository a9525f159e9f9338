#!/usr/bin/env python3
"""Would a decode finite-size term fix the 4k calibration misfit? (docs/calibration.md section 7)

Reads the "lambda_s from the curves" table of `blasst calibrate --report DIR` report.md files
(lengths 4096..32768, the targets as rows) and emulates the SPEC §6 richer form twice: knots =
mean over lengths of ln(lambda_s * L) (made non-decreasing), once over all pairs and once over
skippable pairs with f0(L) = 1 / ceil(L / 128) (the first tile of an unsplit decode row is never
skipped: knots at lambda_{u (1 - f0)}, applied at s' = s / (1 - f0)). ln lambda is interpolated
linearly between the targets (outside them: the end slopes), so the figures approximate the
command's own validation (which uses the exact curves). Prints the largest |achieved - target|
per length for both, and for a fitted length exponent (lambda = f(s) / L^p) beside them.

Usage: calib_decode_f0.py REPORT.md [REPORT.md ...]   (numpy needed)
"""
import math
import sys

import numpy as np
def load(path):
    txt = open(path).read()
    sec = txt.split('### lambda_s from the curves')[1].split('###')[0]
    rows = [l for l in sec.splitlines() if l.startswith('| 0.')]
    Ls = [4096, 8192, 16384, 32768]
    S = []; lam = {L: [] for L in Ls}
    for r in rows:
        cells = [c.strip() for c in r.strip('|').split('|')]
        S.append(float(cells[0]))
        for L, c in zip(Ls, cells[1:]):
            lam[L].append(float(c.split()[0]))
    return np.array(S), {L: np.log(np.array(v)) for L, v in lam.items()}, Ls
def run(path):
    S, lnlam, Ls = load(path)
    T = 128
    def f0(L): return 1.0 / math.ceil(L / T)
    def lnlam_at(L, s):  # ln lambda where the sparsity at length L is s (end slopes outside)
        y = lnlam[L]
        if s < S[0]:
            return y[0] + (s - S[0]) * (y[1] - y[0]) / (S[1] - S[0])
        if s > S[-1]:
            return y[-1] + (s - S[-1]) * (y[-1] - y[-2]) / (S[-1] - S[-2])
        return float(np.interp(s, S, y))

    def s_at(L, ll):  # achieved sparsity at ln lambda (inverse)
        return float(np.interp(ll, lnlam[L], S))
    for use_f0 in (False, True):
        knots = []
        for u in S:
            knots.append(np.mean([lnlam_at(L, u * (1 - f0(L)) if use_f0 else u) + math.log(L) for L in Ls]))
        knots = np.maximum.accumulate(np.array(knots))
        worst = {L: 0.0 for L in Ls}
        for s in S:
            for L in Ls:
                sp = min(s / (1 - f0(L)), 0.999999) if use_f0 else s
                lnf = np.interp(sp, S, knots)
                ach = s_at(L, lnf - math.log(L))
                worst[L] = max(worst[L], abs(ach - s))
        print(path, 'f0' if use_f0 else 'no f0', ' '.join(f'{L//1024}k:{worst[L]:.3f}' for L in Ls))
    # For comparison, a fitted length exponent (not a SPEC §6 form): lambda = f(s) / L^p, one p
    # for all targets (the grid value with the smallest largest error).
    best = None
    for p in np.arange(0.90, 1.40001, 0.01):
        knots = np.maximum.accumulate(np.array([np.mean([lnlam_at(L, u) + p * math.log(L) for L in Ls]) for u in S]))
        worst = {L: max(abs(s_at(L, float(np.interp(s, S, knots)) - p * math.log(L)) - s) for s in S) for L in Ls}
        if best is None or max(worst.values()) < max(best[1].values()):
            best = (p, worst)
    print(path, f'exponent p = {best[0]:.2f}', ' '.join(f'{L//1024}k:{best[1][L]:.3f}' for L in Ls))
for p in sys.argv[1:]: run(p)
