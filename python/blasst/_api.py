"""blasst.attention / blasst.decode: framework-agnostic entry points over the C++ core.

Inputs are any DLPack-capable tensors (torch, numpy, cupy) in the SPEC layout; outputs are
allocated by the input's own framework (torch.empty, numpy.empty, cupy.empty) and filled by C++.
CPU tensors run the reference engine, CUDA tensors the kernels on the caller's current stream.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, MutableMapping, Optional, Tuple, Union

from . import _core
from . import diffusion as _diffusion
from ._skip import SkipSoftmax, SkipStats

_settings = {"num_threads": 0}

# blasst.decode serves decode steps: 1 to 8 query tokens per sequence (speculative decoding).
# The CPU reference would compute more, the CUDA decode kernel takes g * q_len <= 64 rows; longer
# queries belong to blasst.attention(causal=True), which computes the same function.
DECODE_MAX_Q_LEN = 8


def set_num_threads(n: int) -> None:
    """Threads of the CPU reference engine (0 = all cores)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"num_threads: must be an int >= 0, got {n!r}")
    _settings["num_threads"] = n


def _framework(x) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("numpy"):
        return "numpy"
    if mod.startswith("cupy"):
        return "cupy"
    return "other"


# -- per-framework helpers -------------------------------------------------------------------

def _torch_export(t):
    # A DLPack capsule made without __dlpack__'s stream handshake: that handshake records an
    # event on the current stream and makes the default stream wait on it, which breaks CUDA
    # graph capture. The kernels run on the current stream anyway.
    import torch.utils.dlpack as tdl
    return tdl.to_dlpack(t.detach())


def _is_cuda(x, fw: str) -> bool:
    if fw == "torch":
        return x.is_cuda
    if fw == "cupy":
        return True
    return False


def _stream_of(x, fw: str) -> int:
    if fw == "torch" and x.is_cuda:
        import torch
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    if fw == "cupy":
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


class _Frame:
    """Allocation and export for the framework of the query tensor."""

    __slots__ = ("fw", "like", "cuda")

    def __init__(self, q):
        fw = _framework(q)
        if fw == "other":
            if not hasattr(q, "__dlpack__"):
                raise TypeError(f"q: expected a torch/numpy/cupy tensor or a DLPack-capable array, "
                                f"got {type(q).__name__}")
            import numpy as np
            try:
                q = np.from_dlpack(q)  # zero-copy view of CPU memory
            except Exception as e:  # noqa: BLE001 - report what the producer said
                raise TypeError(f"q: {type(q).__name__} is not a CPU DLPack array; pass torch or "
                                f"cupy tensors for device memory ({e})") from None
            fw = "numpy"
        self.fw = fw
        self.like = q
        self.cuda = _is_cuda(q, fw)
        if fw == "torch":
            _load_torch_ops()  # registers blasst::attention / blasst::decode for torch.compile

    def device_guard(self):
        """Kernels launch on the current device: make it q's device for the call."""
        if self.fw == "torch" and self.cuda:
            import torch
            if self.like.device.index != torch.cuda.current_device():
                return torch.cuda.device(self.like.device)
        return contextlib.nullcontext()

    def export(self, x, name: str):
        fw = _framework(x)
        if fw != self.fw and not (fw == "other" and self.fw == "numpy"):
            raise ValueError(f"{name}: a {fw} tensor cannot be mixed with a {self.fw} q; "
                             "pass all tensors from one framework")
        if fw == "torch":
            return _torch_export(x)
        if fw == "other":
            import numpy as np
            return np.from_dlpack(x)
        return x

    def index(self, x, name: str):
        """int32 offsets / lengths / page tables; Python sequences are converted for CPU q."""
        if x is None:
            return None
        fw = _framework(x)
        if fw in ("torch", "numpy", "cupy", "other") and hasattr(x, "shape"):
            return self.export(x, name)
        # a plain sequence of ints
        if self.fw == "torch":
            import torch
            return _torch_export(torch.tensor(x, dtype=torch.int32, device=self.like.device))
        if self.fw == "cupy":
            import cupy
            return cupy.asarray(x, dtype=cupy.int32)
        import numpy as np
        return np.asarray(x, dtype=np.int32)

    def empty(self, shape, same_dtype: bool):
        q = self.like
        if self.fw == "torch":
            import torch
            return torch.empty(shape, dtype=q.dtype if same_dtype else torch.float32,
                               device=q.device)
        if self.fw == "cupy":
            import cupy
            return cupy.empty(shape, dtype=q.dtype if same_dtype else cupy.float32)
        import numpy as np
        return np.empty(shape, dtype=q.dtype if same_dtype else np.float32)

    def stream(self) -> int:
        return _stream_of(self.like, self.fw)


def _shape(x, name: str) -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    return tuple(int(s) for s in shape)


def _effective_skip(skip: Optional[SkipSoftmax]):
    """The C++ SkipConfig to use now (None = dense) and whether timestep gating forced dense."""
    if skip is None:
        return None, False
    if not isinstance(skip, SkipSoftmax):
        raise TypeError(f"skip: expected a blasst.SkipSoftmax (or None), got {type(skip).__name__}")
    if not skip.enabled:
        return None, False
    if skip.disabled_until_timestep is not None and not _diffusion.active(skip.disabled_until_timestep):
        return None, True
    return skip._cfg, False


def _stats_target(stats):
    if stats is None:
        return None, False, False
    if isinstance(stats, SkipStats):
        stats._raw.reset()
        return stats._raw, stats.histogram, stats.record_deltas
    if hasattr(stats, "__setitem__") and hasattr(stats, "keys"):
        return _core.SkipStats(), False, False
    raise TypeError(f"stats: expected a dict-like object or blasst.SkipStats, got {type(stats).__name__}")


def _fill_stats(stats, raw, gated: bool) -> None:
    if stats is None:
        return
    if isinstance(stats, SkipStats):
        stats.gated = gated
        return
    wrapped = SkipStats()
    wrapped._raw = raw
    wrapped.gated = gated
    for key, val in wrapped.as_dict().items():
        stats[key] = val


def _opt_int(name: str, v) -> int:
    if v is None:
        return 0
    if isinstance(v, bool):
        raise ValueError(f"{name}: expected an int, got {v!r}")
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an int, got {v!r}") from None
    if iv < 0:
        raise ValueError(f"{name}: must be >= 0, got {v!r}")
    return iv


def _opt_scale(scale) -> Optional[float]:
    return None if scale is None else float(scale)


_torch_ops = None  # blasst._torch_ops once torch is in use (registers the custom ops)


def _load_torch_ops():
    global _torch_ops
    if _torch_ops is None:
        from . import _torch_ops as ops
        _torch_ops = ops
    return _torch_ops


def _torch_compiling(q) -> bool:
    """True while torch.compile traces a call with torch tensors: route through the custom op."""
    ops = _torch_ops
    if ops is None:
        if sys.modules.get("torch") is None:
            return False
        ops = _load_torch_ops()
    return isinstance(q, ops.torch.Tensor) and ops.torch.compiler.is_compiling()


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
              skip: Optional[SkipSoftmax] = None, cu_seqlens_q=None, cu_seqlens_k=None,
              max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
              return_lse: bool = False,
              stats: Union[None, SkipStats, MutableMapping[str, Any]] = None):
    """Skip-Softmax attention (SPEC §1-§3).

    q [B, Lq, Hq, d], k [B, Lk, Hk, d], v [B, Lk, Hk, dv] -> out [B, Lq, Hq, dv] (dtype of q),
    plus lse [B, Hq, Lq] (float32, natural log) with return_lse=True. Ragged batches: q [Tq, Hq, d],
    k/v [Tk, Hk, d], int32 cu_seqlens_q/cu_seqlens_k (batch + 1 offsets, same device as q);
    out [Tq, Hq, dv], lse [Hq, Tq]. For CUDA tensors give max_seqlen_q/max_seqlen_k with device
    offsets: the call then never synchronises (CUDA-graph capturable).

    causal: bottom-right aligned when Lq != Lk. skip: a blasst.SkipSoftmax (None: dense).
    stats: a dict (filled in place) or a blasst.SkipStats.
    """
    if _torch_compiling(q):
        if stats is not None:
            raise ValueError("stats: not available inside torch.compile; call blasst.attention "
                             "eagerly to collect statistics")
        return _torch_ops.attention_op(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, return_lse)
    return _attention_impl(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, return_lse, stats)


def _attention_impl(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, return_lse, stats, lse_always=False):
    frame = _Frame(q)
    qs, vs = _shape(q, "q"), _shape(v, "v")
    ragged = cu_seqlens_q is not None or cu_seqlens_k is not None
    if ragged:
        if len(qs) != 3 or len(vs) != 3:
            raise ValueError(f"q, v: ragged batches take q [Tq, Hq, d] and v [Tk, Hk, dv], got "
                             f"q {list(qs)} and v {list(vs)}")
        out_shape = (qs[0], qs[1], vs[2])
        lse_shape = (qs[1], qs[0])
    else:
        if len(qs) != 4 or len(vs) != 4:
            raise ValueError(f"q, v: expected q [B, Lq, Hq, d] and v [B, Lk, Hk, dv] (or rank 3 "
                             f"with cu_seqlens), got q {list(qs)} and v {list(vs)}")
        out_shape = (qs[0], qs[1], qs[2], vs[3])
        lse_shape = (qs[0], qs[2], qs[1])
    cfg, gated, raw, hist, deltas, out, lse = _prepare(frame, out_shape, lse_shape, skip, stats,
                                                       return_lse or lse_always)
    with frame.device_guard():
        _core.attention(frame.export(q, "q"), frame.export(k, "k"), frame.export(v, "v"),
                        frame.export(out, "out"), None if lse is None else frame.export(lse, "lse"),
                        frame.index(cu_seqlens_q, "cu_seqlens_q"),
                        frame.index(cu_seqlens_k, "cu_seqlens_k"),
                        _opt_int("max_seqlen_q", max_seqlen_q), _opt_int("max_seqlen_k", max_seqlen_k),
                        bool(causal), _opt_scale(scale), cfg, frame.stream() if frame.cuda else 0,
                        raw, hist, deltas, _settings["num_threads"])
    return _finish(stats, raw, gated, out, lse)


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
    if _torch_compiling(q):
        if stats is not None:
            raise ValueError("stats: not available inside torch.compile; call blasst.decode "
                             "eagerly to collect statistics")
        return _torch_ops.decode_op(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k,
                                    skip, scale, causal, return_lse)
    return _decode_impl(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale,
                        causal, return_lse, stats)


def _decode_impl(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
                 return_lse, stats, lse_always=False):
    frame = _Frame(q)
    qs, vs = _shape(q, "q"), _shape(v_cache, "v_cache")
    if len(qs) != 4 or len(vs) != 4:
        raise ValueError(f"q, v_cache: expected q [B, q_len, Hq, d] and v_cache [.., .., Hk, dv], "
                         f"got q {list(qs)} and v_cache {list(vs)}")
    if not 1 <= qs[1] <= DECODE_MAX_Q_LEN:
        raise ValueError(f"q_len: blasst.decode takes 1 to {DECODE_MAX_Q_LEN} query tokens per "
                         f"sequence (q [B, q_len, Hq, d] = {list(qs)}), got q_len = {qs[1]}; use "
                         "blasst.attention(causal=True) for longer queries")
    out_shape = (qs[0], qs[1], qs[2], vs[3])
    lse_shape = (qs[0], qs[2], qs[1])
    cfg, gated, raw, hist, deltas, out, lse = _prepare(frame, out_shape, lse_shape, skip, stats,
                                                       return_lse or lse_always)
    with frame.device_guard():
        _core.decode(frame.export(q, "q"), frame.export(k_cache, "k_cache"),
                     frame.export(v_cache, "v_cache"), frame.export(out, "out"),
                     None if lse is None else frame.export(lse, "lse"),
                     frame.index(page_table, "page_table"), frame.index(seqlens, "seqlens"),
                     _opt_int("max_seqlen_k", max_seqlen_k), bool(causal), _opt_scale(scale), cfg,
                     frame.stream() if frame.cuda else 0, raw, hist, deltas, _settings["num_threads"])
    return _finish(stats, raw, gated, out, lse)


def cuda_available() -> bool:
    """True when blasst was built with the kernels and a Hopper GPU is visible."""
    return bool(_core.cuda_available())


def cuda_device_name() -> str:
    return _core.cuda_device_name()


def built_with_cuda() -> bool:
    return bool(_core.built_with_cuda)


def _prepare(frame, out_shape, lse_shape, skip, stats, want_lse):
    """Shared by attention and decode: skip settings, stats buffers, outputs in q's framework."""
    cfg, gated = _effective_skip(skip)
    raw, hist, deltas = _stats_target(stats)
    out = frame.empty(out_shape, True)
    lse = frame.empty(lse_shape, False) if want_lse else None
    return cfg, gated, raw, hist, deltas, out, lse


def _finish(stats, raw, gated, out, lse):
    _fill_stats(stats, raw, gated)
    return out if lse is None else (out, lse)
