"""SPEC §9 backward through torch autograd on CPU tensors: blasst.attention is differentiable in q,
k, v. Dense: torch.autograd.gradcheck in float64. Skipping: the gradient equals autograd through a
float64 masked softmax whose block mask is the forward's own skip set (rebuilt from its recorded
deltas). Also GQA, causal, torch.compile(fullgraph=True) and the CUDA error."""
import math

import numpy as np
import pytest

import blasst

torch = pytest.importorskip("torch", reason="torch is not installed here")
import blasst._torch_ops  # noqa: E402,F401 - torch.ops.blasst.* and skip_to_str below, whatever ran before


def randn(gen, *shape, sd=1.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * sd).requires_grad_(True)


def masked_attention(q, k, v, causal, keep=None):
    """float64 softmax attention written from SPEC §1; keep [B, Hq, Lq, Lk] bool: the block mask."""
    B, Lq, Hq, d = q.shape
    Lk, Hk = k.shape[1], k.shape[2]
    g = Hq // Hk
    kk = k.repeat_interleave(g, dim=2)
    vv = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bihc,bjhc->bhij", q, kk) / math.sqrt(d)
    vis = torch.ones(Lq, Lk, dtype=torch.bool)
    if causal:
        vis = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
    mask = vis[None, None].expand(B, Hq, Lq, Lk)
    if keep is not None:
        mask = mask & keep
    s = s.masked_fill(~mask, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: 0
    return torch.einsum("bhij,bjhc->bihc", p, vv)


def skip_set_from_deltas(deltas, lam, B, Hq, Lq, Lk, rows, tile, causal):
    """keep [B, Hq, Lq, Lk] from the forward's recorded deltas: natural order, one head per vote
    group, so they come in the order (sequence, head, row block, tile 0..n_vis-1)."""
    keep = torch.ones(B, Hq, Lq, Lk, dtype=torch.bool)
    n_tiles = -(-Lk // tile)
    it = iter(np.asarray(deltas, dtype=np.float32))
    skipped = 0
    for b in range(B):
        for h in range(Hq):
            for r0 in range(0, Lq, rows):
                r1 = min(r0 + rows, Lq)
                last = min(Lk - 1, r1 - 1 + Lk - Lq) if causal else Lk - 1
                n_vis = last // tile + 1 if last >= 0 else 0
                for t in range(min(n_vis, n_tiles)):
                    if float(next(it)) < math.log(lam):
                        keep[b, h, r0:r1, t * tile:(t + 1) * tile] = False
                        skipped += 1
    assert next(it, None) is None, "deltas left over: the layout assumption is wrong"
    return keep, skipped


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_dense_gqa(gen, causal):
    q, k, v = randn(gen, 1, 5, 4, 4), randn(gen, 1, 7, 2, 4), randn(gen, 1, 7, 2, 3)
    assert torch.autograd.gradcheck(lambda q, k, v: blasst.attention(q, k, v, causal=causal),
                                    (q, k, v), eps=1e-6, atol=1e-7)


def test_gradcheck_with_skipping(gen):
    q, k, v = randn(gen, 1, 8, 2, 4, sd=2.0), randn(gen, 1, 12, 1, 4, sd=2.0), randn(gen, 1, 12, 1, 4)
    skip = blasst.SkipSoftmax(threshold=0.05, tile_keys=3, vote_rows=2, order="natural")
    st = blasst.SkipStats()
    blasst.attention(q.detach(), k.detach(), v.detach(), skip=skip, stats=st)
    assert st.total_skipped > 0
    # Kept-tiles function: piecewise smooth; the perturbations of gradcheck move no decision here.
    assert torch.autograd.gradcheck(lambda q, k, v: blasst.attention(q, k, v, skip=skip),
                                    (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("causal,Lq,Lk,Hq,Hk", [(True, 40, 40, 2, 1), (False, 33, 50, 4, 2),
                                                (True, 17, 60, 2, 2)])
def test_skip_gradient_is_masked_softmax_gradient(gen, causal, Lq, Lk, Hq, Hk):
    rows, tile, lam = 4, 8, 0.05
    q, k, v = randn(gen, 2, Lq, Hq, 8, sd=2.0), randn(gen, 2, Lk, Hk, 8, sd=2.0), randn(gen, 2, Lk, Hk, 8)
    skip = blasst.SkipSoftmax(threshold=lam, tile_keys=tile, vote_rows=rows, order="natural")
    st = blasst.SkipStats(record_deltas=True)
    with torch.no_grad():
        blasst.attention(q, k, v, causal=causal, skip=skip, stats=st)
    keep, skipped = skip_set_from_deltas(st._raw.deltas, lam, 2, Hq, Lq, Lk, rows, tile, causal)
    assert skipped == st.total_skipped > 0
    dout = torch.randn(2, Lq, Hq, 8, generator=gen, dtype=torch.float64)
    out = blasst.attention(q, k, v, causal=causal, skip=skip)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want_out = masked_attention(q, k, v, causal, keep)
    want = torch.autograd.grad(want_out, (q, k, v), dout)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"d{name}")
    # The dense gradient differs: the mask matters in this case.
    dense = torch.autograd.grad(masked_attention(q, k, v, causal), (q, k, v), dout)
    assert (got[0] - dense[0]).abs().max() > 1e-6


@pytest.mark.parametrize("with_skip", [False, True])
def test_gradient_through_lse(gen, with_skip):
    """return_lse=True in training: a loss reading lse gets dlse * P in dS (SPEC §9 with the LSE
    over kept keys)."""
    B, Lq, Lk, Hq, Hk, rows, tile, lam = 1, 40, 40, 2, 1, 4, 8, 0.1
    q, k, v = randn(gen, B, Lq, Hq, 8, sd=3.0), randn(gen, B, Lk, Hk, 8, sd=3.0), randn(gen, B, Lk, Hk, 8)
    skip = blasst.SkipSoftmax(threshold=lam, tile_keys=tile, vote_rows=rows, order="natural") if with_skip else None
    keep = None
    if with_skip:
        st = blasst.SkipStats(record_deltas=True)
        with torch.no_grad():
            blasst.attention(q, k, v, causal=True, skip=skip, stats=st)
        keep, skipped = skip_set_from_deltas(st._raw.deltas, lam, B, Hq, Lq, Lk, rows, tile, True)
        assert skipped > 0
    w = torch.randn(B, Hq, Lq, generator=gen, dtype=torch.float64)
    out, lse = blasst.attention(q, k, v, causal=True, skip=skip, return_lse=True)
    got = torch.autograd.grad((out ** 2).sum() + (lse * w).sum(), (q, k, v))
    # The reference LSE: logsumexp over the visible keys of the kept tiles.
    d = q.shape[-1]
    s = torch.einsum("bihc,bjhc->bhij", q, k.repeat_interleave(Hq // Hk, dim=2)) / math.sqrt(d)
    mask = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
    mask = mask[None, None].expand(B, Hq, Lq, Lk) & (keep if keep is not None else True)
    want_lse = torch.logsumexp(s.masked_fill(~mask, -math.inf), dim=-1)
    want_out = masked_attention(q, k, v, True, keep)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-6)  # lse is float32
    # The returned lse is float32, so the gradient flowing into it is w rounded to float32.
    want = torch.autograd.grad((want_out ** 2).sum() + (want_lse.float() * w).sum(), (q, k, v))
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"d{name}")


def test_gating_is_decided_at_the_forward(gen):
    """A forward that timestep gating held dense has the dense gradient, even when the published
    step changes before the backward."""
    q, k, v = randn(gen, 1, 24, 1, 8, sd=3.0), randn(gen, 1, 24, 1, 8, sd=3.0), randn(gen, 1, 24, 1, 8)
    skip = blasst.SkipSoftmax(threshold=0.1, tile_keys=4, vote_rows=4, disabled_until_timestep=0.5, order="natural")
    st = blasst.SkipStats()
    with torch.no_grad():
        blasst.attention(q, k, v, causal=True, skip=skip, stats=st)  # no step published: dense
    assert st.total_skipped == 0
    blasst.diffusion.record_sigma(0.9)  # t = 0.9 > D = 0.5: gated, dense
    out = blasst.attention(q, k, v, causal=True, skip=skip)
    blasst.diffusion.record_sigma(0.1)  # now skipping would run
    with torch.no_grad():
        st = blasst.SkipStats()
        blasst.attention(q, k, v, causal=True, skip=skip, stats=st)
    assert st.total_skipped > 0, "the case must skip once gating lets it"
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(masked_attention(q, k, v, True).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_float32_gradient_close_to_float64(gen):
    q, k, v = (randn(gen, 1, 30, 2, 16), randn(gen, 1, 30, 1, 16), randn(gen, 1, 30, 1, 16))
    q32, k32, v32 = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    blasst.attention(q32, k32, v32, causal=True).sum().backward()
    masked_attention(q, k, v, True).sum().backward()
    for a, b in ((q32, q), (k32, k), (v32, v)):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5)


def test_torch_compile_fullgraph_backward(gen):
    q, k, v = randn(gen, 1, 20, 2, 8), randn(gen, 1, 20, 1, 8), randn(gen, 1, 20, 1, 8)
    skip = blasst.SkipSoftmax(threshold=0.05, tile_keys=4, vote_rows=4, order="natural")

    def f(q, k, v):
        return (blasst.attention(q * 2.0, k, v, skip=skip, causal=True) ** 2).sum()

    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v),
                              (q, k, v))
    want = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_stats_with_autograd_is_a_clear_error(gen):
    q = randn(gen, 1, 4, 1, 8)
    with pytest.raises(ValueError, match="stats: not available while autograd records"):
        blasst.attention(q, q, q, stats={})


def _gpu_or_skip():
    if not (torch.cuda.is_available() and blasst.cuda_available()):
        pytest.skip("GPU test: needs a CUDA device and blasst built with the kernels")


def _keep_from_words(words, B, Hq, Lq, Lk, rows=64, tile=128):
    """keep [B, Hq, Lq, Lk] bool from skip-set words (SPEC §9 layout)."""
    groups, tiles = -(-Lq // rows), -(-Lk // tile)
    n = B * Hq * groups * tiles
    w = words.cpu().to(torch.int64) & 0xFFFFFFFF
    bits = ((w[:, None] >> torch.arange(32)[None, :]) & 1).reshape(-1)[:n].bool()
    skipped = bits.reshape(B, Hq, groups, tiles)
    keep = ~skipped.repeat_interleave(rows, dim=2)[:, :, :Lq].repeat_interleave(tile, dim=3)[..., :Lk]
    return keep, int(bits.sum())


@pytest.mark.gpu
@pytest.mark.parametrize("causal,Lq,Lk,Hq,Hk,d", [(True, 1000, 1000, 4, 2, 64),
                                                  (False, 300, 700, 2, 1, 128),
                                                  (True, 257, 1290, 4, 4, 128)])
@pytest.mark.parametrize("with_skip", [False, True])
def test_cuda_gradient_matches_the_reference_backward(causal, Lq, Lk, Hq, Hk, d, with_skip):
    """A CUDA bf16 training step through blasst.attention (autograd, the sm_90a backward kernels)
    against the float64 reference backward on the same values: the same recorded skip set (the
    CUDA forward's words, SPEC §9) and the kernel's own bf16 O, so D = rowsum(dO * O) is the same
    on both sides (an oracle with the exact O differs by bf16 rounding of O times |k|, which a
    strong sink amplifies past any relative bound: the first H200 run, a0106a0). The reference
    backward itself is checked against autograd through a masked softmax above."""
    _gpu_or_skip()
    g = torch.Generator(device="cuda").manual_seed(4321 + Lq + d)
    B = 2
    q = torch.randn(B, Lq, Hq, d, device="cuda", generator=g)
    k = torch.randn(B, Lk, Hk, d, device="cuda", generator=g)
    if with_skip:  # a sink of 15 nats in every row: the later tiles fall below it (skipped)
        q[..., 0] = 3.0
        k[:, 0, :, 0] = 40.0 * math.sqrt(d / 64)
    v = torch.randn(B, Lk, Hk, d, device="cuda", generator=g)
    q, k, v = (x.bfloat16().requires_grad_(True) for x in (q, k, v))
    dout = torch.randn(B, Lq, Hq, d, device="cuda", generator=g).bfloat16()
    skip = blasst.SkipSoftmax(threshold=1e-3) if with_skip else None
    s = blasst._torch_ops.skip_to_str(skip)
    with torch.no_grad():
        out, lse, words = torch.ops.blasst.attention(q, k, v, None, None, 0, 0, causal, None, s,
                                                     True, True)
    if with_skip:
        _, nskip = _keep_from_words(words, B, Hq, Lq, Lk)
        total = B * Hq * -(-Lq // 64) * -(-Lk // 128)
        assert 0 < nskip < total, f"the case must skip some pairs, not all ({nskip} of {total})"
    else:
        assert words.numel() == 0
    # Autograd through blasst.attention (records its own set: the same inputs give the same set).
    got = torch.autograd.grad(blasst.attention(q, k, v, causal=causal, skip=skip), (q, k, v), dout)
    ex = [x.detach().double().cpu() for x in (dout, q, k, v, out)]
    want = torch.ops.blasst.attention_backward(*ex, None, None, None, None, 0, 0, causal, None, s,
                                               words.cpu())
    for name, a, b, other in zip("qkv", got, want, (ex[2], ex[1], None)):
        a = a.double().cpu()
        assert torch.isfinite(a).all(), f"d{name}: not finite"
        err = (a - b).abs().max().item()
        # bf16 P and dS in the tensor-core products, bf16 outputs (u = 2^-8): a few u of the
        # largest entry, plus float32 sums where the gradient cancels (SPEC §8 style floor).
        floor = d * 2.0 ** -24 * d ** -0.5 * ex[0].abs().max().item() * ex[3].abs().max().item() * (
            other.abs().max().item() if other is not None else 1.0)
        assert err <= 8 * 2.0 ** -8 * b.abs().max().item() + floor, \
            f"d{name}: max error {err:.3g}, max |want| {b.abs().max().item():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("Hq,Hk,d", [(32, 8, 128), (16, 16, 64)])
def test_cuda_causal_gradient_over_several_launch_sections(Hq, Hk, d):
    """The causal backward launches its CTAs longest key block first over sections of KV heads
    (src/cuda/sm90/backward/backward_params.hpp: at most about 32768 128 x 128 tiles of work per
    section). At L = 8192 both cases take several sections (GQA 32/8: 4 of 2 heads; MHA 16: 2 of
    8): every (key block, KV head) must still be computed once. Oracle: torch's math SDPA in
    float32 on the same bf16 values, its autograd gradient (no skipping here)."""
    _gpu_or_skip()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    L, g = 8192, torch.Generator(device="cuda").manual_seed(8192 + Hq + d)
    per_head = (Hq // Hk) * (L // 128) * (L // 128 + 1) // 2  # tiles of work per KV head
    assert per_head * Hk > 32768, "the case must not fit one section"
    q, k, v, dout = (torch.randn(1, L, h, d, device="cuda", generator=g).bfloat16()
                     for h in (Hq, Hk, Hk, Hq))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    got = torch.autograd.grad(blasst.attention(q, k, v, causal=True), (q, k, v), dout)
    ref = [x.detach().float().transpose(1, 2).requires_grad_(True) for x in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        o = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=Hq != Hk)
    want = torch.autograd.grad(o, ref, dout.float().transpose(1, 2))
    for name, a, b in zip("qkv", got, want):
        a, b = a.float(), b.transpose(1, 2)
        assert torch.isfinite(a).all(), f"d{name}: not finite"
        err = (a - b).abs().amax(dim=(0, 1, 3))  # per head: a head left out or done twice fails alone
        scale = b.abs().amax(dim=(0, 1, 3))
        assert (err <= 8 * 2.0 ** -8 * scale).all(), \
            f"d{name}: worst head {int((err / scale).argmax())}, error {(err / scale).max().item():.3g} of its max"


def test_ragged_gradient_equals_each_sequence(gen):
    """A ragged batch (cu_seqlens) with skipping: each sequence's gradient is the one it gets
    alone."""
    lens = [(9, 20), (1, 3), (16, 16)]
    skip = blasst.SkipSoftmax(threshold=0.1, tile_keys=4, vote_rows=4, order="natural")
    qs = [randn(gen, lq, 2, 8, sd=3.0) for lq, _ in lens]
    ks = [randn(gen, lk, 1, 8, sd=3.0) for _, lk in lens]
    vs = [randn(gen, lk, 1, 8) for _, lk in lens]
    cq = torch.tensor([0, 9, 10, 26], dtype=torch.int32)
    ck = torch.tensor([0, 20, 23, 39], dtype=torch.int32)
    q, k, v = (torch.cat(x).detach().requires_grad_(True) for x in (qs, ks, vs))
    st = blasst.SkipStats()
    with torch.no_grad():
        blasst.attention(q, k, v, causal=True, skip=skip, cu_seqlens_q=cq, cu_seqlens_k=ck, stats=st)
    assert st.total_skipped > 0, "the case must skip something"
    out = blasst.attention(q, k, v, causal=True, skip=skip, cu_seqlens_q=cq, cu_seqlens_k=ck)
    got = torch.autograd.grad((out ** 2).sum(), (q, k, v))
    for b in range(3):
        o = blasst.attention(qs[b][None], ks[b][None], vs[b][None], causal=True, skip=skip)
        want = torch.autograd.grad((o ** 2).sum(), (qs[b], ks[b], vs[b]))
        torch.testing.assert_close(got[0][cq[b]:cq[b + 1]], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1][ck[b]:ck[b + 1]], want[1], rtol=0, atol=0)
        torch.testing.assert_close(got[2][ck[b]:ck[b + 1]], want[2], rtol=0, atol=0)


def _bits(words, n):
    """The first n bits of int32 words (little-endian within each word) as a bool tensor."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    bits = (w[:, None] >> torch.arange(32)[None, :]) & 1
    return bits.reshape(-1)[:n].bool()


def test_forward_records_the_skip_set_it_used(gen):
    """The op's third output under autograd (SPEC §9): the skip set as 32-bit words, bit
    ((b * Hq + h) * groups + g) * tiles + t, equal to the pairs the forward's statistics say it
    skipped (from its recorded deltas); no bit past the last pair."""
    B, Lq, Lk, Hq, Hk, rows, tile, lam = 2, 33, 50, 4, 2, 4, 8, 0.05
    q, k, v = randn(gen, B, Lq, Hq, 8, sd=2.0), randn(gen, B, Lk, Hk, 8, sd=2.0), randn(gen, B, Lk, Hk, 8)
    skip = blasst.SkipSoftmax(threshold=lam, tile_keys=tile, vote_rows=rows, order="natural")
    st = blasst.SkipStats(record_deltas=True)
    with torch.no_grad():
        blasst.attention(q, k, v, skip=skip, stats=st)
    keep, skipped = skip_set_from_deltas(st._raw.deltas, lam, B, Hq, Lq, Lk, rows, tile, False)
    assert skipped > 0
    _, _, words = torch.ops.blasst.attention(q, k, v, None, None, 0, 0, False, None,
                                             blasst._torch_ops.skip_to_str(skip), True, True)
    groups, tiles = -(-Lq // rows), -(-Lk // tile)
    n = B * Hq * groups * tiles
    assert words.dtype == torch.int32 and words.numel() == -(-n // 32)
    bits = _bits(words, words.numel() * 32)
    assert not bits[n:].any(), "bits past the last pair"
    want = ~keep[:, :, ::rows, ::tile]  # one entry per (b, h, group, tile)
    assert want.shape == (B, Hq, groups, tiles)
    assert torch.equal(bits[:n].reshape(B, Hq, groups, tiles), want)
    assert int(bits.sum()) == skipped
    # Dense, or not recording: an empty set.
    for s, rec in ((None, True), (skip, False)):
        _, _, w = torch.ops.blasst.attention(q, k, v, None, None, 0, 0, False, None,
                                             blasst._torch_ops.skip_to_str(s), True, rec)
        assert w.numel() == 0


@pytest.mark.gpu
def test_cuda_forward_records_its_skip_set():
    """On the GPU the prefill kernel records the set (64 rows x 1 head x 128 keys): as many bits
    as its statistics count skipped pairs."""
    if not (torch.cuda.is_available() and blasst.cuda_available()):
        pytest.skip("GPU test: needs a CUDA device and blasst built with the kernels")
    g = torch.Generator(device="cuda").manual_seed(1234)
    B, L, H, d = 2, 1000, 4, 64
    q = torch.randn(B, L, H, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, L, H, d, device="cuda", generator=g)
    k[:, 0] += 8.0  # a sink: later tiles fall below it
    q = (q.float() + 1.0).bfloat16()
    k, v = k.bfloat16(), torch.randn(B, L, H, d, device="cuda", generator=g).bfloat16()
    skip = blasst.SkipSoftmax(threshold=1e-2, order="natural")
    st = blasst.SkipStats()
    blasst.attention(q, k, v, causal=True, skip=skip, stats=st)
    assert st.total_skipped > 0, "the case must skip"
    _, _, words = torch.ops.blasst.attention(q, k, v, None, None, 0, 0, True, None,
                                             blasst._torch_ops.skip_to_str(skip), True, True)
    groups, tiles = -(-L // 64), -(-L // 128)
    n = B * H * groups * tiles
    assert words.is_cuda and words.numel() == -(-n // 32)
    bits = _bits(words.cpu(), words.numel() * 32)
    assert not bits[n:].any()
    assert int(bits.sum()) == st.total_skipped
