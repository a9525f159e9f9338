"""The short eager path of torch tensors (blasst._torch_eager) against the generic path
(blasst._calls, called directly with the same tensors): both hand C++ the same call, so the outputs
are equal bit for bit; and each call the short path must not take reaches the generic path, with
the generic path's messages. CPU tensors (the reference engine); the GPU side is in test_torch.py.
"""
import pytest

import blasst
from torch_helpers import assert_same
from blasst import _calls

torch = pytest.importorskip(
    "torch", reason="torch is not installed here: the torch paths run on the GPU machine "
                    "(scripts/device_python.sh)")

pytestmark = pytest.mark.torch

# The generic calls themselves (the fixture below replaces the module attributes by spies).
generic_attention, generic_decode = _calls.attention, _calls.decode


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20261202)


@pytest.fixture
def generic(monkeypatch):
    """Counts the calls that reach the generic path (they still run)."""
    seen = []
    for name in ("attention", "decode"):
        orig = getattr(_calls, name)

        def spy(*a, _orig=orig, _name=name, **kw):
            seen.append(_name)
            return _orig(*a, **kw)
        monkeypatch.setattr(_calls, name, spy)
    return seen


def randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def sink_inputs(gen, B=2, L=640, hq=4, hk=2, d=32, dtype=torch.float32):
    """Queries share a direction u and the first key is 1.5u: a sink a few nats above the other
    scores, so that later tiles skip at lambda 0.05 (sparsity ~0.65-0.8) while the other keys
    still move the output (mask and scale change it by > 0.1)."""
    u = randn(gen, d)
    q = randn(gen, B, L, hq, d) + 1.5 * u
    k = randn(gen, B, L, hk, d)
    v = randn(gen, B, L, hk, d)
    k[:, 0] = 1.5 * u
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.fixture
def skip05():
    """The tests' skip configuration, made per test: a module-level one outlives nanobind's module
    at the interpreter's exit, which reports its SkipConfig as leaked."""
    return blasst.SkipSoftmax(threshold=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_skip", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_attention_equals_the_generic_path(gen, generic, skip05, dtype, causal, with_skip,
                                           return_lse):
    skip = skip05 if with_skip else None
    q, k, v = sink_inputs(gen, dtype=dtype)
    got = blasst.attention(q, k, v, causal=causal, skip=skip, scale=0.2, return_lse=return_lse)
    assert generic == [], "the torch call went through the generic path"
    want = generic_attention(q, k, v, causal, 0.2, skip, None, None, None, None, return_lse, None)
    assert_same(got, want)
    if skip is not None:  # the case this exists for: something was skipped
        st = blasst.SkipStats()
        blasst.attention(q, k, v, causal=causal, skip=skip, scale=0.2, stats=st)
        assert st.total_skipped > 0


def test_attention_ragged_equals_the_generic_path(gen, generic, skip05):
    lens = [130, 300, 1]
    cu = torch.tensor([0, 130, 430, 431], dtype=torch.int32)
    q, k, v = randn(gen, 431, 4, 32), randn(gen, 431, 2, 32), randn(gen, 431, 2, 16)
    for max_q in (None, max(lens)):
        got = blasst.attention(q, k, v, causal=True, skip=skip05, cu_seqlens_q=cu, cu_seqlens_k=cu,
                               max_seqlen_q=max_q, max_seqlen_k=max_q, return_lse=True)
        want = generic_attention(q, k, v, True, None, skip05, cu, cu, max_q, max_q, True, None)
        assert_same(got, want)
        assert got[0].shape == (431, 4, 16) and got[1].shape == (4, 431)
    assert generic == []


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_decode_equals_the_generic_path(gen, generic, skip05, paged, return_lse):
    u = randn(gen, 32)
    q = randn(gen, 2, 3, 4, 32) + 1.5 * u  # queries share u; each sequence's first key is 1.5u
    if paged:
        k, v = randn(gen, 6, 64, 2, 32), randn(gen, 6, 64, 2, 32)
        k[4, 0] = k[2, 0] = 1.5 * u  # the first pages of sequences 0 and 1
        table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
        lens = torch.tensor([190, 129], dtype=torch.int32)
        extra = dict(page_table=table, seqlens=lens, max_seqlen_k=190)
        generic_args = (table, lens, 190)
    else:
        k, v = randn(gen, 2, 400, 2, 32), randn(gen, 2, 400, 2, 32)
        k[:, 0] = 1.5 * u
        extra, generic_args = {}, (None, None, None)
    for skip in (None, skip05):
        got = blasst.decode(q, k, v, skip=skip, return_lse=return_lse, **extra)
        want = generic_decode(q, k, v, *generic_args, skip, None, True, return_lse, None)
        assert_same(got, want)
    assert generic == []
    st = blasst.SkipStats()
    blasst.decode(q, k, v, skip=skip05, stats=st, **extra)
    assert st.total_skipped > 0  # the skip calls above really skipped


def test_tensors_that_require_grad_under_no_grad(gen, generic, skip05):
    q, k, v = (x.requires_grad_() for x in sink_inputs(gen))
    with torch.no_grad():
        got = blasst.attention(q, k, v, skip=skip05)
        dec = blasst.decode(q[:, :1], k, v)
    assert generic == [] and not got.requires_grad
    assert_same(got, generic_attention(q, k, v, False, None, skip05, None, None, None, None, False,
                                      None))
    assert_same(dec, generic_decode(q[:, :1], k, v, None, None, None, None, None, True, False, None))


def test_timestep_gating_is_read_per_call(gen, generic, skip05):
    q, k, v = sink_inputs(gen)
    gated = blasst.SkipSoftmax(threshold=0.05, disabled_until_timestep=0.5)
    dense = blasst.attention(q, k, v)
    skipped = blasst.attention(q, k, v, skip=skip05)
    assert not torch.equal(dense, skipped)  # the threshold skips something here
    try:
        blasst.diffusion.record_denoise_step(900, 1000)  # t = 0.9 > D: dense
        assert_same(blasst.attention(q, k, v, skip=gated), dense)
        blasst.diffusion.record_denoise_step(400, 1000)  # t = 0.4 <= D: skips
        assert_same(blasst.attention(q, k, v, skip=gated), skipped)
    finally:
        blasst.diffusion.reset()
    assert generic == []


def test_calls_it_does_not_take_reach_the_generic_path(gen, generic):
    q, k, v = sink_inputs(gen, B=1, L=200)
    blasst.attention(q, k, v, stats={})                     # statistics
    blasst.attention(q[0], k[0], v[0], cu_seqlens_q=[0, 200], cu_seqlens_k=[0, 200])  # lists
    blasst.decode(q[:, :1], k, v, seqlens=[200])            # a list of lengths
    blasst.decode(q[:, :1], k, v, stats=blasst.SkipStats())
    assert generic == ["attention", "attention", "decode", "decode"]


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v: blasst.attention(q[0, 0], k, v), r"q, v: expected q \[B, Lq, Hq, d\]"),
    (lambda q, k, v: blasst.attention(q, k.numpy(), v), r"k: a numpy tensor cannot be mixed"),
    (lambda q, k, v: blasst.attention(q[0], k[0], v[0], cu_seqlens_q=torch.tensor(
        [0, 64], dtype=torch.int32), cu_seqlens_k=torch.tensor([0, 64], dtype=torch.int32),
        max_seqlen_q=-1), r"max_seqlen_q: must be >= 0"),
    (lambda q, k, v: blasst.decode(q, k, v), r"q_len: blasst.decode takes 1 to 8"),
    (lambda q, k, v: blasst.decode(q[:, :1], k, v, max_seqlen_k=True),
     r"max_seqlen_k: expected an int"),
    (lambda q, k, v: blasst.decode(q[:, :1], k, v, max_seqlen_k=64.0),
     r"max_seqlen_k: expected an int, got 64.0"),
])
def test_bad_calls_get_the_generic_messages(gen, generic, call, match):
    q, k, v = sink_inputs(gen, B=1, L=64)
    with pytest.raises(ValueError, match=match):
        call(q, k, v)


@pytest.mark.parametrize("call", [
    lambda q, k, v: blasst.attention(q, k, v, scale="0.25"),
    lambda q, k, v: blasst.decode(q[:, :1], k, v, scale="0.25"),
    lambda q, k, v: blasst.DecodePlan(q[:, :1], k, v, scale="0.25"),
])
def test_a_string_scale_is_refused_on_the_fast_path(gen, call):
    q, k, v = sink_inputs(gen, B=1, L=64)
    with pytest.raises(TypeError, match=r"^scale: expected a number, got str '0.25'"):
        call(q, k, v)
    assert generic != []  # the message came from the generic path


class _Wrapping(torch.Tensor):
    """A wrapper subclass (no storage of its own) with a dispatch that unwraps: its data pointer
    is not its data, which a DLPack view would read."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                   strides=elem.stride(), device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.elem if isinstance(x, _Wrapping) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def test_tensor_subclasses_with_their_own_dispatch_are_refused(gen):
    q, k, v = sink_inputs(gen, B=1, L=64)
    for call, name in ((lambda w: blasst.attention(w, k, v), "q"),
                       (lambda w: blasst.attention(q, k, w), "v"),
                       (lambda w: blasst.decode(q[:, :1], w, v), "k_cache")):
        with pytest.raises(TypeError, match=f"{name}: a _Wrapping \\(a torch tensor subclass"):
            call(_Wrapping(k if name != "q" else q))
    # a Parameter (a plain subclass with storage) is read as before
    out = blasst.attention(torch.nn.Parameter(q, requires_grad=False), k, v)
    assert torch.equal(out, blasst.attention(q, k, v))


def test_async_collective_tensors_are_waited_on(gen):
    """What torch's functional collectives return (diffusers' ring all-gathers K/V into one; its
    chunks stay views of it): the same result as the plain tensor."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    q, k, v = sink_inputs(gen, B=1, L=64)
    buf = AsyncCollectiveTensor(torch.cat([k.flatten(), v.flatten()]))
    kk, vv = buf[:k.numel()].view(k.shape), buf[k.numel():].view(v.shape)
    assert type(kk) is AsyncCollectiveTensor
    assert torch.equal(blasst.attention(q, kk, vv), blasst.attention(q, k, v))
