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


def seed_tiles_max(q, k, scale=None, rows=ROWS, tile=TILE):
    """[1, H, L] float64: per row, the max of scale * q.k over the sink tile 0 and the row's own
    tile (the tile holding key r0, r0 = the first row of its vote group; full mask, Lq = Lk): the
    seeds of one call over the whole sequence (chunk_seed)."""
    return chunk_seed(q, k, np.asarray(k)[:, :tile], rows, tile, scale)


def chunk_seed(qc, kc, k_sink, rows=ROWS, tile=TILE, scale=None):
    """[1, H, n] float64: the seeds of one chunk call's rows (SPEC §2a, written from its text):
    per row i of the call, the max of scale * q.k over the sink tile k_sink (the sequence's
    first tile) and the call's own tile of row i, key tile ((i // rows) * rows) // tile of the
    chunk kc (vote groups and tiles counted from the call's first row and key)."""
    qc, kc, ks = (np.asarray(a, np.float64) for a in (qc, kc, k_sink))
    _, n, H, d = qc.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.empty((1, H, n))
    for h in range(H):
        s_own = qc[0, :, h] @ kc[0, :, h].T * scale
        s_sink = qc[0, :, h] @ ks[0, :, h].T * scale
        for i in range(n):
            t = (i // rows) * rows // tile
            own = s_own[i, t * tile:(t + 1) * tile]
            out[0, h, i] = max(s_sink[i].max(), own.max() if own.size else -np.inf)
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


def masked_chunk(q, k, v, keep=None, scale=None):
    """torch float64, differentiable: attention of q [B, Lq, H, d] over one key chunk k, v
    [B, Lk, H, d] with keep [B, H, Lq, Lk] (bool, None: every key) -> (out [B, Lq, H, d],
    lse [B, H, Lq]); a row with no kept key gives out 0 and lse -inf."""
    import torch
    s = torch.einsum("bihc,bjhc->bhij", q, k) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if keep is None:
        keep = torch.ones(s.shape, dtype=torch.bool)
    empty = ~keep.any(-1)                       # [B, H, Lq]: rows that keep no key
    s = s.masked_fill(~keep, -math.inf).masked_fill(empty[..., None], 0.0)  # finite there
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).masked_fill(~keep, 0.0)
    out = torch.einsum("bhij,bjhc->bihc", p, v)
    return (out.masked_fill(empty.permute(0, 2, 1)[..., None], 0.0),
            lse.masked_fill(empty, -math.inf))


def torch_merge(outs, lses):
    """torch, differentiable: chunk results (out [B, L, H, d], lse [B, H, L]) merged by LSE."""
    import torch
    lse = torch.stack(lses)                                  # [C, B, H, L]
    m = lse.amax(0)
    w = torch.exp(lse - torch.where(torch.isinf(m), 0.0, m))  # [C, B, H, L]
    o = sum(wc.permute(0, 2, 1)[..., None] * oc for wc, oc in zip(w, outs))
    return o / w.sum(0).permute(0, 2, 1)[..., None]
