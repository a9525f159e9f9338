"""torch paths: CPU tensors through the reference, the custom ops (opcheck, torch.compile), and on
a GPU the sm_90a kernels against the reference, CUDA-graph capture and torch.compile with inductor.

Skips with a reason when torch (or a GPU) is missing; scripts/device_python.sh runs everything on
the GPU machine with BLASST_REQUIRE_GPU=1, which turns the GPU skips into failures.
"""
import math

import numpy as np
import pytest

import blasst
import oracle

torch = pytest.importorskip(
    "torch", reason="torch is not installed here: the torch paths run on the GPU machine "
                    "(scripts/device_python.sh)")

pytestmark = pytest.mark.torch


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def ref_np(x):
    return x.detach().float().cpu().numpy()


# ---- CPU tensors (reference engine) ---------------------------------------------------------

def test_cpu_tensors_f32(gen):
    q, k, v = randn(gen, 2, 50, 4, 32), randn(gen, 2, 130, 2, 32), randn(gen, 2, 130, 2, 16)
    out, lse = blasst.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device.type == "cpu"
    ro, rl = oracle.attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(lse.numpy(), rl, rtol=1e-5, atol=1e-4)


def test_cpu_tensors_bf16_and_transposed_views(gen):
    # the transformers layout [B, H, L, d], handed over as a permuted view
    qh = randn(gen, 1, 4, 70, 64, dtype=torch.bfloat16)
    kh = randn(gen, 1, 2, 90, 64, dtype=torch.bfloat16)
    vh = randn(gen, 1, 2, 90, 64, dtype=torch.bfloat16)
    q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))
    assert not q.is_contiguous()
    out = blasst.attention(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 70, 4, 64)
    ro, _ = oracle.attention(ref_np(q), ref_np(k), ref_np(v), causal=True)
    np.testing.assert_allclose(ref_np(out), ro, atol=2e-2, rtol=2e-2)


def test_cpu_decode_paged(gen):
    pool_k, pool_v = randn(gen, 6, 16, 2, 32), randn(gen, 6, 16, 2, 32)
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    lens = torch.tensor([40, 33], dtype=torch.int32)
    q = randn(gen, 2, 1, 4, 32)
    out = blasst.decode(q, pool_k, pool_v, page_table=table, seqlens=lens, max_seqlen_k=40)
    for b in range(2):
        keys = torch.cat([pool_k[p] for p in table[b]])[: lens[b]]
        vals = torch.cat([pool_v[p] for p in table[b]])[: lens[b]]
        ro, _ = oracle.attention(q[b:b + 1].numpy(), keys[None].numpy(), vals[None].numpy(),
                                 causal=True)
        np.testing.assert_allclose(out[b].numpy(), ro[0], rtol=1e-4, atol=2e-5)


def test_cpu_int64_offsets_rejected_clearly(gen):
    q = randn(gen, 10, 2, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected an int32 array, got int64"):
        blasst.attention(q, q, q, cu_seqlens_q=torch.tensor([0, 10]),
                         cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32))


def test_custom_ops_opcheck(gen):
    q, k, v = randn(gen, 1, 20, 4, 16), randn(gen, 1, 40, 2, 16), randn(gen, 1, 40, 2, 16)
    torch.library.opcheck(torch.ops.blasst.attention.default,
                          (q, k, v, None, None, 0, 0, True, None, "", True, False))
    skip = blasst._torch_ops.skip_to_str(blasst.SkipSoftmax(threshold=1e-3, order="natural"))
    torch.library.opcheck(torch.ops.blasst.attention.default,
                          (q, k, v, None, None, 0, 0, False, 0.3, skip, False, False))
    # Recording the skip set (SPEC §9): the third output's length is known only at run time.
    torch.library.opcheck(torch.ops.blasst.attention.default,
                          (q, k, v, None, None, 0, 0, False, 0.3, skip, True, True))
    qd = randn(gen, 2, 1, 4, 16)
    kc, vc = randn(gen, 2, 64, 2, 16), randn(gen, 2, 64, 2, 16)
    torch.library.opcheck(torch.ops.blasst.decode.default,
                          (qd, kc, vc, None, torch.tensor([64, 10], dtype=torch.int32), 64, "",
                           None, True, True))


def test_torch_compile_cpu_fullgraph(gen):
    q, k, v = randn(gen, 1, 64, 2, 32), randn(gen, 1, 300, 2, 32), randn(gen, 1, 300, 2, 32)
    skip = blasst.SkipSoftmax(threshold=1e-3, order="natural")

    def f(q, k, v):
        out, lse = blasst.attention(q * 2.0, k, v, skip=skip, return_lse=True)
        return out + 1.0, lse

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    want = f(q, k, v)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_stats_inside_compile_is_an_error(gen):
    q = randn(gen, 1, 8, 1, 16)

    def f(q):
        return blasst.attention(q, q, q, stats={})

    torch._dynamo.reset()
    # dynamo re-raises it as its own error; the message carries blasst's
    with pytest.raises(Exception, match=r"stats: not available inside torch\.compile"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(q)


# ---- GPU (sm_90a kernels) -------------------------------------------------------------------

def cpu_reference(q, k, v, **kw):
    """The blasst reference on float32 copies of the same (rounded) inputs."""
    return blasst.attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_prefill_matches_reference(cuda, gen, dtype, causal, d):
    B, Lq, Lk, Hq, Hk = 2, 333, 1000, 8, 2
    q = randn(gen, B, Lq, Hq, d, dtype=dtype)
    k = randn(gen, B, Lk, Hk, d, dtype=dtype)
    v = randn(gen, B, Lk, Hk, d, dtype=dtype)
    out, lse = blasst.attention(q.to(cuda), k.to(cuda), v.to(cuda), causal=causal,
                                return_lse=True)
    assert out.device.type == "cuda" and out.dtype == dtype
    ro, rl = cpu_reference(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(out.float().cpu(), ro, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu(), rl, atol=2e-3, rtol=1e-3)


@pytest.mark.gpu
def test_gpu_prefill_ragged_without_sync(cuda, gen):
    q_lens, k_lens = [100, 1, 700], [100, 300, 700]
    cu_q = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(k_lens)), dtype=torch.int32)
    q = randn(gen, int(cu_q[-1]), 4, 128, dtype=torch.bfloat16)
    k = randn(gen, int(cu_k[-1]), 4, 128, dtype=torch.bfloat16)
    v = randn(gen, int(cu_k[-1]), 4, 128, dtype=torch.bfloat16)
    out = blasst.attention(q.to(cuda), k.to(cuda), v.to(cuda), causal=True,
                           cu_seqlens_q=cu_q.to(cuda), cu_seqlens_k=cu_k.to(cuda),
                           max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens))
    ro = cpu_reference(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    torch.testing.assert_close(out.float().cpu(), ro, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64])
def test_gpu_decode_paged_matches_reference(cuda, gen, page_size):
    B, Hq, Hk, d = 3, 16, 2, 128
    lens = torch.tensor([1000, 3, 513], dtype=torch.int32)
    pages = -(-int(lens.max()) // page_size)
    num_pages = B * pages + 5
    kp = randn(gen, num_pages, page_size, Hk, d, dtype=torch.bfloat16)
    vp = randn(gen, num_pages, page_size, Hk, d, dtype=torch.bfloat16)
    table = torch.randperm(num_pages, generator=gen)[: B * pages].reshape(B, pages).int()
    q = randn(gen, B, 1, Hq, d, dtype=torch.bfloat16)
    out = blasst.decode(q.to(cuda), kp.to(cuda), vp.to(cuda), page_table=table.to(cuda),
                        seqlens=lens.to(cuda), max_seqlen_k=int(lens.max()))
    ro = blasst.decode(q.float(), kp.float(), vp.float(), page_table=table, seqlens=lens)
    torch.testing.assert_close(out.float().cpu(), ro, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_decode_max_first_is_seeded_and_matches_reference(cuda, gen):
    """order="max_first" in decode runs seeded split-KV (SPEC §2a): the statistics report the
    order and the split layout, and the reference with that layout skips the same tiles."""
    B, L, Hq, Hk, d = 1, 9000, 8, 2, 128
    k = randn(gen, B, L, Hk, d) * 0.3
    k[:, 0, :, 0] = 8.0 * math.sqrt(d)  # a sink key every query meets first
    q = randn(gen, B, 1, Hq, d) * 0.3
    q[..., 0] = 1.0
    v = randn(gen, B, L, Hk, d)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    skip = blasst.SkipSoftmax(threshold=1e-3, order="max_first")
    st = {}
    out = blasst.decode(q.to(cuda), k.to(cuda), v.to(cuda), skip=skip, stats=st)
    g = st["granularity"]
    assert g["order"] == "max_first" and g["split_tiles"] > 0 and g["heads"] == Hq // Hk, g
    assert st["sparsity"] > 0.5, st  # seeded splits skip past the sink in every split
    ref_skip = blasst.SkipSoftmax(threshold=1e-3, order="max_first", vote_rows=1,
                                  vote_heads=Hq // Hk, split_tiles=g["split_tiles"])
    rs = {}
    ro = blasst.decode(q.float(), k.float(), v.float(), skip=ref_skip, stats=rs)
    assert abs(st["skipped"] - rs["skipped"]) <= 1 + 0.01 * rs["visited"], (st, rs)
    assert st["visited"] == rs["visited"]
    torch.testing.assert_close(out.float().cpu(), ro, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_skip_reports_sparsity_and_stays_close(cuda, gen):
    """A structured input (a dominant first key tile): the kernel skips and stays within the
    SPEC §2 error bound of the dense result."""
    B, L, H, d = 1, 2048, 4, 128
    q = torch.zeros(B, L, H, d)
    q[..., 0] = 1.0
    k = randn(gen, B, L, H, d) * 0.1
    k[..., 0] = 0.0
    k[:, :128, :, 0] = 12.0 * math.sqrt(d)
    v = randn(gen, B, L, H, d)
    q, k, v = (t.to(torch.bfloat16).to(cuda) for t in (q, k, v))
    stats = {}
    out = blasst.attention(q, k, v, skip=blasst.SkipSoftmax(threshold=1e-3, order="natural"), stats=stats)
    dense = blasst.attention(q, k, v)
    assert stats["visited"] > 0 and stats["sparsity"] > 0.5, stats
    assert stats["counted_at"]
    torch.testing.assert_close(out.float(), dense.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
def test_gpu_uses_the_current_stream(cuda, gen):
    q = randn(gen, 1, 512, 4, 128, dtype=torch.bfloat16).to(cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = blasst.attention(q, q, q, causal=True)
    side.synchronize()
    torch.testing.assert_close(out, blasst.attention(q, q, q, causal=True))


@pytest.mark.gpu
def test_gpu_eager_calls_are_ordered_on_the_current_stream(cuda, gen):
    """On a side stream, q/k/v get their values from a copy queued behind a long sleep; calls on
    that stream must see them. A call launched on any other stream would read the zeros before
    the copy (its output would be 0) - and with timing this long, it would."""
    src = randn(gen, 1, 512, 4, 128, dtype=torch.bfloat16).to(cuda)
    want = blasst.attention(src, src, src, causal=True, return_lse=True)
    want_dec = blasst.decode(src[:, :1], src, src, return_lse=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = torch.zeros_like(src)
        torch.cuda._sleep(100_000_000)  # tens of ms of GPU time on this stream
        x.copy_(src)
        got = blasst.attention(x, x, x, causal=True, return_lse=True)
        got_dec = blasst.decode(x[:, :1], x, x, return_lse=True)
    side.synchronize()
    for a, b in zip(got + got_dec, want + want_dec):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert want[0].abs().max() > 0.01  # the outputs the check relies on are not zeros


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay(cuda, gen):
    L, H, d = 700, 4, 128  # two sequences (300, 700) in one ragged batch
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device=cuda)
    sq = randn(gen, 1000, H, d, dtype=torch.bfloat16).to(cuda)
    sk = randn(gen, 1000, H, d, dtype=torch.bfloat16).to(cuda)
    sv = randn(gen, 1000, H, d, dtype=torch.bfloat16).to(cuda)
    skip = blasst.SkipSoftmax(threshold=1e-3, order="natural")

    def step():
        return blasst.attention(sq, sk, sv, causal=True, skip=skip, cu_seqlens_q=cu,
                                cu_seqlens_k=cu, max_seqlen_q=L, max_seqlen_k=L)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside capture (allocator, lazy init)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = step()
    # new inputs, same buffers: the replay must compute on them
    for t in (sq, sk, sv):
        t.copy_(randn(gen, *t.shape, dtype=torch.bfloat16).to(cuda))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, step())


@pytest.mark.gpu
def test_gpu_torch_compile_inductor(cuda, gen):
    q = randn(gen, 1, 512, 8, 64, dtype=torch.bfloat16).to(cuda)
    k = randn(gen, 1, 512, 2, 64, dtype=torch.bfloat16).to(cuda)
    v = randn(gen, 1, 512, 2, 64, dtype=torch.bfloat16).to(cuda)

    def f(q, k, v):
        return blasst.attention(torch.nn.functional.silu(q), k, v, causal=True) * 2

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(got, f(q, k, v))


@pytest.mark.gpu
def test_gpu_errors_name_the_argument(cuda, gen):
    q = randn(gen, 1, 64, 2, 48, dtype=torch.bfloat16).to(cuda)  # d = 48: no kernel
    with pytest.raises(ValueError, match=r"^q: head dimension d = 48 is not supported"):
        blasst.attention(q, q, q)
    q = randn(gen, 1, 64, 2, 64).to(cuda)  # float32 on the GPU
    with pytest.raises(ValueError, match=r"^q: dtype f32 is not supported"):
        blasst.attention(q, q, q)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: must be in the same memory"):
        qq = randn(gen, 64, 2, 64, dtype=torch.bfloat16).to(cuda)
        blasst.attention(qq, qq, qq, cu_seqlens_q=torch.tensor([0, 64], dtype=torch.int32),
                         cu_seqlens_k=torch.tensor([0, 64], dtype=torch.int32))


@pytest.mark.gpu
def test_gpu_cupy_arrays(cuda, gen):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    q = randn(gen, 1, 200, 4, 64, dtype=torch.float16)
    k = randn(gen, 1, 300, 2, 64, dtype=torch.float16)
    v = randn(gen, 1, 300, 2, 64, dtype=torch.float16)
    cq, ck, cv = (cupy.asarray(t.numpy()) for t in (q, k, v))
    out = blasst.attention(cq, ck, cv, causal=True)
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    cupy.cuda.get_current_stream().synchronize()
    ro = cpu_reference(q, k, v, causal=True)
    np.testing.assert_allclose(cupy.asnumpy(out).astype(np.float32), ro.numpy(), atol=2e-2, rtol=2e-2)
