#!/usr/bin/env python3
"""List-scheduling model of the skip backward's main kernel on bench_backward's synthetic sets.

What it models: GQA 32/8, causal, d 128, L 8k (bench_backward --b 1 --h 32 --hk 8 --causal 1 --l 8192
--set window|heavy|iid), 132 SMs, each CTA taken by the first free SM in list order. A CTA's cost is
FIX + its kept (query head, vote group) pairs; the times are scaled so that the dense call's main
kernel takes DENSE_MAIN_MS and the call adds the fixed kernels (pre / postprocess, and for the work
list its build and split sum). Two orders: main before the work list (key block 0 of every KV head
first, then causal sections of SEC KV heads, key block outer) and the work list with its section
order (backward_work_list.cu: heavy blocks, >= 1.5x the mean, split by query head, by section then
longest first; the rest in the fixed order). The sets are bench_backward.cu's make_set, rebuilt here.

Usage: schedule_model.py [--fix 2,4,8] [--part-factor 1,1.7] [--share 1]; prints model vs the H100
figures of 2026-12-07 15:04 (every heavy block split then; the share rule's own figures: bench/results/
backward_split_share_2026-12-07_90d8d70_h100.md).
"""
import argparse
import heapq

import numpy as np

L, HK, GRP, SM, SEC = 8192, 8, 4, 132, 2
T, GROUPS = L // 128, L // 64
DENSE_CALL_MS, FIXED_MS, LIST_MS = 2.556, 0.162, 0.021  # H100: dense call; pre + post; list + split sum
DENSE_MAIN_MS = DENSE_CALL_MS - FIXED_MS
MEASURED = {("window", 0.7): (1.336, 1.047), ("heavy", 0.7): (1.671, 1.351),
            ("iid", 0.7): (1.359, 1.216), ("iid", 0.9): (1.370, 0.709)}  # ms: main 39e1d43, work list ws


def visible(g):
    return min(L - 1, (g + 1) * 64 - 1) // 128 + 1


def window_keeps(kind, g, t, w):
    if t == 0:
        return True
    if kind == "heavy" and any(t == T * (i + 1) // 9 for i in range(8)):
        return True
    return visible(g) - 1 - t <= w


def make_set(kind, s, seed=0):
    """kept[query head, group, tile] (bench_backward's sets; iid with numpy's generator, not its hash)."""
    kept = np.zeros((GRP * HK, GROUPS, T), bool)
    if kind == "iid":
        rng = np.random.default_rng(seed)
        for g in range(GROUPS):
            k = rng.random((GRP * HK, visible(g))) >= s
            k[:, 0] = True
            kept[:, g, :visible(g)] = k
        return kept

    def share(w):
        vis = sum(visible(g) for g in range(GROUPS))
        return sum(not window_keeps(kind, g, t, w) for g in range(GROUPS) for t in range(visible(g))) / vis
    lo, hi = 0, T
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if share(mid) <= s else (mid + 1, hi)
    for g in range(GROUPS):
        kept[:, g, :visible(g)] = [window_keeps(kind, g, t, lo) for t in range(visible(g))]
    return kept


def fixed_order(sink_first):
    out = [(0, kh) for kh in range(HK)] if sink_first else []
    for sec in range(0, HK, SEC):
        for n in range(1 if sink_first else 0, T):
            out += [(n, kh) for kh in range(sec, min(HK, sec + SEC))]
    return out


def makespan(costs):
    free = [0.0] * SM
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def orders(kept, fix, part_factor=1.0, share=None):
    """(main order's CTA costs, the work list's, heavy blocks, split blocks). part_factor: a split
    part's cost per kept group relative to a whole block's (the list is still ordered by its own
    cost model). share: a heavy block splits only when its cost is above share x an SM's share of
    the call (backward_params.hpp's kSplitShareNum / kSplitShareDen, 1 since 90d8d70); None: every
    heavy block splits (the rule before)."""
    def cost(n, kh, heads):
        return fix + sum(int(kept[kh * GRP + h, :, n].sum()) for h in heads)
    main = [cost(n, kh, range(GRP)) for n, kh in fixed_order(True)]
    total = {(n, kh): int(kept[kh * GRP:(kh + 1) * GRP, :, n].sum()) for n in range(T) for kh in range(HK)}
    mean = sum(total.values()) / len(total)
    heavy = {b for b, v in total.items() if v > 0 and v >= 1.5 * mean}
    per_sm = (sum(total.values()) + fix * len(total)) / SM
    split = {b for b in heavy if share is None or fix + total[b] > share * per_sm}
    items = []
    for n, kh in heavy:
        if (n, kh) in split:
            items += [(kh // SEC, -cost(n, kh, [h]), fix + part_factor * (cost(n, kh, [h]) - fix)) for h in range(GRP)]
        else:
            items.append((kh // SEC, -cost(n, kh, range(GRP)), cost(n, kh, range(GRP))))
    listed = [c for _, _, c in sorted(items)] + [cost(n, kh, range(GRP)) for n, kh in fixed_order(False)
                                                 if (n, kh) not in heavy]
    return main, listed, len(heavy), len(split)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fix", default="2", help="fixed cost of a CTA in vote-group steps, comma-separated")
    ap.add_argument("--part-factor", default="1", help="a split part's cost per kept group over a whole "
                    "block's, comma-separated (e.g. 1,1.7: the iid 90 %% arithmetic of 2026-12-07)")
    ap.add_argument("--share", default=None, type=float, help="split only heavy blocks above this many SM "
                    "shares of the call (the code's rule since 90d8d70: 1); default: every heavy block (the "
                    "rule of the MEASURED figures)")
    a = ap.parse_args()
    for fix, pf in ((float(x), float(y)) for x in a.fix.split(",") for y in a.part_factor.split(",")):
        d = makespan([fix + GRP * sum(g >= 2 * n for g in range(GROUPS)) for n, _ in fixed_order(False)])  # dense: no list
        for (kind, s), (m_main, m_list) in MEASURED.items():
            fixed, listed, nh, nsplit = orders(make_set(kind, s), fix, pf, a.share)
            t_main = makespan(fixed) / d * DENSE_MAIN_MS + FIXED_MS
            t_list = makespan(listed) / d * DENSE_MAIN_MS + FIXED_MS + LIST_MS
            print(f"fix {fix:g} parts x{pf:g} {kind} {s:.0%}: heavy blocks {nh} ({nsplit} split); main order model {t_main:.3f} ms / measured "
                  f"{m_main:.3f} ({m_main / t_main - 1:+.0%}); work list model {t_list:.3f} / measured {m_list:.3f} "
                  f"({m_list / t_list - 1:+.0%})")


if __name__ == "__main__":
    main()
