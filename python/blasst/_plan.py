"""blasst.DecodePlan: blasst.decode planned once for a batch shape, run per step (issue 18).

An eager blasst.decode call validates its arguments, resolves the skip settings, chooses the
kernel and split layout and builds the caches' tensor maps every time; at decode sizes that host
work costs more than the kernel. A plan does it once, for the caches, page table and lengths it is
made with (FlashInfer's plan / run): run(q) then checks q against the plan in Python and launches.
The planned buffers keep their addresses; their contents may change between runs (a token written
into the caches, seqlens raised up to max_seqlen_k). Runs of one plan share its scratch memory:
order them on one stream (the current one at each run), or make a plan per stream.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from . import _calls, _torch_eager
from ._calls import DECODE_MAX_Q_LEN
from ._skip import SkipSoftmax

_core = _calls._core
_f32 = torch.float32


def _meta(x):
    """What a run's tensor must share with the plan's: shape, strides, dtype and device."""
    return (tuple(x.shape), x.stride(), x.dtype, x.device)


class DecodePlan:
    """blasst.decode(q, k_cache, v_cache, ...) planned once; plan.run(q) for each step.

    The arguments are blasst.decode's, with q an example of the queries to come (its shape,
    dtype, strides and device are the plan's; its values are not used). k_cache, v_cache,
    page_table and seqlens are held by the plan and read at every run. max_seqlen_k bounds the
    lengths of every later run (default: the cache's length, or for a paged cache pages per
    sequence x page size). No statistics (use blasst.decode with stats for them).
    """

    def __init__(self, q, k_cache, v_cache, *, page_table=None, seqlens=None,
                 max_seqlen_k: Optional[int] = None, skip: Optional[SkipSoftmax] = None,
                 scale: Optional[float] = None, causal: bool = True, return_lse: bool = False):
        for name, x, optional in (("q", q, False), ("k_cache", k_cache, False), ("v_cache", v_cache, False),
                                  ("page_table", page_table, True), ("seqlens", seqlens, True)):
            if not (isinstance(x, torch.Tensor) or (optional and x is None)):
                raise TypeError(f"{name}: DecodePlan takes torch tensors, got {type(x).__name__}")
        if q.dim() != 4 or not 1 <= q.shape[1] <= DECODE_MAX_Q_LEN:
            raise ValueError(f"q: expected [B, q_len, Hq, d] with 1 <= q_len <= {DECODE_MAX_Q_LEN}, "
                             f"got shape {tuple(q.shape)}")
        if max_seqlen_k is None:
            if page_table is not None:
                max_seqlen_k = int(page_table.shape[1]) * int(k_cache.shape[1])
            else:
                max_seqlen_k = int(k_cache.shape[1])
        max_seqlen_k = _calls._opt_int("max_seqlen_k", max_seqlen_k)
        self._qs, self._vs = tuple(q.shape), tuple(v_cache.shape)
        self._return_lse = bool(return_lse)
        self._q_meta = _meta(q)
        out, lse = _torch_eager._outputs(q, self._qs, self._vs, False, self._return_lse)  # decode's outputs
        self._out_meta = _meta(out)
        self._lse_meta = None if lse is None else _meta(lse)
        cfg = None if skip is None else _calls._effective_skip(skip)[0]
        self._keep = (k_cache, v_cache, page_table, seqlens)  # the plan reads them at every run
        export, opt_export = _torch_eager._export, _torch_eager._opt_export
        args = (export(q), export(k_cache), export(v_cache), export(out), opt_export(lse),
                opt_export(page_table), opt_export(seqlens), max_seqlen_k, bool(causal),
                _calls.opt_scale(scale), cfg)
        switch = _torch_eager._stream_and_device(q)[1]  # the plan is made on q's device
        with contextlib.nullcontext() if switch is None else torch.cuda.device(switch):
            self._plan = _core.DecodePlan(*args, num_threads=_calls._settings["num_threads"])

    def run(self, q, out=None, lse=None):
        """Attention of q against the planned caches: out (and lse with return_lse), as
        blasst.decode returns them. out / lse: tensors to write (the plan's shapes, dtypes and
        strides), else new ones."""
        try:
            meta = _meta(q)
        except AttributeError:
            raise TypeError(f"q: DecodePlan.run takes a torch tensor, got {type(q).__name__}") from None
        if q.requires_grad and torch.is_grad_enabled():  # as blasst.decode: no silent lack of gradient
            raise ValueError("DecodePlan.run is not differentiable: autograd is recording and q requires "
                             "grad; run it under torch.no_grad() (or on a detached q)")
        if meta != self._q_meta:
            raise ValueError(f"q: the plan was made for shape {self._q_meta[0]}, strides "
                             f"{self._q_meta[1]}, {self._q_meta[2]} on {self._q_meta[3]}; got shape "
                             f"{meta[0]}, strides {meta[1]}, {meta[2]} on {meta[3]}")
        if out is None:
            out = _torch_eager._outputs(q, self._qs, self._vs, False, False)[0]
        elif not isinstance(out, torch.Tensor) or _meta(out) != self._out_meta:
            raise ValueError(f"out: expected shape {self._out_meta[0]}, strides {self._out_meta[1]}, "
                             f"{self._out_meta[2]} on {self._out_meta[3]}")
        if self._return_lse:
            if lse is None:
                lse = q.new_empty(self._lse_meta[0], dtype=_f32)
            elif not isinstance(lse, torch.Tensor) or _meta(lse) != self._lse_meta:
                raise ValueError(f"lse: expected shape {self._lse_meta[0]}, strides {self._lse_meta[1]}, "
                                 f"{self._lse_meta[2]} on {self._lse_meta[3]}")
        elif lse is not None:
            raise ValueError("lse: the plan was made without return_lse")
        stream, switch = _torch_eager._stream_and_device(q)
        return _torch_eager._run(self._plan.run, switch, out, lse, q.data_ptr(), out.data_ptr(),
                                 0 if lse is None else lse.data_ptr(), stream)
