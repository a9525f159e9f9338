"""blasst.DecodePlan (plan once, run per step) against blasst.decode on the same arguments.

CPU tensors: every run is the reference's decode of the planned problem, so the results are equal
to the element. GPU: the planned launch is run()'s (same kernel, split layout and scratch
carving), so the outputs are equal to the element too; the runs follow cache writes and longer
lengths, and a run captured into a CUDA graph replays correctly. Skips with a reason when torch
(or, for the GPU tests, a GPU) is missing.
"""

import pytest

import blasst
from torch_helpers import assert_same

torch = pytest.importorskip(
    "torch", reason="torch is not installed here: the torch paths run on the GPU machine "
                    "(scripts/device_python.sh)")

pytestmark = pytest.mark.torch

def skip_of(kind):
    """The tests' skip configurations by name, made per test: module-level ones outlive nanobind's
    module at the interpreter's exit, which reports their SkipConfig as leaked."""
    if kind == "dense":
        return None
    if kind == "threshold":
        return blasst.SkipSoftmax(threshold=0.05)
    assert kind == "explicit_max_first"
    return blasst.SkipSoftmax(threshold=0.05, order="max_first")


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def caches(gen, paged, dtype=torch.float32, d=32):
    """q, k, v and the decode extras of a call whose queries share a vector with each sequence's
    first key (a sink, so skip_of("threshold") skips), contiguous or paged."""
    u = randn(gen, d)
    q = (randn(gen, 2, 1, 4, d) + 1.5 * u).to(dtype)
    if paged:
        k, v = randn(gen, 6, 64, 2, d), randn(gen, 6, 64, 2, d)
        k[4, 0] = k[2, 0] = 1.5 * u
        extra = dict(page_table=torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32),
                     seqlens=torch.tensor([150, 129], dtype=torch.int32), max_seqlen_k=192)
    else:
        k, v = randn(gen, 2, 400, 2, d), randn(gen, 2, 400, 2, d)
        k[:, 0] = 1.5 * u
        extra = dict(seqlens=torch.tensor([300, 257], dtype=torch.int32), max_seqlen_k=400)
    return q, k.to(dtype), v.to(dtype), extra, u


def steps(gen, q, k, extra, u):
    """Three decode steps' queries, each after a token written into the caches and the lengths
    raised by one (within max_seqlen_k)."""
    for _ in range(3):
        yield (randn(gen, *q.shape) + 1.5 * u).to(q.dtype).to(q.device)
        lens = extra["seqlens"]
        lens += 1
        assert int(lens.max()) <= extra["max_seqlen_k"]


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("skip_kind", ["dense", "threshold"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_cpu_runs_equal_decode(gen, paged, skip_kind, return_lse):
    skip = skip_of(skip_kind)
    q, k, v, extra, u = caches(gen, paged)
    plan = blasst.DecodePlan(q, k, v, skip=skip, return_lse=return_lse, **extra)
    for qs in steps(gen, q, k, extra, u):
        got = plan.run(qs)
        want = blasst.decode(qs, k, v, skip=skip, return_lse=return_lse, **extra)
        assert_same(got, want)
    st = blasst.SkipStats()
    blasst.decode(q, k, v, skip=skip_of("threshold"), stats=st, **extra)
    assert st.total_skipped > 0  # the skip plans above really skip


def test_cpu_out_and_lse_given(gen):
    q, k, v, extra, _ = caches(gen, False)
    plan = blasst.DecodePlan(q, k, v, return_lse=True, **extra)
    out, lse = torch.full_like(q, float("nan")), torch.full((2, 4, 1), float("nan"))
    got = plan.run(q, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert_same(got, blasst.decode(q, k, v, return_lse=True, **extra))


@pytest.mark.parametrize("case, match", [
    ("shape", "q: the plan was made for shape"),
    ("dtype", "q: the plan was made for shape"),
    ("strides", "q: the plan was made for shape"),
    ("out", "out: expected shape"),
    ("lse", "lse: the plan was made without return_lse"),
])
def test_runs_that_do_not_match_the_plan_are_refused(gen, case, match):
    q, k, v, extra, _ = caches(gen, False)
    plan = blasst.DecodePlan(q, k, v, **extra)
    kw = {}
    if case == "shape":
        qs = torch.cat([q, q], dim=1)
    elif case == "dtype":
        qs = q.double()
    elif case == "strides":
        qs = torch.empty(2, 1, 4, 64)[..., :32]  # the same values in rows 64 elements apart
        qs.copy_(q)
    else:
        qs = q
        if case == "out":
            kw["out"] = torch.empty(2, 1, 4, 16)
        else:
            kw["lse"] = torch.empty(2, 4, 1)
    with pytest.raises(ValueError, match=match):
        plan.run(qs, **kw)


def test_run_refuses_what_it_cannot_take(gen):
    q, k, v, extra, _ = caches(gen, False)
    plan = blasst.DecodePlan(q, k, v, **extra)
    with pytest.raises(TypeError, match=r"^q: DecodePlan.run takes a torch tensor, got ndarray"):
        plan.run(q.numpy())
    with pytest.raises(ValueError, match=r"^out: expected shape"):
        plan.run(q, out=q.numpy())
    # no gradient flows through a run: like blasst.decode, it refuses to record one silently
    with pytest.raises(ValueError, match=r"^DecodePlan.run is not differentiable"):
        plan.run(q.clone().requires_grad_())
    with torch.no_grad():
        assert_same(plan.run(q.clone().requires_grad_()), plan.run(q))


def test_bad_plans_get_the_decode_messages(gen):
    q, k, v, extra, _ = caches(gen, False)
    with pytest.raises(ValueError, match="q_len"):
        blasst.DecodePlan(torch.zeros(2, 9, 4, 32), k, v, **extra)
    with pytest.raises(TypeError, match="torch tensors"):
        blasst.DecodePlan(q.numpy(), k, v, **extra)
    with pytest.raises(Exception, match="v_cache"):
        blasst.DecodePlan(q, k, v[:, :, :1].contiguous(), **extra)  # Hk 1 against k_cache's 2


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("skip_kind", ["dense", "threshold", "explicit_max_first"])
def test_gpu_runs_equal_decode(gen, cuda, paged, skip_kind):
    skip = skip_of(skip_kind)
    q, k, v, extra, u = caches(gen, paged, dtype=torch.bfloat16, d=128)
    q, k, v = q.to(cuda), k.to(cuda), v.to(cuda)  # u stays on the host (steps moves its queries)
    extra = {n: (x.to(cuda) if isinstance(x, torch.Tensor) else x) for n, x in extra.items()}
    plan = blasst.DecodePlan(q, k, v, skip=skip, return_lse=True, **extra)
    for qs in steps(gen, q, k, extra, u):
        k[0, 5] = v[0, 5] = 0.5  # a cache write between runs (contents are read at every run)
        got = plan.run(qs)
        want = blasst.decode(qs, k, v, skip=skip, return_lse=True, **extra)
        torch.cuda.synchronize()
        assert_same(got, want)


def test_gpu_run_in_a_cuda_graph(gen, cuda):
    q, k, v, extra, u = caches(gen, False, dtype=torch.bfloat16, d=128)
    q, k, v = q.to(cuda), k.to(cuda), v.to(cuda)
    extra = {n: (x.to(cuda) if isinstance(x, torch.Tensor) else x) for n, x in extra.items()}
    plan = blasst.DecodePlan(q, k, v, skip=skip_of("threshold"), **extra)
    static_q, static_out = q.clone(), torch.full_like(q, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(static_q, out=static_out)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(static_q, out=static_out)
    for _ in range(3):
        static_q.copy_((randn(gen, *q.shape) + 1.5 * u).to(q.dtype))
        static_out.fill_(float("nan"))
        g.replay()
        want = blasst.decode(static_q, k, v, skip=skip_of("threshold"), **extra)
        torch.cuda.synchronize()
        assert_same(static_out, want)
