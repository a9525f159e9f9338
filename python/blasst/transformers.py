"""Hugging Face transformers integration: ``attn_implementation="blasst"``.

    import blasst.transformers
    blasst.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="blasst")

Prefill (q_len > 8) runs blasst.attention, decode steps (q_len <= 8, against the KV cache) run
blasst.decode; transformers' [B, H, L, d] tensors are handed over as permuted views ([B, L, H, d]),
not copies. GQA runs natively (no repeat_kv). Skip settings come per layer from the checkpoint's
``config.sparse_attention_config`` (SPEC §7; layer names "model.layers.{i}.self_attn", matched
against the ignore patterns); without that block every layer is dense unless register(skip=...)
gives a default. Calls that carry an explicit attention mask (padded batches, chunked prefill,
static caches) are delegated to transformers' SDPA implementation, which handles every mask.
Inside ``blasst.calibration.record()`` every call this backend serves runs as the calibration
probe and is recorded per layer, phase and key length.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional

from . import _api, _calls, _recording
from ._skip import SkipSoftmax, load_config

NAME = "blasst"
DECODE_MAX_Q = _calls.DECODE_MAX_Q_LEN  # longer queries (chunked prefill) run blasst.attention
LAYER_NAME = "model.layers.{}.self_attn"

_state = {"default_skip": None, "layer_name": LAYER_NAME}
_recorders = []
_lock = threading.Lock()


class StatsRecorder:
    """Per-layer skip statistics of the attention calls made while it is active."""

    def __init__(self):
        self.layers: Dict[str, Dict[str, int]] = {}
        self.calls = 0

    def add(self, layer: str, phase: str, stats: dict) -> None:
        key = f"{layer}:{phase}"
        entry = self.layers.setdefault(key, {"visited": 0, "skipped": 0, "calls": 0})
        entry["visited"] += int(stats["visited"])
        entry["skipped"] += int(stats["skipped"])
        entry["calls"] += 1
        self.calls += 1

    def totals(self, phase: Optional[str] = None):
        v = s = 0
        for key, e in self.layers.items():
            if phase is None or key.endswith(":" + phase):
                v += e["visited"]
                s += e["skipped"]
        return v, s

    def sparsity(self, phase: Optional[str] = None) -> float:
        v, s = self.totals(phase)
        return s / v if v else 0.0

    def __repr__(self) -> str:
        return (f"StatsRecorder(calls={self.calls}, sparsity={self.sparsity():.4f}, "
                f"layers={len(self.layers)})")


def record_stats():
    """Collect per-layer sparsity while the block runs (costs a device sync per call):
    ``with blasst.transformers.record_stats() as rec: ...``."""
    return _recording.active(_recorders, _lock, StatsRecorder())


def _layer_name(module) -> str:
    idx = getattr(module, "layer_idx", None)
    return _state["layer_name"].format(idx if idx is not None else 0)


def _config_of(module):
    """The parsed SPEC §7 block of the module's model config, cached on the module."""
    cached = getattr(module, "_blasst_config", None)
    if cached is not None:
        return cached
    cfg = getattr(module, "config", None)
    block = getattr(cfg, "sparse_attention_config", None) if cfg is not None else None
    if block is None and isinstance(cfg, dict):
        block = cfg.get("sparse_attention_config")
    parsed = load_config({"sparse_attention_config": block}) if block else False
    try:
        module._blasst_config = parsed
    except (AttributeError, TypeError):
        pass
    return parsed


def skip_for(module, phase: str) -> Optional[SkipSoftmax]:
    """The SkipSoftmax a layer uses in a phase (None: dense)."""
    cache = getattr(module, "_blasst_skip", None)
    if cache is None:
        cache = {}
        try:
            module._blasst_skip = cache
        except (AttributeError, TypeError):
            pass
    if phase in cache:
        return cache[phase]
    parsed = _config_of(module)
    if parsed:
        skip = parsed.skip_softmax(layer=_layer_name(module), phase=phase)
    else:
        skip = _state["default_skip"]
    if skip is not None and not skip.enabled:  # dense, gated or not: the same as no settings
        skip = None
    cache[phase] = skip
    return skip


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      **kwargs):
    """transformers attention function: query [B, Hq, Lq, d], key/value [B, Hk, Lk, d] (the whole
    cache) -> (out [B, Lq, Hq, dv], None)."""
    # Training (autograd records the call): blasst.attention's differentiable op (SPEC §9) for
    # every length (blasst.decode has no gradient), without statistics (the op takes none);
    # inside blasst.calibration.record(), whose probe needs them, transformers' SDPA runs.
    grad = _recording.needs_grad(query, key, value)
    cal = _recording.calibration()
    if attention_mask is not None or (dropout and module.training) or \
            kwargs.get("sliding_window") or kwargs.get("softcap") or (grad and cal is not None):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    q = query.transpose(1, 2)   # [B, Lq, Hq, d] view
    k = key.transpose(1, 2)     # [B, Lk, Hk, d] view
    v = value.transpose(1, 2)
    lq, lk = q.shape[1], k.shape[1]
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    phase = "decode" if lq <= DECODE_MAX_Q and lq <= lk and is_causal and not grad else "prefill"
    recording = bool(_recorders)
    # blasst.calibration.record(): the call runs as its probe, with a histogram
    if cal is not None:
        skip, stats = cal.probe, cal.new_stats()
    else:
        skip, stats = skip_for(module, phase), ({} if recording and not grad else None)
    if phase == "decode":
        out = _api.decode(q, k, v, scale=scaling, skip=skip, causal=True, max_seqlen_k=lk,
                          stats=stats)
    else:
        out = _api.attention(q, k, v, causal=bool(is_causal), scale=scaling, skip=skip,
                             stats=stats)
    if cal is not None or recording:
        name = _layer_name(module)
        if cal is not None:
            cal.add("default", name, phase, lq, lk, bool(is_causal), stats)
        if recording:  # (under autograd: a call without statistics)
            counts = _recording.stats_counts(stats)
            with _lock:
                for rec in _recorders:
                    rec.add(name, phase, counts)
    return out, None


def register(skip: Optional[SkipSoftmax] = None, *, layer_name: str = LAYER_NAME) -> str:
    """Register ``attn_implementation="blasst"`` with transformers' AttentionInterface (and its
    mask function, SDPA's: no mask at all for plain causal prefill and decode). ``skip`` is the
    default for models whose config has no sparse_attention_config; ``layer_name`` the pattern that
    turns module.layer_idx into the names the config's ignore list matches. Returns the name."""
    from transformers import AttentionInterface
    if skip is not None and not isinstance(skip, SkipSoftmax):
        raise TypeError(f"skip: expected a blasst.SkipSoftmax, got {type(skip).__name__}")
    _state["default_skip"] = skip
    _state["layer_name"] = layer_name
    AttentionInterface.register(NAME, attention_forward)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # older transformers build masks per implementation name themselves
        return NAME
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME


def clear_cache(model) -> None:
    """Forget per-layer settings cached on a model's modules (after editing its config)."""
    for m in model.modules():
        for attr in ("_blasst_skip", "_blasst_config"):
            if hasattr(m, attr):
                try:
                    delattr(m, attr)
                except AttributeError:
                    pass
