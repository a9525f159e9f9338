"""blasst.decode on numpy inputs: contiguous and paged KV caches against the float64 oracle."""
import numpy as np
import pytest

import blasst
import oracle


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("q_len", [1, 4])
def test_contiguous_cache_with_lengths(rng, q_len):
    B, Lmax, Hq, Hk, d = 3, 300, 8, 2, 64
    q = rand(rng, (B, q_len, Hq, d))
    kc, vc = rand(rng, (B, Lmax, Hk, d)), rand(rng, (B, Lmax, Hk, d))
    lens = np.array([300, 17, 129], np.int32)
    # poison the unused part of the cache: it must not be read
    for b, n in enumerate(lens):
        kc[b, n:] = np.nan
        vc[b, n:] = np.nan
    out, lse = blasst.decode(q, kc, vc, seqlens=lens, max_seqlen_k=int(lens.max()),
                             return_lse=True)
    assert out.shape == (B, q_len, Hq, d) and lse.shape == (B, Hq, q_len)
    assert np.isfinite(out).all()
    for b, n in enumerate(lens):
        ro, rl = oracle.attention(q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], causal=True)
        np.testing.assert_allclose(out[b], ro[0], rtol=1e-4, atol=2e-5, err_msg=f"sequence {b}")
        np.testing.assert_allclose(lse[b], rl[0], rtol=1e-5, atol=1e-4)


def test_full_cache_without_lengths(rng):
    q = rand(rng, (2, 1, 4, 32))
    kc, vc = rand(rng, (2, 200, 4, 32)), rand(rng, (2, 200, 4, 16))
    out = blasst.decode(q, kc, vc)
    np.testing.assert_allclose(out, oracle.attention(q, kc, vc, causal=True)[0], rtol=1e-4,
                               atol=2e-5)


@pytest.mark.parametrize("q_len,page_size", [(1, 64), (3, 16)])
def test_paged_cache(rng, q_len, page_size):
    B, Hq, Hk, d, dv = 3, 4, 2, 32, 32
    lens = np.array([200, 1, 77], np.int32)
    pages_per_seq = -(-int(lens.max()) // page_size)
    num_pages = B * pages_per_seq + 3
    kp = rand(rng, (num_pages, page_size, Hk, d))
    vp = rand(rng, (num_pages, page_size, Hk, dv))
    perm = rng.permutation(num_pages).astype(np.int32)  # pages scattered through the pool
    table = perm[: B * pages_per_seq].reshape(B, pages_per_seq)
    q = rand(rng, (B, q_len, Hq, d))
    out = blasst.decode(q, kp, vp, page_table=table, seqlens=lens, max_seqlen_k=int(lens.max()))
    for b in range(B):
        n = int(lens[b])
        keys = np.concatenate([kp[p] for p in table[b]])[:n]
        vals = np.concatenate([vp[p] for p in table[b]])[:n]
        ro, _ = oracle.attention(q[b:b + 1], keys[None], vals[None], causal=True)
        np.testing.assert_allclose(out[b], ro[0], rtol=1e-4, atol=2e-5, err_msg=f"sequence {b}")


def test_page_table_with_row_stride(rng):
    """A page table that is a column slice of a wider table (row stride != width)."""
    page_size, Hk, d = 16, 1, 16
    kp, vp = rand(rng, (8, page_size, Hk, d)), rand(rng, (8, page_size, Hk, d))
    wide = np.array([[3, 5, 0, 0, 0], [7, 1, 0, 0, 0]], np.int32)
    table = wide[:, :2]
    assert not table.flags.c_contiguous
    lens = np.array([20, 32], np.int32)
    q = rand(rng, (2, 1, 2, d))
    out = blasst.decode(q, kp, vp, page_table=table, seqlens=lens)
    for b in range(2):
        keys = np.concatenate([kp[p] for p in table[b]])[: lens[b]]
        vals = np.concatenate([vp[p] for p in table[b]])[: lens[b]]
        ro, _ = oracle.attention(q[b:b + 1], keys[None], vals[None], causal=True)
        np.testing.assert_allclose(out[b], ro[0], rtol=1e-4, atol=2e-5)


def test_decode_f16(rng):
    q = rand(rng, (2, 1, 4, 64), np.float16)
    kc, vc = rand(rng, (2, 150, 4, 64), np.float16), rand(rng, (2, 150, 4, 64), np.float16)
    out = blasst.decode(q, kc, vc)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), oracle.attention(q, kc, vc, causal=True)[0],
                               atol=2e-3, rtol=2e-3)


def test_q_len_8_is_the_largest_decode(rng):
    """docs/python.md: blasst.decode takes q_len <= 8. q_len = 8 runs (and matches the oracle);
    q_len = 9 and q_len = 0 are errors naming q_len (blasst.attention serves longer queries)."""
    kc, vc = rand(rng, (1, 100, 2, 16)), rand(rng, (1, 100, 2, 16))
    q8 = rand(rng, (1, 8, 4, 16))
    out = blasst.decode(q8, kc, vc)
    np.testing.assert_allclose(out, oracle.attention(q8, kc, vc, causal=True)[0], rtol=1e-4,
                               atol=2e-5)
    for q_len in (9, 0):
        q = rand(rng, (1, q_len, 4, 16))
        with pytest.raises(ValueError, match=rf"^q_len: .* got q_len = {q_len}; use "
                                             r"blasst\.attention"):
            blasst.decode(q, kc, vc)


def test_decode_under_autograd_is_a_clear_error():
    """blasst.decode has no gradient: while autograd records a call whose input requires grad it
    refuses (a detached result would be a silently wrong gradient); under torch.no_grad(), or on
    detached tensors, the same call runs and equals the call without requires_grad."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 1, 4, 32, generator=g)
    k, v = (torch.randn(1, 200, 2, 32, generator=g) for _ in range(2))
    want = blasst.decode(q, k, v)
    qg = q.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="blasst.decode is not differentiable"):
        blasst.decode(qg, k, v)
    with pytest.raises(ValueError, match="not differentiable"):
        blasst.decode(q, k.clone().requires_grad_(True), v)
    with torch.no_grad():
        assert torch.equal(blasst.decode(qg, k, v), want)
    assert torch.equal(blasst.decode(qg.detach(), k, v), want)
