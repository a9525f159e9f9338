"""blasst.attention / blasst.decode: the public entry points.

Eager calls run blasst._calls: any DLPack-capable tensors (torch, numpy, cupy) in the SPEC layout;
outputs are allocated by the input's own framework (torch.empty, numpy.empty, cupy.empty) and
filled by C++. Eager calls with torch tensors take the short path of blasst._torch_eager (same
arguments to C++, less Python per call); what it does not take goes to blasst._calls. CPU tensors run the reference engine, CUDA tensors the kernels on the caller's
current stream. While torch.compile traces a call with torch tensors, the call goes through the
custom ops of blasst._torch_ops instead, which run the same blasst._calls at run time; so does an
attention call that autograd records (its backward is registered on the op, SPEC §9).
"""
from __future__ import annotations

import sys
from typing import Any, MutableMapping, Optional, Union

from . import _calls
from ._skip import SkipSoftmax, SkipStats

_torch_ops = None  # blasst._torch_ops once torch is in use (registers the custom ops)
_torch_eager = None  # blasst._torch_eager, loaded with it: the short eager path of torch tensors
_Tensor = _is_compiling = _grad_enabled = None  # torch.Tensor and two queries, once torch is in use
_TENSOR_DISPATCH = None  # torch.Tensor's own __torch_dispatch__ (its function), once torch is in use


def _load_torch_ops():
    global _torch_ops, _torch_eager, _Tensor, _is_compiling, _grad_enabled, _TENSOR_DISPATCH
    if _torch_ops is None:
        from . import _torch_eager as eager
        from . import _torch_ops as ops
        torch = ops.torch
        _torch_eager = eager
        _Tensor, _is_compiling, _grad_enabled = (torch.Tensor, torch.compiler.is_compiling,
                                                 torch.is_grad_enabled)
        _TENSOR_DISPATCH = getattr(torch.Tensor.__torch_dispatch__, "__func__", None)
        _torch_ops = ops
    return _torch_ops


def _torch_route(q, k, v, differentiable: bool = True):
    """How a call with query q goes: None (not a torch tensor: blasst._calls), "op" (torch.compile
    traces the call: the custom op), "grad" (autograd records it: the custom op, whose backward is
    registered, SPEC §9; a call that is not differentiable, i.e. decode, raises instead) or "eager"
    (blasst._torch_eager). With torch imported, the first call loads the custom ops
    (torch.compile needs them registered before it traces)."""
    if _torch_ops is None:
        if sys.modules.get("torch") is None:
            return None
        _load_torch_ops()
    if not isinstance(q, _Tensor):
        return None
    if _is_compiling():
        return "op"
    if _grad_enabled() and (q.requires_grad or (isinstance(k, _Tensor) and k.requires_grad)
                            or (isinstance(v, _Tensor) and v.requires_grad)):
        if not differentiable:  # a result without a gradient would be silently wrong there
            raise ValueError("blasst.decode is not differentiable: autograd is recording and an "
                             "input requires grad; call it under torch.no_grad() (or on detached "
                             "tensors), or use blasst.attention, which is (SPEC §9)")
        return "grad"
    return "eager"


def _plain(x, name: str):
    """x as a tensor whose data pointer is its data. torch's AsyncCollectiveTensor (what the
    functional collectives return; diffusers' ring all-gathers K/V into one, and its chunks stay
    views of it) is waited on and unwrapped: a DLPack view of the wrapper itself points at no data
    (the reference read it and crashed). Other tensor subclasses with a dispatch of their own are
    refused by name; plain tensors and Parameters pass unchanged (one type check)."""
    cls = type(x)
    if cls is _Tensor or not isinstance(x, _Tensor) or \
            getattr(cls.__torch_dispatch__, "__func__", None) is _TENSOR_DISPATCH:
        return x
    fc = sys.modules.get("torch.distributed._functional_collectives")
    if fc is not None and isinstance(x, fc.AsyncCollectiveTensor):
        return x.wait()
    raise TypeError(f"{name}: a {cls.__name__} (a torch tensor subclass with its own dispatch) "
                    "cannot be read by blasst directly; pass a plain tensor (e.g. its local data)")


def _no_stats_when_compiling(stats, entry: str) -> None:
    if stats is not None:
        raise ValueError(f"stats: not available inside torch.compile; call {entry} eagerly to "
                         "collect statistics")


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
              skip: Optional[SkipSoftmax] = None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
              return_lse: bool = False,
              stats: Union[None, SkipStats, MutableMapping[str, Any]] = None,
              seed_max=None):
    """Skip-Softmax attention (SPEC §1-§3).

    q [B, Lq, Hq, d], k [B, Lk, Hk, d], v [B, Lk, Hk, dv] -> out [B, Lq, Hq, dv] (dtype of q),
    plus lse [B, Hq, Lq] (float32, natural log) with return_lse=True. Ragged batches: q [Tq, Hq, d],
    k/v [Tk, Hk, d], int32 cu_seqlens_q/cu_seqlens_k (batch + 1 offsets, same device as q);
    out [Tq, Hq, dv], lse [Hq, Tq]. For CUDA tensors give max_seqlen_q/max_seqlen_k with device
    offsets: the call then never synchronises (CUDA-graph capturable).

    causal: bottom-right aligned when Lq != Lk. skip: a blasst.SkipSoftmax (None: dense).
    stats: a dict (filled in place) or a blasst.SkipStats.
    seed_max: seeded maxima for a key chunk (SPEC §2a; ring context parallelism), lse's layout,
    float32 or float64, lse's units: each row's running max starts there (-inf: no seed); out and
    lse stay those of the kept keys. Eager, no autograd; CUDA tensors: float32 seeds (the prefill
    kernel's skip instances; docs/reference.md).
    """
    route = _torch_route(q, k, v)
    if seed_max is not None and (route == "op" or route == "grad"):
        raise ValueError("seed_max: not available inside torch.compile or while autograd records "
                         "the call (no backward for seeded maxima); call under torch.no_grad()")
    if route == "grad" and stats is not None:
        raise ValueError("stats: not available while autograd records the call; collect "
                         "statistics under torch.no_grad() or with detached tensors")
    if route == "op" or route == "grad":
        _no_stats_when_compiling(stats, "blasst.attention")
        return _torch_ops.attention_op(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, return_lse)
    if route == "eager":  # (plain tensors: three type checks, the short path's cost unchanged)
        if not (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor):
            q, k, v = _plain(q, "q"), _plain(k, "k"), _plain(v, "v")
        if seed_max is not None:
            seed_max = _plain(seed_max, "seed_max")
    if route == "eager" and stats is None and seed_max is None:
        res = _torch_eager.attention(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k,
                                     max_seqlen_q, max_seqlen_k, return_lse)
        if res is not None:
            return res
    return _calls.attention(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q, max_seqlen_k, return_lse, stats, seed_max=seed_max)


def decode(q, k_cache, v_cache, *, page_table=None, seqlens=None,
           max_seqlen_k: Optional[int] = None, skip: Optional[SkipSoftmax] = None,
           scale: Optional[float] = None, causal: bool = True, return_lse: bool = False,
           stats: Union[None, SkipStats, MutableMapping[str, Any]] = None):
    """Decode attention against a KV cache (SPEC §1 with q_len <= 8).

    q [B, q_len, Hq, d] with 1 <= q_len <= 8 (DECODE_MAX_Q_LEN; else a ValueError naming q_len).
    Contiguous cache: k_cache/v_cache [B, Lmax, Hk, d|dv], seqlens int32 [B]
    (None: every sequence holds Lmax keys). Paged cache: [num_pages, page_size, Hk, d|dv] with an
    int32 page_table [B, max_pages_per_seq] and seqlens. out [B, q_len, Hq, dv], lse [B, Hq, q_len].
    With q_len > 1 (speculative decoding) query i sees key j iff j <= i + Lk - q_len (causal=True).
    """
    route = _torch_route(q, k_cache, v_cache, differentiable=False)  # decode has no gradient
    if route == "op":
        _no_stats_when_compiling(stats, "blasst.decode")
        return _torch_ops.decode_op(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k,
                                    skip, scale, causal, return_lse)
    if route is not None and not (type(q) is _Tensor and type(k_cache) is _Tensor and
                                  type(v_cache) is _Tensor):
        q, k_cache, v_cache = _plain(q, "q"), _plain(k_cache, "k_cache"), _plain(v_cache, "v_cache")
    if route is not None and stats is None:  # eager
        res = _torch_eager.decode(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip,
                                  scale, causal, return_lse)
        if res is not None:
            return res
    return _calls.decode(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale,
                         causal, return_lse, stats)
