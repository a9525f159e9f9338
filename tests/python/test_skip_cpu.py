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


@pytest.mark.parametrize("order", ["natural", "max_first"])
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


def test_threshold_below_gap_keeps_dense(rng):
    q, k, v = dominant_first_tile(rng, score=3.0)  # delta -3 > ln(1e-2): nothing skipped
    stats = blasst.SkipStats()
    out = blasst.attention(q, k, v, skip=blasst.SkipSoftmax(threshold=1e-2), stats=stats)
    assert stats.total_skipped == 0 and stats.total_visited == 8
    np.testing.assert_allclose(out, oracle.attention(q, k, v)[0], rtol=1e-4, atol=2e-5)


def test_factor_and_calibration_resolve_per_sequence_length(rng):
    q, k, v = dominant_first_tile(rng)
    Lk = k.shape[1]
    f = blasst.SkipSoftmax(factor=1e-2 * Lk)
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
    out = blasst.attention(q, k, v, skip=blasst.SkipSoftmax(factor=10.0 * Lk), stats=st)
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
    blasst.attention(q, k, v, causal=True, skip=blasst.SkipSoftmax(threshold=lam), stats=run)
    assert run.total_visited == dense.total_visited
    assert dense.sparsity_at(lam) == pytest.approx(run.sparsity(), abs=1e-12)
    assert run.total_skipped > 0  # the data has enough structure to skip something


def test_record_deltas(rng):
    q = rng.standard_normal((1, 64, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 256, 1, 16)).astype(np.float32)
    stats = blasst.SkipStats(record_deltas=True)
    blasst.attention(q, k, k, stats=stats)
    assert stats.deltas.shape == (stats.total_visited,)


def test_decode_stats(rng):
    q = rng.standard_normal((2, 1, 4, 16)).astype(np.float32)
    kc = rng.standard_normal((2, 500, 2, 16)).astype(np.float32)
    stats = {}
    blasst.decode(q, kc, kc, skip=blasst.SkipSoftmax(threshold=1e-3), stats=stats)
    assert stats["visited"] > 0 and 0.0 <= stats["sparsity"] <= 1.0
    assert len(stats["lambdas"]) == 2


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
