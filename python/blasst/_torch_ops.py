"""torch.library custom ops blasst::attention and blasst::decode, with fake (meta) kernels so that
torch.compile traces through them without running them. Imported only when torch is in use.

The SkipSoftmax settings travel as a string (a repr of its primitive fields): op schemas take only
primitive types. Timestep gating is read inside the op, i.e. at run time, not at trace time.
"""
from __future__ import annotations

import ast
import functools
from typing import Optional, Tuple

import torch

from . import _api
from ._skip import SkipSoftmax

_DENSE = ""


def skip_to_str(skip: Optional[SkipSoftmax]) -> str:
    if skip is None:
        return _DENSE
    if not isinstance(skip, SkipSoftmax):
        raise TypeError(f"skip: expected a blasst.SkipSoftmax (or None), got {type(skip).__name__}")
    return skip._op_str


@functools.lru_cache(maxsize=256)
def skip_from_str(s: str) -> Optional[SkipSoftmax]:
    if not s:
        return None
    return SkipSoftmax.from_fields(ast.literal_eval(s))


def _attn_shapes(q, v, ragged: bool):
    if ragged:
        return (q.shape[0], q.shape[1], v.shape[2]), (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), (q.shape[0], q.shape[2], q.shape[1])


@torch.library.custom_op("blasst::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
               max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: Optional[float],
               skip: str, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    res = _api._attention_impl(q, k, v, causal, scale, skip_from_str(skip), cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q or None, max_seqlen_k or None,
                               return_lse, None)
    if return_lse:
        return res
    return res, q.new_empty((0,), dtype=torch.float32)


@_attention.register_fake
def _attention_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    scale, skip, return_lse):
    out_shape, lse_shape = _attn_shapes(q, v, cu_seqlens_q is not None)
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("blasst::decode", mutates_args=())
def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            page_table: Optional[torch.Tensor], seqlens: Optional[torch.Tensor],
            max_seqlen_k: int, skip: str, scale: Optional[float], causal: bool,
            return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    res = _api._decode_impl(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k or None,
                            skip_from_str(skip), scale, causal, return_lse, None)
    if return_lse:
        return res
    return res, q.new_empty((0,), dtype=torch.float32)


@_decode.register_fake
def _decode_fake(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
                 return_lse):
    out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,),
                      dtype=torch.float32)
    return out, lse


def _as_tensor(x, q, name):
    if x is None or isinstance(x, torch.Tensor):
        return x
    raise ValueError(f"{name}: inside torch.compile pass an int32 torch tensor on q's device")


def attention_op(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, return_lse):
    out, lse = torch.ops.blasst.attention(
        q, k, v, _as_tensor(cu_seqlens_q, q, "cu_seqlens_q"),
        _as_tensor(cu_seqlens_k, q, "cu_seqlens_k"), int(max_seqlen_q or 0),
        int(max_seqlen_k or 0), bool(causal), None if scale is None else float(scale),
        skip_to_str(skip), bool(return_lse))
    return (out, lse) if return_lse else out


def decode_op(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
              return_lse):
    out, lse = torch.ops.blasst.decode(
        q, k_cache, v_cache, _as_tensor(page_table, q, "page_table"),
        _as_tensor(seqlens, q, "seqlens"), int(max_seqlen_k or 0), skip_to_str(skip),
        None if scale is None else float(scale), bool(causal), bool(return_lse))
    return (out, lse) if return_lse else out
