"""The eager calls into blasst._core behind blasst.attention and blasst.decode, and behind the torch
custom ops (blasst._torch_ops), which run them at run time.

Each call checks its shapes, takes the skip settings in force (SPEC §4 timestep gating, read now),
prepares the statistics target, allocates out/lse with q's framework (blasst._frameworks) and hands
everything to C++ as DLPack views; C++ releases the GIL and runs the reference engine (CPU tensors)
or the kernels on the caller's current stream (CUDA tensors).
"""
from __future__ import annotations

import operator
from typing import Optional, Tuple

from . import _core
from . import diffusion as _diffusion
from ._frameworks import Frame
from ._skip import SkipStats, check_skip

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


def cuda_available() -> bool:
    """True when blasst was built with the kernels and a Hopper GPU is visible."""
    return bool(_core.cuda_available())


def cuda_device_name() -> str:
    return _core.cuda_device_name()


def built_with_cuda() -> bool:
    return bool(_core.built_with_cuda)


def attention_shapes(qs, vs, ragged: bool):
    """(out, lse) shapes of blasst.attention from the shapes of q and v (also for fake kernels)."""
    if ragged:
        return (qs[0], qs[1], vs[2]), (qs[1], qs[0])
    return (qs[0], qs[1], qs[2], vs[3]), (qs[0], qs[2], qs[1])


def decode_shapes(qs, vs):
    """(out, lse) shapes of blasst.decode: those of a dense blasst.attention."""
    return attention_shapes(qs, vs, False)


def opt_scale(scale) -> Optional[float]:
    """scale as a float (None: 1/sqrt(d)); a string or a bool is refused, not parsed (float("2")
    would take it). C++ checks the value (finite, > 0)."""
    if scale is None:
        return None
    if isinstance(scale, (str, bytes, bool)):
        raise TypeError(f"scale: expected a number, got {type(scale).__name__} {scale!r}")
    return float(scale)


def _shape(x, name: str) -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected a tensor, got {type(x).__name__}")
    return tuple(int(s) for s in shape)


def _opt_int(name: str, v) -> int:
    if v is None:
        return 0
    if isinstance(v, bool):
        raise ValueError(f"{name}: expected an int, got {v!r}")
    try:  # an integer (int, numpy or 0-d torch integer); not a float, which int() would truncate
        iv = operator.index(v)
    except TypeError:
        raise ValueError(f"{name}: expected an int, got {v!r}") from None
    if iv < 0:
        raise ValueError(f"{name}: must be >= 0, got {v!r}")
    return iv


def _effective_skip(skip):
    """The C++ SkipConfig to use now (None = dense) and whether timestep gating forced dense."""
    check_skip(skip)
    if skip is None or not skip.enabled:
        return None, False
    # No D: the gate is always open (SPEC §4; TimestepGate::active without D), asked for nothing.
    if skip._disabled_until is not None and not _diffusion.active(skip._disabled_until):
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
    raise TypeError("stats: expected a dict-like object or blasst.SkipStats, got "
                    f"{type(stats).__name__}")


class _Call:
    """What attention and decode share around their call into _core: the skip settings in force,
    the statistics target and the outputs, allocated in q's framework."""

    __slots__ = ("frame", "cfg", "gated", "stats", "raw", "histogram", "record_deltas", "out",
                 "lse")

    def __init__(self, frame: Frame, out_shape, lse_shape, skip, stats, return_lse: bool):
        self.frame = frame
        self.cfg, self.gated = _effective_skip(skip)
        self.stats = stats
        self.raw, self.histogram, self.record_deltas = _stats_target(stats)
        self.out = frame.empty(out_shape, True)
        self.lse = frame.empty(lse_shape, False) if return_lse else None

    def outputs(self):
        """The out and lse arguments of _core.attention / _core.decode."""
        frame = self.frame
        out = frame.export(self.out, "out")
        return out, None if self.lse is None else frame.export(self.lse, "lse")

    def options(self, causal, scale):
        """The arguments _core.attention and _core.decode end with (causal ... num_threads)."""
        return (bool(causal), opt_scale(scale), self.cfg, self.frame.stream(), self.raw,
                self.histogram, self.record_deltas, _settings["num_threads"])

    def result(self):
        stats = self.stats
        if isinstance(stats, SkipStats):
            stats.gated = self.gated
        elif stats is not None:
            wrapped = SkipStats()
            wrapped._raw = self.raw
            wrapped.gated = self.gated
            for key, val in wrapped.as_dict().items():
                stats[key] = val
        return self.out if self.lse is None else (self.out, self.lse)


def torch_export(x):
    """A torch tensor (or None) as a DLPack view for _core (the backward op's arguments)."""
    return None if x is None else Frame(x).export(x, "tensor")


def attention(q, k, v, causal, scale, skip, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, return_lse, stats, record_skip_set: bool = False, seed_max=None):
    """record_skip_set: also return the skip set the call recorded (SPEC §9: int32 words on q's
    device, blasst::skip_set_shape's layout), or None when its skip test did not run (dense,
    or held off by timestep gating): (result, words). seed_max: the rows' seeded maxima (SPEC
    §2a, lse's layout) or None."""
    frame = Frame(q)
    qs, vs = _shape(q, "q"), _shape(v, "v")
    ragged = cu_seqlens_q is not None or cu_seqlens_k is not None
    if ragged:
        if len(qs) != 3 or len(vs) != 3:
            raise ValueError(f"q, v: ragged batches take q [Tq, Hq, d] and v [Tk, Hk, dv], got "
                             f"q {list(qs)} and v {list(vs)}")
    elif len(qs) != 4 or len(vs) != 4:
        raise ValueError(f"q, v: expected q [B, Lq, Hq, d] and v [B, Lk, Hk, dv] (or rank 3 "
                         f"with cu_seqlens), got q {list(qs)} and v {list(vs)}")
    call = _Call(frame, *attention_shapes(qs, vs, ragged), skip, stats, return_lse)
    # DLPack capsules are consumed by one call: each _core call gets its own.
    def inputs():
        return (frame.export(q, "q"), frame.export(k, "k"), frame.export(v, "v"))

    def lengths():
        return (frame.index(cu_seqlens_q, "cu_seqlens_q"), frame.index(cu_seqlens_k, "cu_seqlens_k"),
                _opt_int("max_seqlen_q", max_seqlen_q), _opt_int("max_seqlen_k", max_seqlen_k))

    with frame.device_guard():
        words = None
        if record_skip_set and call.cfg is not None:
            words = frame.empty_int32(_core.skip_set_words(
                *inputs(), call.outputs()[0], *lengths(), bool(causal), call.cfg))
        _core.attention(*inputs(), *call.outputs(), *lengths(), *call.options(causal, scale),
                        skip_set=None if words is None else frame.export(words, "skip_set"),
                        seed_max=None if seed_max is None else frame.export(seed_max, "seed_max"))
    return (call.result(), words) if record_skip_set else call.result()


def decode(q, k_cache, v_cache, page_table, seqlens, max_seqlen_k, skip, scale, causal,
           return_lse, stats):
    frame = Frame(q)
    qs, vs = _shape(q, "q"), _shape(v_cache, "v_cache")
    if len(qs) != 4 or len(vs) != 4:
        raise ValueError(f"q, v_cache: expected q [B, q_len, Hq, d] and v_cache [.., .., Hk, dv], "
                         f"got q {list(qs)} and v_cache {list(vs)}")
    if not 1 <= qs[1] <= DECODE_MAX_Q_LEN:
        raise ValueError(f"q_len: blasst.decode takes 1 to {DECODE_MAX_Q_LEN} query tokens per "
                         f"sequence (q [B, q_len, Hq, d] = {list(qs)}), got q_len = {qs[1]}; use "
                         "blasst.attention(causal=True) for longer queries")
    call = _Call(frame, *decode_shapes(qs, vs), skip, stats, return_lse)
    with frame.device_guard():
        _core.decode(frame.export(q, "q"), frame.export(k_cache, "k_cache"),
                     frame.export(v_cache, "v_cache"), *call.outputs(),
                     frame.index(page_table, "page_table"), frame.index(seqlens, "seqlens"),
                     _opt_int("max_seqlen_k", max_seqlen_k), *call.options(causal, scale))
    return call.result()
