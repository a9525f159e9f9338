"""torch.library custom ops blasst::attention and blasst::decode, with fake (meta) kernels so that
torch.compile traces through them without running them. Imported only when torch is in use.

The ops run the eager calls of blasst._calls. The SkipSoftmax settings travel as a string (a repr
of its primitive fields): op schemas take only primitive types. Timestep gating is read inside the
op, i.e. at run time, not at trace time.

blasst::attention is differentiable in q, k, v (torch.library.register_autograd, so torch.compile
still traces it): SPEC §9, the gradient of the kept-tiles function with the skip set held fixed.
When autograd records the call, the forward also records its skip set (the op's third output:
int32 words in blasst::skip_set_shape's layout, on q's device; empty when the skip test did not
run, i.e. dense or held off by timestep gating, which is so decided once, in the forward), and
the backward op blasst::attention_backward reads exactly that set (CPU tensors: the reference
backward in float64 accumulation; CUDA tensors: the sm_90a backward kernels).
"""
from __future__ import annotations

import ast
import atexit
import functools
from typing import Optional, Tuple

import torch

from . import _calls
from ._skip import SkipSoftmax, check_skip

_DENSE = ""


def skip_to_str(skip: Optional[SkipSoftmax]) -> str:
    check_skip(skip)
    return _DENSE if skip is None else skip._op_str


@functools.lru_cache(maxsize=256)
def skip_from_str(s: str) -> Optional[SkipSoftmax]:
    if not s:
        return None
    return SkipSoftmax.from_fields(ast.literal_eval(s))


# The cached settings hold C++ objects: released before the interpreter's shutdown (nanobind
# reports objects still alive at its own shutdown as leaks).
atexit.register(skip_from_str.cache_clear)


def _op_result(res, q, return_lse: bool):
    """Ops always return (out, lse); without return_lse, lse is an empty placeholder."""
    if return_lse:
        return res
    return res, q.new_empty((0,), dtype=torch.float32)


def _fake_result(q, out_shape, lse_shape, return_lse: bool):
    return (q.new_empty(out_shape),
            q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32))


@torch.library.custom_op("blasst::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
               max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: Optional[float],
               skip: str, return_lse: bool, record_skip_set: bool
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, skip_set): skip_set, when record_skip_set, the words the forward recorded
    (SPEC §9), empty when its skip test did not run; the backward reads them."""
    res = _calls.attention(q, k, v, causal, scale, skip_from_str(skip), cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q or None, max_seqlen_k or None,
                           return_lse, None, record_skip_set=record_skip_set)
    res, words = res if record_skip_set else (res, None)
    out, lse = _op_result(res, q, return_lse)
    if words is None:
        words = q.new_empty((0,), dtype=torch.int32)
    return out, lse, words


@_attention.register_fake
def _attention_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    scale, skip, return_lse, record_skip_set):
    out, lse = _fake_result(q, *_calls.attention_shapes(q.shape, v.shape,
                                                        cu_seqlens_q is not None), return_lse)
    # The number of words depends on the run-time gating and, ragged, on the offsets.
    n = torch.library.get_ctx().new_dynamic_size() if record_skip_set else 0
    return out, lse, q.new_empty((n,), dtype=torch.int32)


@torch.library.custom_op("blasst::attention_backward", mutates_args=())
def _attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: Optional[torch.Tensor],
                        dlse: Optional[torch.Tensor],
                        cu_seqlens_q: Optional[torch.Tensor],
                        cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int,
                        max_seqlen_k: int, causal: bool, scale: Optional[float],
                        skip: str, skip_set: torch.Tensor
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of blasst::attention (SPEC §9). skip, skip_set: the forward's settings and the
    skip set it recorded (empty: its skip test did not run, the backward is dense; read at run
    time: no data-dependent branch in a traced backward). lse: the forward's (None: not
    computed, the backward computes it). dlse: the gradient flowing into the returned lse, or
    None. The forward's float32 LSE is used for float32/16 tensors; for float64 tensors the
    backward computes the LSE over kept keys in float64 instead (a float32 LSE would cap the
    gradient at float32 precision)."""
    return backward_into(dout, q, k, v, out, None if lse is None or q.dtype == torch.float64 else lse,
                         dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                         scale, skip, skip_set)


def backward_into(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, causal, scale, skip, skip_set):
    """The backward call itself: lse is used as given (None: computed over kept keys in float64).
    The op above drops the forward's float32 LSE for float64 tensors; a ring's chunk (blasst.
    diffusers context parallelism) passes the LSE merged over every chunk, which it cannot
    recompute, whatever the dtype."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ex = _calls.torch_export
    recorded = skip and skip_set.numel() > 0
    _calls._core.attention_backward(
        ex(q), ex(k), ex(v), ex(out), ex(dout.contiguous()), None if lse is None else ex(lse),
        # dlse: float64 for the reference, float32 for the kernels (their limit).
        None if dlse is None else ex(dlse.to(torch.float32 if q.is_cuda else torch.float64)
                                     .contiguous()), ex(dq), ex(dk), ex(dv),
        ex(cu_seqlens_q), ex(cu_seqlens_k), max_seqlen_q, max_seqlen_k, causal, scale,
        skip_from_str(skip)._cfg if recorded else None, ex(skip_set) if recorded else None,
        _calls.Frame(q).stream(), _calls._settings["num_threads"])
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, causal, scale, skip, skip_set):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, skip, \
        return_lse, _ = inputs
    out, lse, skip_set = output
    ctx.save_for_backward(q, k, v, out, lse, skip_set, cu_seqlens_q, cu_seqlens_k)
    ctx.args = (max_seqlen_q, max_seqlen_k, causal, scale, skip, return_lse)


def _attention_grad(ctx, grad_out, grad_lse, grad_skip_set):
    q, k, v, out, lse, skip_set, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, causal, scale, skip, return_lse = ctx.args
    # The lse placeholder of a call without return_lse carries no gradient.
    dlse = grad_lse if return_lse and grad_lse is not None and grad_lse.numel() else None
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.blasst.attention_backward(
        grad_out, q, k, v, out, lse if return_lse else None, dlse, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, causal, scale, skip, skip_set)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("blasst::attention", _attention_grad,
                                setup_context=_attention_setup_context)


@torch.library.custom_op("blasst::decode", mutates_args=())
def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            page_table: Optional[torch.Tensor], seqlens: Optional[torch.Tensor],
            max_seqlen_k: int, skip: str, scale: Optional[float], causal: bool,
            return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    res = _calls.decode(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k or None,
                        skip_from_str(skip), scale, causal, return_lse, None)
    return _op_result(res, q, return_lse)


@_decode.register_fake
def _decode_fake(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
                 return_lse):
    return _fake_result(q, *_calls.decode_shapes(q.shape, v_cache.shape), return_lse)


def _as_tensor(x, name):
    if x is None or isinstance(x, torch.Tensor):
        return x
    raise ValueError(f"{name}: inside torch.compile pass an int32 torch tensor on q's device")


def attention_op(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, return_lse):
    # A gradient needs the LSE: the op computes it whenever autograd records the call.
    wants_grad = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v))
    out, lse, _ = torch.ops.blasst.attention(
        q, k, v, _as_tensor(cu_seqlens_q, "cu_seqlens_q"), _as_tensor(cu_seqlens_k, "cu_seqlens_k"),
        _calls._opt_int("max_seqlen_q", max_seqlen_q),
        _calls._opt_int("max_seqlen_k", max_seqlen_k), bool(causal), _calls.opt_scale(scale),
        skip_to_str(skip), bool(return_lse) or wants_grad, wants_grad)
    return (out, lse) if return_lse else out


def decode_op(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
              return_lse):
    out, lse = torch.ops.blasst.decode(
        q, k_cache, v_cache, _as_tensor(page_table, "page_table"), _as_tensor(seqlens, "seqlens"),
        _calls._opt_int("max_seqlen_k", max_seqlen_k), skip_to_str(skip), _calls.opt_scale(scale),
        bool(causal), bool(return_lse))
    return (out, lse) if return_lse else out
