"""torch.library custom ops blasst::attention and blasst::decode, with fake (meta) kernels so that
torch.compile traces through them without running them. Imported only when torch is in use.

The ops run the eager calls of blasst._calls. The SkipSoftmax settings travel as a string (a repr
of its primitive fields): op schemas take only primitive types. Timestep gating is read inside the
op, i.e. at run time, not at trace time.
"""
from __future__ import annotations

import ast
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
               skip: str, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    res = _calls.attention(q, k, v, causal, scale, skip_from_str(skip), cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q or None, max_seqlen_k or None, return_lse,
                           None)
    return _op_result(res, q, return_lse)


@_attention.register_fake
def _attention_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    scale, skip, return_lse):
    return _fake_result(q, *_calls.attention_shapes(q.shape, v.shape, cu_seqlens_q is not None),
                        return_lse)


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
    out, lse = torch.ops.blasst.attention(
        q, k, v, _as_tensor(cu_seqlens_q, "cu_seqlens_q"), _as_tensor(cu_seqlens_k, "cu_seqlens_k"),
        int(max_seqlen_q or 0), int(max_seqlen_k or 0), bool(causal), _calls.opt_scale(scale),
        skip_to_str(skip), bool(return_lse))
    return (out, lse) if return_lse else out


def decode_op(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
              return_lse):
    out, lse = torch.ops.blasst.decode(
        q, k_cache, v_cache, _as_tensor(page_table, "page_table"), _as_tensor(seqlens, "seqlens"),
        int(max_seqlen_k or 0), skip_to_str(skip), _calls.opt_scale(scale), bool(causal),
        bool(return_lse))
    return (out, lse) if return_lse else out
