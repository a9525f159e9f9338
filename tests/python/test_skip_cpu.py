"""Skip-Softmax through the Python API: exact skip sets on constructed inputs, statistics."""
import math

import numpy as np
import pytest

import blasst
import oracle

TILE = 128


def dominant_first_tile(rng, B=1, Lq=64, n_tiles=4, H=2, d=16, score=8.0):
    """Queries all along e0; keys of tile 0 along e0 (scaled score `score`), every other key
    orthogonal to e0 (score exactly 0). Any tile after the first has delta = -score."""
    Lk = n_tiles * TILE
    q = np.zeros((B, Lq, H, d), np.float32)
    q[..., 0] = 1.0
    k = rng.standard_normal((B, Lk, H, d)).astype(np.float32)
    k[:, :, :, 0] = 0.0
    k[:, :TILE, :, 0] = score * math.sqrt(d)  # scale 1/sqrt(d) -> score exactly
    v = rng.standard_normal((B, Lk, H, d)).astype(np.float32)
    v[:, TILE:] += 50.0  # the skipped tiles' values stand out, so dropping them shows
    return q, k, v


# One vote group per head: there max-first visits 0, 1, 2, 3 like natural order, so only natural is
# run here; the orders' skip sets over several groups are test_visit_order_decides_the_skip_set's.
@pytest.mark.parametrize("order", ["natural"])
def test_skipped_tiles_drop_out_exactly(rng, order):
    q, k, v = dominant_first_tile(rng)
    Lk = k.shape[1]
    skip = blasst.SkipSoftmax(threshold=1e-2, order=order)  # ln(1e-2) = -4.6 > -8: skip
    stats = {}
    out = blasst.attention(q, k, v, skip=skip, stats=stats)
    keep = np.zeros(Lk, bool)
    keep[:TILE] = True
    only_tile0 = oracle.attention(q, k, v, key_keep=keep)[0]
    dense = oracle.attention(q, k, v)[0]
    np.testing.assert_allclose(out, only_tile0, rtol=1e-4, atol=2e-5)
    assert np.abs(dense - only_tile0).max() > 1e-2  # the check can tell skip from dense
    groups = 1 * 2  # one 64-row vote group per head, 2 heads
    assert stats["visited"] == groups * 4
    assert stats["skipped"] == groups * 3
    assert stats["sparsity"] == pytest.approx(0.75)
    assert stats["granularity"]["order"] == order
    assert "64" in stats["counted_at"]


def tile_levels(rng, levels, Lq, d=16):
    """Causal-friendly constructed scores: every query is e0, every key of key tile t in head h
    has score exactly levels[h][t] (channel 0 = level * sqrt(d), scale 1/sqrt(d)); the other key
    channels are noise the queries do not see. Each tile's values are offset by 10 * t, so the
    output shows which tiles were dropped."""
    H, n_tiles = len(levels), len(levels[0])
    Lk = n_tiles * TILE
    q = np.zeros((1, Lq, H, d), np.float32)
    q[..., 0] = 1.0
    k = rng.standard_normal((1, Lk, H, d)).astype(np.float32)
    k[..., 0] = np.repeat(np.asarray(levels, np.float32).T, TILE, axis=0)[None] * math.sqrt(d)
    v = rng.standard_normal((1, Lk, H, d)).astype(np.float32)
    v += (10.0 * (np.arange(Lk) // TILE)).astype(np.float32)[None, :, None, None]
    return q, k, v


# Two heads, four key tiles, causal Lq = Lk = 512: eight vote groups of 64 rows per head; a group
# in query tile t sees key tiles 0..t, its own (diagonal) tile is t. ln(1e-2) = -4.61.
# Head 0, levels 4, -2, 0, 8 (the diagonal tile holds the row maxima of tile-3 rows):
#   natural   0 | 0,1s | 0,1s,2 | 0,1s,2,3   -> skips per group pair 0 + 2 + 2 + 2 = 6
#   max_first 0 | 0,1s | 0,2,1s | 0,3,2s,1s  -> 0 + 2 + 2 + 4 = 8
# Head 1, levels 0, 6, 1, 0 (the maximum sits in tile 1, before the diagonal):
#   natural   0 | 0,1 | 0,1,2s | 0,1,2s,3s   -> 0 + 0 + 2 + 4 = 6
#   max_first 0 | 0,1 | 0,2,1  | 0,3,2,1     -> 0
# ("s": skipped; each query tile holds two groups). Visited: 2 * (1 + 2 + 3 + 4) = 20 per head.
ORDER_LEVELS = [[4.0, -2.0, 0.0, 8.0], [0.0, 6.0, 1.0, 0.0]]
ORDER_EXPECTED = {"natural": [6, 6], "max_first": [8, 0]}


@pytest.mark.parametrize("order", ["natural", "max_first"])
def test_visit_order_decides_the_skip_set(rng, order):
    """SPEC §2a on several vote groups, where max_first and natural skip different tiles: counts
    per head from the hand derivation above and from the float64 oracle, output from the oracle."""
    q, k, v = tile_levels(rng, ORDER_LEVELS, Lq=512)
    lam = 1e-2
    want_out, want = oracle.skip_attention(q, k, v, lam, causal=True, order=order)
    assert want["skipped"] == ORDER_EXPECTED[order]  # the oracle agrees with the derivation
    assert want["visited"] == [20, 20]
    stats = blasst.SkipStats(record_deltas=True)
    out = blasst.attention(q, k, v, causal=True, skip=blasst.SkipSoftmax(threshold=lam, order=order),
                           stats=stats)
    assert stats.granularity["order"] == order
    assert stats.visited == want["visited"]
    assert stats.skipped == ORDER_EXPECTED[order]
    np.testing.assert_allclose(np.sort(stats.deltas), np.sort(want["deltas"]), rtol=0, atol=1e-5)
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
    other = "natural" if order == "max_first" else "max_first"
    other_out, _ = oracle.skip_attention(q, k, v, lam, causal=True, order=other)
    # the other order's output lies far outside the tolerance above (its extra or missing tiles
    # carry weights exp(-4) .. exp(-10) of values offset by 10 * t)
    assert np.abs(other_out - want_out).max() > 1e-2


@pytest.mark.parametrize("order", ["natural", "max_first"])
@pytest.mark.parametrize("Lq,Lk,causal", [(256, 1024, False), (384, 1024, True)])
def test_skip_set_matches_the_oracle_on_structured_data(rng, order, Lq, Lk, causal):
    """Random tile levels per head with noisy queries: the per-head skip counts and the output
    equal the float64 SPEC oracle in both orders (full attention scales the own tile by Lk/Lq;
    causal with Lq < Lk is bottom-right aligned)."""
    H, d = 2, 32
    q = np.zeros((1, Lq, H, d), np.float32)
    q[..., 0] = 1.0
    q[..., 1:] = rng.standard_normal((1, Lq, H, d - 1)) * 0.5
    k = (rng.standard_normal((1, Lk, H, d)) * 0.5).astype(np.float32)
    level = rng.uniform(0.0, 10.0, size=(Lk // TILE, H))
    k[..., 0] = np.repeat(level, TILE, axis=0)[None] * math.sqrt(d)
    v = rng.standard_normal((1, Lk, H, d)).astype(np.float32)
    lam = math.exp(-3.0)
    want_out, want = oracle.skip_attention(q, k, v, lam, causal=causal, order=order)
    finite = want["deltas"][np.isfinite(want["deltas"])]
    assert np.abs(finite - math.log(lam)).min() > 1e-3  # no float32-vs-float64 borderline case
    assert sum(want["skipped"]) > 0 and sum(want["skipped"]) < sum(want["visited"])
    stats = blasst.SkipStats()
    out = blasst.attention(q, k, v, causal=causal, stats=stats,
                           skip=blasst.SkipSoftmax(threshold=lam, order=order))
    assert stats.visited == want["visited"]
    assert stats.skipped == want["skipped"]
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)


def test_threshold_below_gap_keeps_dense(rng):
    q, k, v = dominant_first_tile(rng, score=3.0)  # delta -3 > ln(1e-2): nothing skipped
    stats = blasst.SkipStats()
    out = blasst.attention(q, k, v, skip=blasst.SkipSoftmax(threshold=1e-2, order="natural"), stats=stats)
    assert stats.total_skipped == 0 and stats.total_visited == 8
    np.testing.assert_allclose(out, oracle.attention(q, k, v)[0], rtol=1e-4, atol=2e-5)


def test_factor_and_calibration_resolve_per_sequence_length(rng):
    q, k, v = dominant_first_tile(rng)
    Lk = k.shape[1]
    f = blasst.SkipSoftmax(factor=1e-2 * Lk, order="natural")
    assert f.lambda_for(Lk) == pytest.approx(1e-2)
    a, b, s = 0.3, 4.0, 0.5
    c = blasst.SkipSoftmax(calibration=(a, b), target_sparsity=s)
    assert c.lambda_for(1000) == pytest.approx(a * math.exp(b * s) / 1000)
    for skip in (f, c):
        st = {}
        blasst.attention(q, k, v, skip=skip, stats=st)
        assert st["lambdas"] == [pytest.approx(skip.lambda_for(Lk))]
    # lambda >= 1 (a huge factor on a short sequence) means dense for that sequence
    st = {}
    out = blasst.attention(q, k, v, skip=blasst.SkipSoftmax(factor=10.0 * Lk, order="natural"), stats=st)
    assert st["skipped"] == 0
    np.testing.assert_allclose(out, oracle.attention(q, k, v)[0], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("B,Lq,Lk,causal", [(2, 100, 300, False), (1, 300, 300, True),
                                             (1, 50, 400, True)])
def test_dense_visited_counts(rng, B, Lq, Lk, causal):
    H = 3
    q = rng.standard_normal((B, Lq, H, 16)).astype(np.float32)
    k = rng.standard_normal((B, Lk, H, 16)).astype(np.float32)
    stats = blasst.SkipStats()
    blasst.attention(q, k, k, causal=causal, stats=stats)
    per_head = B * oracle.visited_tiles(Lq, Lk, causal)
    assert stats.visited == [per_head] * H
    assert stats.skipped == [0] * H
    assert stats.sparsity() == 0.0


def test_one_pass_curve_matches_skip_run(rng):
    """SPEC §5: the histogram of one dense pass predicts the sparsity of a skip run exactly at a
    bin edge (lambda = exp(-4))."""
    B, Lq, Lk, H, d = 1, 256, 1024, 2, 32
    # Scores = a random level per (key tile, head) plus noise: some tiles fall far below the
    # running max, some do not.
    q = np.zeros((B, Lq, H, d), np.float32)
    q[..., 0] = 1.0
    q[..., 1:] = rng.standard_normal((B, Lq, H, d - 1)) * 0.5
    k = (rng.standard_normal((B, Lk, H, d)) * 0.5).astype(np.float32)
    level = rng.uniform(0.0, 10.0, size=(Lk // 128, H))
    k[..., 0] = np.repeat(level, 128, axis=0)[None] * math.sqrt(d)
    v = rng.standard_normal((B, Lk, H, d)).astype(np.float32)
    dense = blasst.SkipStats(histogram=True)
    blasst.attention(q, k, v, causal=True, stats=dense)
    assert len(dense.histograms) == H
    assert sum(int(h.sum()) for h in dense.histograms) == dense.total_visited
    lam = math.exp(-4.0)
    run = blasst.SkipStats()
    blasst.attention(q, k, v, causal=True, skip=blasst.SkipSoftmax(threshold=lam, order="natural"), stats=run)
    assert run.total_visited == dense.total_visited
    assert dense.sparsity_at(lam) == pytest.approx(run.sparsity(), abs=1e-12)
    assert run.total_skipped > 0  # the data has enough structure to skip something


def test_record_deltas(rng):
    """One delta per visited pair, equal to the float64 oracle's (SPEC §2: max over the group's
    rows of tile max - running max before the tile)."""
    q = rng.standard_normal((1, 64, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 256, 1, 16)).astype(np.float32)
    stats = blasst.SkipStats(record_deltas=True)
    blasst.attention(q, k, k, stats=stats)
    assert stats.deltas.shape == (stats.total_visited,) == (2,)
    _, want = oracle.skip_attention(q, k, k, 0.5)
    np.testing.assert_allclose(np.sort(stats.deltas), np.sort(want["deltas"]), rtol=0, atol=1e-5)


def test_decode_stats(rng):
    """Decode (q_len = 1, causal: the query sees the whole cache) on a dominant first key tile:
    every later tile of each (sequence, head) vote group has delta = -8 < ln(1e-3) = -6.9."""
    B, Lk, Hq, Hk, d = 2, 500, 4, 2, 16
    q = np.zeros((B, 1, Hq, d), np.float32)
    q[..., 0] = 1.0
    kc = rng.standard_normal((B, Lk, Hk, d)).astype(np.float32)
    kc[..., 0] = 0.0
    kc[:, :TILE, :, 0] = 8.0 * math.sqrt(d)
    vc = rng.standard_normal((B, Lk, Hk, d)).astype(np.float32)
    vc[:, TILE:] += 50.0
    stats = {}
    out = blasst.decode(q, kc, vc, skip=blasst.SkipSoftmax(threshold=1e-3, order="natural"), stats=stats)
    n_tiles = -(-Lk // TILE)  # 4: the last tile is short
    groups = B * Hq  # vote_rows = 64 > q_len: one group per (sequence, query head)
    assert stats["visited"] == groups * n_tiles
    assert stats["skipped"] == groups * (n_tiles - 1)
    assert stats["lambdas"] == [pytest.approx(1e-3)] * B
    keep = np.zeros(Lk, bool)
    keep[:TILE] = True
    np.testing.assert_allclose(out, oracle.attention(q, kc, vc, causal=True, key_keep=keep)[0],
                               rtol=1e-4, atol=2e-5)


def test_stats_object_is_reset_between_calls(rng):
    q = rng.standard_normal((1, 64, 1, 16)).astype(np.float32)
    stats = blasst.SkipStats()
    blasst.attention(q, q, q, stats=stats)
    first = stats.total_visited
    blasst.attention(q, q, q, stats=stats)
    assert stats.total_visited == first


def test_skip_softmax_object():
    s = blasst.SkipSoftmax(threshold=0.01, tile_keys=64, vote_rows=32, order="max_first")
    assert s.enabled and s.threshold == 0.01 and s.tile_keys == 64 and s.vote_rows == 32
    assert s.order == "max_first"
    assert s == blasst.SkipSoftmax.from_fields(s.fields())
    assert "threshold=0.01" in repr(s)
    d = blasst.SkipSoftmax.dense()
    assert not d.enabled and "dense" in repr(d)
    import pickle
    c = blasst.SkipSoftmax(calibration=(2.0, 3.0), target_sparsity=0.4, disabled_until_timestep=0.5)
    for x in (s, d, c):
        assert pickle.loads(pickle.dumps(x)) == x
