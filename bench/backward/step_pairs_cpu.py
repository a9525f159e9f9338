#!/usr/bin/env python3
"""How much more work 128-row backward steps do than 64-row ones under a skip set (CPU, numpy).

The d = 64 wgmma backward of ab66790 .. b736425 walked 128 query rows a step (two neighbouring
forward vote groups of 64): a step ran for a key tile when either group kept it (since 2026-12-07 a
step takes the next two kept groups wherever they lie, so this ratio is 1 by construction; kept as
the record of the estimate, bench/results/backward_step_pairs_2026-12-06_cpu.md). With 64-row steps
only kept groups ran. This estimates
the ratio (rows of kept 128-row steps) / (rows of kept 64-row groups) over the visited pairs for
the llm (causal) and dit (full) workloads of bench/prefill/bench_prefill.py (the same generators,
numpy's RNG instead of torch's: the same distributions, not the same draws), and for an i.i.d.
skip set like bench_backward's, at target sparsities 0.5 / 0.7 / 0.9.

Skip model (max-first, SPEC §2a's order in its limit): a group skips tile t when every row r of it
has max_{j in t} s_rj - max_j s_rj < ln(lambda); ln(lambda) bisected for the target fraction of
visited (group, tile) pairs, tile 0 and the diagonal tile never skipped (the sink / own tile).
  python bench/backward/step_pairs_cpu.py [--l 8192] [--heads 4] [--d 64]
"""
import argparse
import math

import numpy as np


def rope(x, base=10000.0):
    L, H, d = x.shape
    half = d // 2
    inv = base ** (-np.arange(half, dtype=np.float32) / half)
    ang = np.arange(L, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def gen(kind, L, H, d, seed):
    rng = np.random.default_rng(seed)
    rn = lambda *s: rng.standard_normal(s, dtype=np.float32)
    if kind == "llm":
        a = math.sqrt(9.0 / math.sqrt(d))
        c = rn(1, H, d)
        q = rope(0.6 * rn(L, H, d) + a * c)
        k = rope(0.6 * rn(L, H, d) + a * c)
        s = math.sqrt(7.0 / math.sqrt(d))
        u = rn(1, 1, d)
        q = q + s * u
        k[0] += s * u[0]
        hh = rng.integers(1, L, 8)
        k[hh] += 0.8 * s * u[0]
        return q, k
    T, Hg, Wg = L // 1024, 32, 32
    t, hg, w = np.meshgrid(np.arange(T), np.arange(Hg), np.arange(Wg), indexing="ij")
    nf = d // 6
    feats = []
    for p, n in zip((t, hg, w), (T, Hg, Wg)):
        p = p.reshape(-1).astype(np.float32)
        om = (math.pi / n) * (2.0 ** (np.arange(nf, dtype=np.float32) * 4.0 / nf))
        feats += [np.cos(p[:, None] * om), np.sin(p[:, None] * om)]
    e = np.concatenate(feats, -1)
    e = np.pad(e, ((0, 0), (0, d - e.shape[1])))[:, None, :]
    a = math.sqrt(10.0 * math.sqrt(d) / (3 * nf))
    return a * e + 0.5 * rn(L, H, d), a * e + 0.5 * rn(L, H, d)


def group_deltas(q, k, causal):
    """[H, groups, tiles]: max over the group's rows of (tile max - row max); -inf where not visited;
    +inf on tile 0 and the diagonal tile (never skipped)."""
    L, H, d = q.shape
    G, T = L // 64, L // 128
    out = np.full((H, G, T), -np.inf, dtype=np.float32)
    for h in range(H):
        s = (q[:, h, :] @ k[:, h, :].T) / math.sqrt(d)
        if causal:
            s[np.triu_indices(L, 1)] = -np.inf
        m = s.max(1, keepdims=True)
        tm = s.reshape(L, T, 128).max(2) - m  # [L, T]
        out[h] = tm.reshape(G, 64, T).max(1)
        out[h][:, 0] = np.inf
        if causal:
            for g in range(G):
                out[h][g, (g * 64 + 63) // 128] = np.inf
    return out


def ratio(kept, visited):
    """rows of kept 128-row steps / rows of kept 64-row groups (over visited pairs)."""
    H, G, T = kept.shape
    pair = kept.reshape(H, G // 2, 2, T).any(2)
    vis_pair = visited.reshape(H, G // 2, 2, T).any(2)
    return 2.0 * (pair & vis_pair).sum() / kept.sum(), kept.sum() / visited.sum()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--l", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=64)
    args = ap.parse_args()
    print("| workload | target | achieved (64-row groups) | work of 128-row steps / 64-row |")
    print("|---|---|---|---|")
    for kind, causal in (("llm", True), ("dit", False), ("iid", False)):
        if kind == "iid":
            visited = np.ones((args.heads, args.l // 64, args.l // 128), bool)
            rng = np.random.default_rng(1)
            u = rng.random(visited.shape)
        else:
            q, k = gen(kind, args.l, args.heads, args.d, seed=7)
            dl = group_deltas(q, k, causal)
            visited = dl > -np.inf
            vals = np.sort(dl[visited & np.isfinite(dl)])
        for target in (0.5, 0.7, 0.9):
            if kind == "iid":
                kept = u >= target
            else:
                n_skip = int(target * visited.sum())
                if n_skip >= len(vals):
                    print(f"| {kind} | {target} | unreachable | - |")
                    continue
                ln_lam = vals[n_skip]  # pairs with delta < ln_lam skip
                kept = visited & ~(dl < ln_lam)
            r, keep_frac = ratio(kept, visited)
            print(f"| {kind} | {target} | {1 - keep_frac:.3f} | {r:.3f} |")


if __name__ == "__main__":
    main()
