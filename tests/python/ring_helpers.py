"""Ring attention (context parallelism) pieces written from the SPEC for the tests: a sink-heavy
input, the seed of each row (max of its seed tiles' scores, float64) and the LSE merge of chunk
results. Shared by test_seed_max_cpu.py and test_context_parallel_cpu.py."""
import math

import numpy as np

TILE, ROWS = 128, 64  # the reference's default vote granularity (tile_keys, vote_rows)


def sink_input(seed, L=1024, H=2, d=64):
    """q, k, v float32 [1, L, H, d]: noise plus a sink key 0 that every query scores ~10 above the
    rest (a dedicated channel), so far tiles pass the skip test once the max holds the sink."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, L, H, d)).astype(np.float32)
    k = rng.standard_normal((1, L, H, d)).astype(np.float32)
    v = rng.standard_normal((1, L, H, d)).astype(np.float32)
    q[..., 0] = 4.0
    k[..., 0] = 0.0
    k[:, 0, :, 0] = 20.0
    return q, k, v


def seed_tiles_max(q, k, scale=None):
    """[1, H, L] float64: per row, the max of scale * q.k over the sink tile 0 and the row's own
    tile (the tile holding key r0, r0 = the first row of its vote group; full mask, Lq = Lk)."""
    _, L, H, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qd, kd = q[0].astype(np.float64), k[0].astype(np.float64)
    out = np.empty((1, H, L))
    for h in range(H):
        s = (qd[:, h, :] @ kd[:, h, :].T) * scale  # [L, L]
        for i in range(L):
            own = (i // ROWS) * ROWS // TILE
            cols = np.r_[0:TILE, own * TILE:(own + 1) * TILE]
            out[0, h, i] = s[i, cols].max()
    return out


def lse_merge(outs, lses):
    """Chunk results (out [1, L, H, dv], lse [1, H, L]) merged by LSE in float64:
    M = max_c lse_c, w_c = exp(lse_c - M), out = sum w_c out_c / sum w_c, lse = M + ln sum w_c.
    Rows with every lse_c = -inf: out 0, lse -inf."""
    lse = np.stack([np.asarray(x, np.float64) for x in lses])  # [C, 1, H, L]
    M = lse.max(axis=0)
    safe = np.where(np.isneginf(M), 0.0, M)
    w = np.exp(lse - safe)  # [C, 1, H, L]
    wsum = w.sum(axis=0)
    o = sum(np.asarray(oc, np.float64) * wc.transpose(0, 2, 1)[..., None] for oc, wc in zip(outs, w))
    den = np.where(wsum == 0, 1.0, wsum).transpose(0, 2, 1)[..., None]
    return o / den, np.where(wsum == 0, -np.inf, safe + np.log(np.where(wsum == 0, 1.0, wsum)))
