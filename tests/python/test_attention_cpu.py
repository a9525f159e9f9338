"""blasst.attention on numpy inputs (the CPU reference) against the float64 oracle."""
import subprocess
import sys

import numpy as np
import pytest

import blasst
import oracle


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


CASES = [
    # B, Lq, Lk, Hq, Hk, d, dv, causal
    (1, 64, 64, 2, 2, 32, 32, False),      # MHA, one tile
    (2, 100, 300, 4, 2, 32, 16, False),    # GQA, Lk not a multiple of 128, dv != d
    (2, 100, 300, 4, 2, 32, 16, True),     # causal, bottom-right aligned
    (1, 200, 130, 4, 1, 64, 64, True),     # MQA, Lq > Lk: the first rows see nothing
    (3, 1, 257, 6, 3, 16, 16, True),       # a single query row per sequence
]


@pytest.mark.parametrize("B,Lq,Lk,Hq,Hk,d,dv,causal", CASES)
def test_dense_matches_oracle_f32(rng, B, Lq, Lk, Hq, Hk, d, dv, causal):
    q, k, v = rand(rng, (B, Lq, Hq, d)), rand(rng, (B, Lk, Hk, d)), rand(rng, (B, Lk, Hk, dv))
    out, lse = blasst.attention(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = oracle.attention(q, k, v, causal=causal)
    assert out.shape == (B, Lq, Hq, dv) and out.dtype == np.float32
    assert lse.shape == (B, Hq, Lq) and lse.dtype == np.float32
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=2e-5)
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-5, atol=1e-4)
    if causal and Lq > Lk:  # fully masked rows: exactly 0 and -inf, never NaN
        assert not np.isnan(out).any()
        assert (out[:, : Lq - Lk] == 0).all()
        assert np.isneginf(lse[:, :, : Lq - Lk]).all()


def test_without_lse_returns_only_out(rng):
    q, k, v = rand(rng, (1, 10, 2, 16)), rand(rng, (1, 20, 2, 16)), rand(rng, (1, 20, 2, 16))
    out = blasst.attention(q, k, v)
    assert isinstance(out, np.ndarray) and out.shape == (1, 10, 2, 16)


def test_scale(rng):
    q, k, v = rand(rng, (1, 33, 2, 16)), rand(rng, (1, 77, 2, 16)), rand(rng, (1, 77, 2, 8))
    out = blasst.attention(q, k, v, scale=0.7)
    np.testing.assert_allclose(out, oracle.attention(q, k, v, scale=0.7)[0], rtol=1e-4, atol=2e-5)
    # a different scale must give a different answer (the argument is really used)
    assert np.abs(out - oracle.attention(q, k, v)[0]).max() > 1e-3


def test_f16_inputs_and_output(rng):
    q = rand(rng, (2, 70, 4, 64), np.float16)
    k = rand(rng, (2, 150, 2, 64), np.float16)
    v = rand(rng, (2, 150, 2, 64), np.float16)
    out, lse = blasst.attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32
    ref_out, ref_lse = oracle.attention(q, k, v, causal=True)  # on the same f16 values
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-3, rtol=1e-3)


def test_f64_inputs(rng):
    q, k, v = rand(rng, (1, 40, 2, 32), np.float64), rand(rng, (1, 90, 2, 32), np.float64), \
        rand(rng, (1, 90, 2, 32), np.float64)
    out = blasst.attention(q, k, v)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, oracle.attention(q, k, v)[0], rtol=1e-5, atol=1e-6)


def test_strided_views(rng):
    B, Lq, Lk, Hq, Hk, d, dv = 2, 90, 200, 4, 2, 32, 16
    # q from a [B, H, L, d] buffer (the transformers layout), k every other row of a longer
    # buffer, v a slice of the last dimension of a wider buffer: none of them is contiguous.
    q = rand(rng, (B, Hq, Lq, d)).transpose(0, 2, 1, 3)
    k = rand(rng, (B, 2 * Lk, Hk, d))[:, ::2]
    v = rand(rng, (B, Lk, Hk, dv + 8))[..., 3:3 + dv]
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or v.flags.c_contiguous)
    out = blasst.attention(q, k, v, causal=True)
    ref = oracle.attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                           np.ascontiguousarray(v), causal=True)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-5)


def test_read_only_inputs(rng):
    q, k, v = rand(rng, (1, 8, 2, 16)), rand(rng, (1, 8, 2, 16)), rand(rng, (1, 8, 2, 16))
    for a in (q, k, v):
        a.setflags(write=False)
    np.testing.assert_allclose(blasst.attention(q, k, v), oracle.attention(q, k, v)[0],
                               rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_batch(rng, causal):
    q_lens, k_lens = [5, 130, 1, 64], [7, 257, 300, 64]
    Hq, Hk, d, dv = 4, 2, 32, 16
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    q = rand(rng, (cu_q[-1], Hq, d))
    k = rand(rng, (cu_k[-1], Hk, d))
    v = rand(rng, (cu_k[-1], Hk, dv))
    out, lse = blasst.attention(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens),
                                return_lse=True)
    assert out.shape == (cu_q[-1], Hq, dv) and lse.shape == (Hq, cu_q[-1])
    for b in range(len(q_lens)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ro, rl = oracle.attention(q[None, qs], k[None, ks], v[None, ks], causal=causal)
        np.testing.assert_allclose(out[qs], ro[0], rtol=1e-4, atol=2e-5, err_msg=f"sequence {b}")
        np.testing.assert_allclose(lse[:, qs], rl[0], rtol=1e-5, atol=1e-4)


def test_ragged_offsets_as_lists_and_without_max_seqlen(rng):
    q, k, v = rand(rng, (30, 2, 16)), rand(rng, (50, 2, 16)), rand(rng, (50, 2, 16))
    out = blasst.attention(q, k, v, cu_seqlens_q=[0, 10, 30], cu_seqlens_k=[0, 20, 50])
    ref0 = oracle.attention(q[None, :10], k[None, :20], v[None, :20])[0][0]
    ref1 = oracle.attention(q[None, 10:], k[None, 20:], v[None, 20:])[0][0]
    np.testing.assert_allclose(out, np.concatenate([ref0, ref1]), rtol=1e-4, atol=2e-5)


def test_dlpack_producer_other_than_numpy(rng):
    """Any CPU DLPack producer works; here a read-only memoryview-backed array subclass."""
    class Wrapped:
        def __init__(self, a):
            self.a = a
            self.shape = a.shape

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    q, k, v = rand(rng, (1, 12, 2, 16)), rand(rng, (1, 20, 2, 16)), rand(rng, (1, 20, 2, 16))
    out = blasst.attention(Wrapped(q), Wrapped(k), Wrapped(v))
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, oracle.attention(q, k, v)[0], rtol=1e-4, atol=2e-5)


def test_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import blasst, numpy as np; "
            "x = np.ones((1, 4, 1, 8), np.float32); print(blasst.attention(x, x, x).shape)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "(1, 4, 1, 8)" in res.stdout


def test_num_threads_setting(rng):
    q, k, v = rand(rng, (1, 70, 2, 16)), rand(rng, (1, 140, 2, 16)), rand(rng, (1, 140, 2, 16))
    blasst.set_num_threads(1)
    try:
        one = blasst.attention(q, k, v)
    finally:
        blasst.set_num_threads(0)
    np.testing.assert_allclose(one, blasst.attention(q, k, v), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="num_threads"):
        blasst.set_num_threads(-1)
