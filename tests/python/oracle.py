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
