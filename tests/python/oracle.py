"""Independent float64 attention in numpy (written from SPEC §1, not from the C++ code)."""
import math

import numpy as np


def attention(q, k, v, causal=False, scale=None, key_keep=None):
    """q [B, Lq, Hq, d], k [B, Lk, Hk, d], v [B, Lk, Hk, dv] -> (out [B, Lq, Hq, dv], lse [B, Hq, Lq]).

    Causal is bottom-right aligned: query i sees key j iff j <= i + Lk - Lq. Rows that see no key
    give 0 and lse = -inf. key_keep (bool [Lk]) drops keys outright (to model skipped tiles).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Lq, Hq, d = q.shape
    Lk, Hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = Hq // Hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    visible = np.ones((Lq, Lk), dtype=bool)
    if causal:
        i = np.arange(Lq)[:, None]
        j = np.arange(Lk)[None, :]
        visible = j <= i + (Lk - Lq)
    if key_keep is not None:
        visible = visible & np.asarray(key_keep, dtype=bool)[None, :]
    out = np.zeros((B, Lq, Hq, dv))
    lse = np.full((B, Hq, Lq), -np.inf)
    for h in range(Hq):
        kh, vh = k[:, :, h // g, :], v[:, :, h // g, :]
        s = np.einsum("bid,bjd->bij", q[:, :, h, :], kh) * scale
        s = np.where(visible[None], s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        any_visible = np.isfinite(m)
        m_safe = np.where(any_visible, m, 0.0)
        p = np.where(visible[None], np.exp(s - m_safe), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        o = np.einsum("bij,bjd->bid", p, vh) / np.where(l > 0, l, 1.0)
        out[:, :, h, :] = np.where(any_visible, o, 0.0)
        lse[:, h, :] = np.where(any_visible[..., 0], (m_safe + np.log(np.where(l > 0, l, 1.0)))[..., 0],
                                -np.inf)
    return out, lse


def visited_tiles(Lq, Lk, causal, rows=64, tile=128):
    """(vote group, key tile) pairs a dense pass visits for one sequence and one head (SPEC §5):
    groups of `rows` consecutive query rows; causal counts tiles with at least one visible key."""
    n_tiles = -(-Lk // tile)
    total = 0
    for r0 in range(0, Lq, rows):
        r1 = min(r0 + rows, Lq) - 1
        if not causal:
            total += n_tiles
            continue
        last_visible = r1 + Lk - Lq  # the group's last row sees keys 0..last_visible
        if last_visible >= 0:
            total += min(n_tiles, last_visible // tile + 1)
    return total


def visit_order(n_vis, own, order):
    """SPEC §2a: the key tiles 0..n_vis-1 in the order a vote group visits them.

    natural: 0, 1, 2, ...; max_first: the sink tile 0, the group's own tile, then own-1, own+1,
    own-2, own+2, ... (tiles outside 0..n_vis-1 dropped, each tile once)."""
    if order == "natural":
        return list(range(n_vis))
    if order != "max_first":
        raise ValueError(f"order: {order!r}")
    seq = [0, own]
    for dist in range(1, n_vis + 1):
        seq += [own - dist, own + dist]
    out = []
    for t in seq:
        if 0 <= t < n_vis and t not in out:
            out.append(t)
    return out


def skip_attention(q, k, v, lam, causal=False, order="natural", rows=64, tile=128, scale=None):
    """Skip-Softmax attention in float64, written from SPEC §2 / §2a / §3 / §5 (not from the C++).

    Vote groups are `rows` consecutive query rows of one (sequence, head). Each group visits its
    visible key tiles (causal: tiles holding a key visible to one of its rows) in `order`; own tile
    (max_first): the diagonal tile in causal prefill (the tile of the group's last visible key),
    the tile holding key r0 * Lk / Lq in full attention. For a tile j, with the running maxima m_r
    taken before it, delta = max over rows of (tile_max_rj - m_r) (a row with no key seen yet has
    m_r = -inf, so the first tile is never skipped); skip iff delta < ln(lam); lam >= 1 is dense.
    The output is the softmax over the kept tiles' visible keys (a skipped tile changes nothing).

    Returns (out [B, Lq, Hq, dv], info) with info["visited"] / info["skipped"] per query head
    (summed over the batch) and info["deltas"] (every visited pair's delta).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Lq, Hq, d = q.shape
    Lk, Hk, dv = k.shape[1], k.shape[2], v.shape[3]
    g = Hq // Hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    ln_lam = math.log(lam) if lam < 1.0 else -math.inf  # lam >= 1: nothing passes the test
    i = np.arange(Lq)[:, None]
    j = np.arange(Lk)[None, :]
    visible = (j <= i + (Lk - Lq)) if causal else np.ones((Lq, Lk), dtype=bool)
    n_tiles = -(-Lk // tile)
    out = np.zeros((B, Lq, Hq, dv))
    visited = [0] * Hq
    skipped = [0] * Hq
    deltas = []
    for b in range(B):
        for h in range(Hq):
            s_all = q[b, :, h, :] @ k[b, :, h // g, :].T * scale
            s_all = np.where(visible, s_all, -np.inf)
            for r0 in range(0, Lq, rows):
                r1 = min(r0 + rows, Lq)
                vis = visible[r0:r1]
                if not vis.any():
                    continue
                last_key = int(np.nonzero(vis.any(axis=0))[0].max())
                n_vis = last_key // tile + 1 if causal else n_tiles
                own = n_vis - 1 if causal else (r0 * Lk // Lq) // tile
                m = np.full(r1 - r0, -np.inf)
                keep = np.zeros(Lk, dtype=bool)
                for t in visit_order(n_vis, own, order):
                    s = s_all[r0:r1, t * tile:(t + 1) * tile]
                    tile_max = s.max(axis=1)
                    with np.errstate(invalid="ignore"):
                        diff = tile_max - m  # -inf - -inf (row sees nothing yet) -> nan
                    diff = np.where(np.isnan(diff), -np.inf, diff)
                    delta = float(diff.max())
                    deltas.append(delta)
                    visited[h] += 1
                    if delta < ln_lam:
                        skipped[h] += 1
                    else:
                        keep[t * tile:(t + 1) * tile] = True
                    m = np.maximum(m, tile_max)
                s = np.where(keep[None, :], s_all[r0:r1], -np.inf)
                mx = s.max(axis=1, keepdims=True)
                ok = np.isfinite(mx)
                p = np.where(np.isfinite(s), np.exp(s - np.where(ok, mx, 0.0)), 0.0)
                lsum = p.sum(axis=1, keepdims=True)
                o = (p @ v[b, :, h // g, :]) / np.where(lsum > 0, lsum, 1.0)
                out[b, r0:r1, h, :] = np.where(ok, o, 0.0)
    return out, {"visited": visited, "skipped": skipped, "deltas": np.array(deltas)}
