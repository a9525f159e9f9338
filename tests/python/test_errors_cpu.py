"""Bad input raises ValueError/TypeError with a message naming the argument."""
import numpy as np
import pytest

import blasst


@pytest.fixture
def qkv(rng):
    f = np.float32
    return (rng.standard_normal((2, 10, 4, 16)).astype(f), rng.standard_normal((2, 20, 2, 16)).astype(f),
            rng.standard_normal((2, 20, 2, 16)).astype(f))


def test_heads_not_divisible(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"Hq = 4 must be a multiple of KV heads Hk = 3"):
        blasst.attention(q, np.ones((2, 20, 3, 16), np.float32), np.ones((2, 20, 3, 16), np.float32))


def test_head_dim_mismatch(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^k: .*head dim"):
        blasst.attention(q, k[..., :8], v)


def test_integer_dtype(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^q: unsupported dtype int32"):
        blasst.attention(q.astype(np.int32), k, v)


def test_mixed_dtypes(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"^k: dtype f16 differs from q's f32"):
        blasst.attention(q, k.astype(np.float16), v)
    with pytest.raises(ValueError, match=r"^v: dtype f64 differs from q's f32"):
        blasst.attention(q, k, v.astype(np.float64))


def test_wrong_rank(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"q, v: expected q \[B, Lq, Hq, d\]"):
        blasst.attention(q[0], k, v)


def test_not_a_tensor(qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"^q: "):
        blasst.attention([[1.0]], k, v)


def test_bad_scale(qkv):
    with pytest.raises(ValueError, match=r"^scale must be finite and > 0, got nan"):
        blasst.attention(*qkv, scale=float("nan"))
    with pytest.raises(ValueError, match=r"^scale must be finite and > 0, got -1"):
        blasst.attention(*qkv, scale=-1.0)
    # a string is refused, not parsed (float("0.25") would take it); so is a bool
    with pytest.raises(TypeError, match=r"^scale: expected a number, got str '0.25'"):
        blasst.attention(*qkv, scale="0.25")
    with pytest.raises(TypeError, match=r"^scale: expected a number, got bool True"):
        blasst.attention(*qkv, scale=True)


def test_cu_seqlens_dtype(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected an int32 array, got int64"):
        blasst.attention(q, q, q, cu_seqlens_q=np.array([0, 10]), cu_seqlens_k=np.array([0, 10], np.int32))


def test_cu_seqlens_only_one(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"give both offsets"):
        blasst.attention(q, q, q, cu_seqlens_q=np.array([0, 10], np.int32))


def test_cu_seqlens_total_mismatch(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q"):
        blasst.attention(q, q, q, cu_seqlens_q=[0, 4, 11], cu_seqlens_k=[0, 4, 10])


def test_negative_max_seqlen(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"max_seqlen_q"):
        blasst.attention(q, q, q, cu_seqlens_q=[0, 10], cu_seqlens_k=[0, 10], max_seqlen_q=-1)


def test_max_seqlen_must_be_an_integer_within_the_tokens(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    ragged = dict(cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 4, 10])
    # a float is refused, not truncated (300.7 used to run as 300)
    with pytest.raises(ValueError, match=r"^max_seqlen_k: expected an int, got 6.5"):
        blasst.attention(q, q, q, max_seqlen_k=6.5, **ragged)
    # no sequence is longer than all the rows together
    with pytest.raises(ValueError, match=r"max_seqlen_q = 11 exceeds the total query rows q.shape\[0\] \(10\)"):
        blasst.attention(q, q, q, max_seqlen_q=11, **ragged)
    with pytest.raises(ValueError, match=r"max_seqlen_k = 11 exceeds the total key rows k.shape\[0\] \(10\)"):
        blasst.attention(q, q, q, max_seqlen_k=11, **ragged)
    # numpy integers are integers; the bound may exceed the longest sequence (6) up to the rows
    out = blasst.attention(q, q, q, max_seqlen_q=np.int64(10), max_seqlen_k=np.int32(10), **ragged)
    np.testing.assert_array_equal(out, blasst.attention(q, q, q, **ragged))


def test_decode_max_seqlen_beyond_capacity(rng):
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    cache = rng.standard_normal((1, 32, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"max_seqlen_k = 33 exceeds the cache capacity 32"):
        blasst.decode(q, cache, cache, max_seqlen_k=33)
    with pytest.raises(ValueError, match=r"^max_seqlen_k: expected an int, got 32.0"):
        blasst.decode(q, cache, cache, max_seqlen_k=32.0)
    np.testing.assert_array_equal(blasst.decode(q, cache, cache, max_seqlen_k=32), blasst.decode(q, cache, cache))


def test_page_table_out_of_range(rng):
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    pool = rng.standard_normal((4, 16, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"page_table"):
        blasst.decode(q, pool, pool, page_table=np.array([[0, 9]], np.int32),
                      seqlens=np.array([20], np.int32))


def test_seqlens_beyond_capacity(rng):
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    cache = rng.standard_normal((1, 32, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"seqlens"):
        blasst.decode(q, cache, cache, seqlens=np.array([33], np.int32))


def test_seqlens_and_page_table_rows_match_the_batch(rng):
    q = rng.standard_normal((2, 1, 2, 8)).astype(np.float32)
    cache = rng.standard_normal((2, 32, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^seqlens: expected one length per sequence \(2\), got 3"):
        blasst.decode(q, cache, cache, seqlens=np.array([5, 6, 7], np.int32))
    pool = rng.standard_normal((6, 16, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^page_table: expected one row per sequence \(2\), got 1 rows"):
        blasst.decode(q, pool, pool, page_table=np.array([[0, 1]], np.int32), seqlens=np.array([5, 6], np.int32))


def test_page_table_column_slice_bounds_the_capacity(rng):
    # A column slice of a wider table: its rows keep the parent's stride (4), but a sequence may
    # only use the slice's 2 columns (32 keys); the third column is not part of the table.
    q = rng.standard_normal((2, 1, 2, 8)).astype(np.float32)
    pool = rng.standard_normal((8, 16, 2, 8)).astype(np.float32)
    wide = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
    with pytest.raises(ValueError, match=r"seqlens_k\[1\] = 40 must lie in \[0, 32\]"):
        blasst.decode(q, pool, pool, page_table=wide[:, :2], seqlens=np.array([20, 40], np.int32))
    lens = np.array([20, 32], np.int32)
    np.testing.assert_array_equal(blasst.decode(q, pool, pool, page_table=wide[:, :2], seqlens=lens),
                                  blasst.decode(q, pool, pool, page_table=wide[:, :2].copy(), seqlens=lens))


def test_paged_without_seqlens(rng):
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    pool = rng.standard_normal((4, 16, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match=r"seqlens"):
        blasst.decode(q, pool, pool, page_table=np.array([[0, 1]], np.int32))


@pytest.mark.parametrize("kwargs,pattern", [
    ({}, r"give exactly one of threshold="),
    ({"threshold": 0.1, "factor": 5.0}, r"give exactly one of"),
    ({"threshold": 0.0}, r"threshold.*> 0"),
    ({"threshold": -0.5}, r"threshold.*> 0"),
    ({"threshold": float("nan")}, r"threshold.*finite"),
    ({"factor": float("inf")}, r"factor.*finite"),
    ({"calibration": (1.0, 2.0)}, r"needs target_sparsity"),
    ({"calibration": (1.0, 2.0), "target_sparsity": 1.5}, r"target_sparsity"),
    ({"calibration": "ab", "target_sparsity": 0.5}, r"calibration must be a pair"),
    ({"threshold": 0.1, "target_sparsity": 0.5}, r"target_sparsity= applies only"),
    ({"threshold": 0.1, "tile_keys": 0}, r"tile_keys"),
    ({"threshold": 0.1, "order": "zigzag"}, r"order"),
    ({"threshold": 0.1, "disabled_until_timestep": 1.5}, r"disabled_until_timestep"),
])
def test_skip_softmax_validation(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        blasst.SkipSoftmax(**kwargs)


def test_bad_skip_and_stats_types(qkv):
    with pytest.raises(TypeError, match=r"^skip: "):
        blasst.attention(*qkv, skip=0.1)
    with pytest.raises(TypeError, match=r"^stats: "):
        blasst.attention(*qkv, stats=[])


def test_cuda_unavailable_message_when_cpu_only():
    if blasst.built_with_cuda():
        pytest.skip("built with CUDA: nothing to check about the CPU-only message")
    assert blasst.cuda_available() is False
    assert blasst.cuda_device_name() == ""
