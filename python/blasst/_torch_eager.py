"""The eager calls of blasst.attention and blasst.decode with torch tensors: the common case, on a
short path (issue 18: host overhead per call).

blasst._calls serves every framework through its adapters (blasst._frameworks); that generality
costs tens of microseconds per call, more than the kernels at decode sizes. Here q, k, v (and
the index tensors) are torch tensors: outputs come from empty_like / new_empty, DLPack capsules from
torch's C exporter, the current stream from torch's raw-stream query, and nothing else is done
in Python that C++ checks anyway. The semantics are those of blasst._calls: the same arguments
reach _core.attention / _core.decode in the same form, and a call this path does not take
(statistics, other frameworks, index arrays given as Python sequences, wrong ranks: their
messages live in blasst._calls) returns None so the caller runs the generic path; so do calls with
seed_max (blasst._api sends them to blasst._calls directly).
"""
from __future__ import annotations

import torch

from . import _calls
from ._calls import DECODE_MAX_Q_LEN

_core = _calls._core
_Tensor = torch.Tensor
_to_dlpack = torch._C._to_dlpack
_f32 = torch.float32
_settings = _calls._settings
_effective_skip = _calls._effective_skip

if torch.cuda.is_available():
    _raw_stream = torch._C._cuda_getCurrentRawStream
    _current_device = torch._C._cuda_getDevice
else:  # a build of torch without CUDA: CUDA tensors cannot exist
    _raw_stream = _current_device = None


def _export(x):
    # A capsule without __dlpack__'s stream handshake (blasst._frameworks explains why); detach
    # only when needed (to_dlpack refuses tensors that require grad).
    return _to_dlpack(x.detach() if x.requires_grad else x)


def _opt_export(x):
    return None if x is None else _export(x)


def _is_index(x) -> bool:
    return x is None or isinstance(x, _Tensor)


def _plain_length(n) -> bool:
    """None or an int >= 0 (not a bool): what the generic path would pass on unchanged."""
    return n is None or (type(n) is int and n >= 0)


def _outputs(q, qs, vs, ragged: bool, return_lse: bool):
    """(out, lse or None) of a call, uninitialised, shaped as blasst._calls.attention_shapes says
    (decode: ragged False). out is empty_like(q) when it has q's shape (dv == d) and q is
    contiguous, the common case and the cheaper allocation call; without lse the shapes are then
    not computed at all."""
    like_q = vs[-1] == qs[-1] and q.is_contiguous()
    if like_q and not return_lse:
        return torch.empty_like(q), None
    out_shape, lse_shape = _calls.attention_shapes(qs, vs, ragged)
    out = torch.empty_like(q) if like_q else q.new_empty(out_shape)
    return out, (q.new_empty(lse_shape, dtype=_f32) if return_lse else None)


def _run(entry, switch, out, lse, *args):
    """entry(*args) (a _core call) on device `switch` when it is not the current one; the result."""
    if switch is None:
        entry(*args)
    else:
        with torch.cuda.device(switch):
            entry(*args)
    return out if lse is None else (out, lse)


def _stream_and_device(q):
    """(stream, device to switch to or None) for q's device: the caller's current stream there."""
    if not q.is_cuda:
        return 0, None
    dev = q.get_device()
    return _raw_stream(dev), (None if dev == _current_device() else dev)


def attention(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, return_lse):
    """blasst.attention's eager call, or None when the generic path must take it."""
    if not (isinstance(k, _Tensor) and isinstance(v, _Tensor) and _is_index(cu_seqlens_q)
            and _is_index(cu_seqlens_k)):
        return None
    ragged = cu_seqlens_q is not None or cu_seqlens_k is not None
    qs, vs = q.shape, v.shape
    if len(qs) != (3 if ragged else 4) or len(vs) != len(qs):
        return None
    if not (_plain_length(max_seqlen_q) and _plain_length(max_seqlen_k)):
        return None  # the generic path's checks and messages
    cfg = None if skip is None else _effective_skip(skip)[0]
    out, lse = _outputs(q, qs, vs, ragged, return_lse)
    stream, switch = _stream_and_device(q)
    return _run(_core.attention, switch, out, lse,
                _export(q), _export(k), _export(v), _to_dlpack(out),
                None if lse is None else _to_dlpack(lse), _opt_export(cu_seqlens_q),
                _opt_export(cu_seqlens_k), max_seqlen_q or 0, max_seqlen_k or 0, bool(causal),
                _calls.opt_scale(scale), cfg, stream, None, False, False,
                _settings["num_threads"])


def decode(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
           return_lse):
    """blasst.decode's eager call, or None when the generic path must take it."""
    if not (isinstance(k_cache, _Tensor) and isinstance(v_cache, _Tensor) and _is_index(page_table)
            and _is_index(seqlens)):
        return None
    qs, vs = q.shape, v_cache.shape
    if len(qs) != 4 or len(vs) != 4 or not 1 <= qs[1] <= DECODE_MAX_Q_LEN:
        return None
    if not _plain_length(max_seqlen_k):
        return None
    cfg = None if skip is None else _effective_skip(skip)[0]
    out, lse = _outputs(q, qs, vs, False, return_lse)  # decode_shapes
    stream, switch = _stream_and_device(q)
    return _run(_core.decode, switch, out, lse,
                _export(q), _export(k_cache), _export(v_cache), _to_dlpack(out),
                None if lse is None else _to_dlpack(lse), _opt_export(page_table),
                _opt_export(seqlens), max_seqlen_k or 0, bool(causal),
                _calls.opt_scale(scale), cfg, stream, None, False, False,
                _settings["num_threads"])
