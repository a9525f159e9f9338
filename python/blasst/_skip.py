"""Skip-Softmax settings (SPEC §3), statistics (SPEC §5) and configuration files (SPEC §7)."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Tuple, Union

from . import _core

_ORDERS = ("natural", "max_first")
_SCREENS = ("off", "strict", "tight")


class SkipSoftmax:
    """Skip-Softmax settings for one attention call site (SPEC §2, §3).

    Give exactly one threshold source:
      * ``threshold=lam``: lambda itself, in (0, 1);
      * ``factor=f``: a raw threshold_scale_factor, lambda = f / Lk per sequence;
      * ``calibration=(a, b)`` with ``target_sparsity=s``: factor = a * exp(b * s).

    ``tile_keys``, ``vote_rows``, ``vote_heads``, ``split_tiles`` and ``order`` ("natural" or
    "max_first") set the vote granularity and visit order the CPU reference uses; the kernels use
    their own documented vote groups (reported in the statistics). The CUDA decode kernel honours
    ``order``: "max_first" there means seeded split-KV (SPEC §2a).

    ``order=None`` (the default) means the SPEC §2a default for the source: "max_first" for
    ``threshold=`` and ``factor=``, "natural" for ``calibration=(a, b)`` (an interop fit, made by
    tools that visit in natural order). A defaulted max-first falls back to natural exactly where
    the CUDA prefill kernel cannot run it (full mask with Lq != Lk for some sequence, e.g.
    cross-attention; a ragged full-mask batch whose lengths are not host-visible), on the CPU
    reference too; an explicit ``order="max_first"`` there is an error on the CUDA path. The
    statistics (``SkipStats.granularity["order"]``) report the order actually used.
    ``disabled_until_timestep``
    gates skipping on the diffusion timestep published through ``blasst.diffusion`` (SPEC §4).
    ``SkipSoftmax.dense()`` is the exact dense path.

    ``screen`` ("off", "strict" or "tight", with ``screen_z`` for tight) turns on the FP8 screen
    of SPEC §2b: the CPU reference models it and counts its wrong screens in the statistics
    (``SkipStats.screened``, ``screen_wrong``); the CUDA prefill kernel implements it, the CUDA
    decode kernels refuse it. ``screen_ahead=True`` (with a screen) decides every pair from the
    FP8 scores before the pass (SPEC §2b "Screen ahead"): the CUDA prefill kernel then never loads
    or multiplies a tile no vote group needs; wrong screens are not counted on the GPU then
    (``screen_wrong`` stays empty; the strict margin has none by the SPEC's theorem).
    """

    __slots__ = ("_cfg", "_disabled_until", "_key", "_op_str")

    def __init__(self, *, threshold: Optional[float] = None, factor: Optional[float] = None,
                 calibration: Optional[Tuple[float, float]] = None,
                 target_sparsity: Optional[float] = None, tile_keys: int = 128,
                 vote_rows: int = 64, vote_heads: int = 1, split_tiles: int = 0,
                 order: Optional[str] = None, disabled_until_timestep: Optional[float] = None,
                 screen: str = "off", screen_z: float = 6.0, screen_ahead: bool = False):
        given = [n for n, v in (("threshold", threshold), ("factor", factor),
                                ("calibration", calibration)) if v is not None]
        if len(given) != 1:
            raise ValueError(
                "SkipSoftmax: give exactly one of threshold=, factor= or calibration=(a, b) "
                f"with target_sparsity= (got {', '.join(given) or 'none'}); "
                "use SkipSoftmax.dense() for the dense path")
        if calibration is not None:
            try:
                a, b = (float(x) for x in calibration)
            except (TypeError, ValueError):
                raise ValueError(
                    f"SkipSoftmax: calibration must be a pair (a, b), got {calibration!r}") from None
            if target_sparsity is None:
                raise ValueError("SkipSoftmax: calibration=(a, b) needs target_sparsity=")
            cfg = _core.SkipConfig.from_calibration(a, b, float(target_sparsity))
        else:
            if target_sparsity is not None:
                raise ValueError("SkipSoftmax: target_sparsity= applies only with calibration=(a, b)")
            if threshold is not None:
                cfg = _core.SkipConfig.from_threshold(float(threshold))
            else:
                cfg = _core.SkipConfig.from_factor(float(factor))
        self._init(cfg, tile_keys, vote_rows, vote_heads, split_tiles, order,
                   disabled_until_timestep, screen, screen_z, screen_ahead)

    def _init(self, cfg, tile_keys, vote_rows, vote_heads, split_tiles, order, disabled_until,
              screen="off", screen_z=6.0, screen_ahead=False):
        # order None: keep cfg's own (the factories' SPEC §2a default, or a config's order).
        if order is not None and order not in _ORDERS:
            raise ValueError(f"SkipSoftmax: order must be one of {_ORDERS} or None, got {order!r}")
        for name, val in (("tile_keys", tile_keys), ("vote_rows", vote_rows),
                          ("vote_heads", vote_heads), ("split_tiles", split_tiles)):
            if isinstance(val, bool) or not isinstance(val, int):
                raise ValueError(f"SkipSoftmax: {name} must be an int, got {val!r}")
        cfg.tile_keys = tile_keys
        cfg.vote_rows = vote_rows
        cfg.vote_heads = vote_heads
        cfg.split_tiles = split_tiles
        if order is not None:
            cfg.order = order  # an order asked for: explicit (SPEC §2a)
        if screen not in _SCREENS:
            raise ValueError(f"SkipSoftmax: screen must be one of {_SCREENS}, got {screen!r}")
        if isinstance(screen_z, bool) or not isinstance(screen_z, (int, float)):
            raise ValueError(f"SkipSoftmax: screen_z must be a number, got {screen_z!r}")
        if not isinstance(screen_ahead, bool):
            raise ValueError(f"SkipSoftmax: screen_ahead must be a bool, got {screen_ahead!r}")
        cfg.screen = screen
        cfg.screen_z = float(screen_z)
        cfg.screen_ahead = screen_ahead
        if cfg.enabled or screen != "off" or screen_ahead:
            cfg.validate()  # C++ checks: NaN/inf/<= 0 thresholds, target range, tile sizes
        self._cfg = cfg
        # SPEC §4: D lies in [0, 1]; the C++ gate's constructor is the check.
        self._disabled_until = (None if disabled_until is None else
                                _core.TimestepGate(float(disabled_until)).disabled_until)
        self._key = None
        # Plain-Python description, computed once: torch.compile traces attribute reads of it
        # but cannot trace into the C++ object.
        self._op_str = repr(self.fields())

    @classmethod
    def dense(cls) -> "SkipSoftmax":
        """Skipping off: the exact dense path (what no configuration means)."""
        self = cls.__new__(cls)
        self._init(_core.SkipConfig(), 128, 64, 1, 0, "natural", None)
        return self

    @classmethod
    def _wrap(cls, cfg, disabled_until=None) -> "SkipSoftmax":
        self = cls.__new__(cls)
        self._init(cfg, cfg.tile_keys, cfg.vote_rows, cfg.vote_heads, cfg.split_tiles,
                   cfg.order if cfg.order_explicit else None, disabled_until, cfg.screen, cfg.screen_z,
                   cfg.screen_ahead)
        return self

    @classmethod
    def from_config(cls, path_or_dict: Union[str, os.PathLike, Mapping[str, Any]], *,
                    layer: str = "", phase: str = "prefill",
                    target_sparsity: Optional[float] = None) -> "SkipSoftmax":
        """Settings for one layer and phase from a SPEC §7 file (a config.json path, a dict of
        the whole config or of the bare sparse_attention_config block). Layers matched by an
        ignore pattern, or files without the block, give the dense path."""
        return load_config(path_or_dict).skip_softmax(layer=layer, phase=phase,
                                                      target_sparsity=target_sparsity)

    # -- read-only views ---------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return bool(self._cfg.enabled)

    @property
    def threshold(self) -> Optional[float]:
        return self._cfg.threshold

    @property
    def factor(self) -> Optional[float]:
        return self._cfg.factor

    @property
    def calibration(self) -> Optional[Tuple[float, float]]:
        return self._cfg.calibration

    @property
    def target_sparsity(self) -> float:
        return self._cfg.target_sparsity

    @property
    def tile_keys(self) -> int:
        return self._cfg.tile_keys

    @property
    def vote_rows(self) -> int:
        return self._cfg.vote_rows

    @property
    def vote_heads(self) -> int:
        return self._cfg.vote_heads

    @property
    def split_tiles(self) -> int:
        return self._cfg.split_tiles

    @property
    def order(self) -> str:
        """The order asked for (or defaulted to); a call reports the one it used in its stats."""
        return self._cfg.order

    @property
    def order_explicit(self) -> bool:
        """False when ``order`` is the SPEC §2a default of threshold=/factor= (max-first, with
        the natural fallback where the prefill kernel cannot run it)."""
        return bool(self._cfg.order_explicit)

    @property
    def screen(self) -> str:
        """The FP8 screen (SPEC §2b): "off", "strict" or "tight"; the CPU reference and the CUDA
        prefill kernel (the CUDA decode kernels refuse a screen)."""
        return self._cfg.screen

    @property
    def screen_z(self) -> float:
        """z of the tight margin (SPEC §2b)."""
        return self._cfg.screen_z

    @property
    def screen_ahead(self) -> bool:
        """The screen decides every pair before the pass (SPEC §2b "Screen ahead")."""
        return bool(self._cfg.screen_ahead)

    @property
    def disabled_until_timestep(self) -> Optional[float]:
        return self._disabled_until

    def lambda_for(self, seq_len_k: int) -> float:
        """lambda for a sequence of seq_len_k keys (SPEC §3); >= 1 means dense for it."""
        return self._cfg.resolve_lambda(int(seq_len_k))

    def fields(self) -> Tuple:
        """A hashable, primitive-only description (used to pass settings through torch ops)."""
        if self._key is None:
            c = self._cfg
            cal = c.calibration
            pw = c.piecewise
            if pw is not None:  # the richer form of a config's blasst extension (SPEC §6)
                pw = (tuple(float(x) for x in pw[0]), tuple(float(x) for x in pw[1]),
                      None if pw[2] is None else (str(pw[2][0]), int(pw[2][1]), int(pw[2][2])))
            self._key = (bool(c.enabled), c.threshold, c.factor, None if cal is None else tuple(cal),
                         float(c.target_sparsity), int(c.tile_keys), int(c.vote_rows),
                         int(c.vote_heads), int(c.split_tiles), str(c.order), self._disabled_until,
                         pw, bool(c.order_explicit), str(c.screen), float(c.screen_z),
                         bool(c.screen_ahead))
        return self._key

    @classmethod
    def from_fields(cls, fields: Tuple) -> "SkipSoftmax":
        (enabled, threshold, factor, cal, target, tile_keys, vote_rows, vote_heads, split_tiles,
         order, disabled_until, piecewise) = fields[:12]
        explicit = bool(fields[12]) if len(fields) > 12 else True
        screen, screen_z = (str(fields[13]), float(fields[14])) if len(fields) > 14 else ("off", 6.0)
        screen_ahead = bool(fields[15]) if len(fields) > 15 else False
        if not explicit:
            order = None  # the source's SPEC §2a default, as it was built
        if enabled and piecewise is not None and threshold is None and factor is None:
            targets, log_factors, finite_size = piecewise
            cfg = _core.SkipConfig.from_piecewise(
                (list(targets), list(log_factors),
                 None if finite_size is None else tuple(finite_size)), float(target))
            self = cls.__new__(cls)
            self._init(cfg, tile_keys, vote_rows, vote_heads, split_tiles, order, disabled_until,
                       screen, screen_z, screen_ahead)
            return self
        if not enabled:
            self = cls.__new__(cls)
            self._init(_core.SkipConfig(), 128, 64, 1, 0, "natural", None, screen, screen_z, screen_ahead)
            self._disabled_until = disabled_until
            self._key = None
            self._op_str = repr(self.fields())
            return self
        if cal is not None:
            return cls(calibration=tuple(cal), target_sparsity=target, tile_keys=tile_keys,
                       vote_rows=vote_rows, vote_heads=vote_heads, split_tiles=split_tiles,
                       order=order, disabled_until_timestep=disabled_until, screen=screen,
                       screen_z=screen_z, screen_ahead=screen_ahead)
        src = {"threshold": threshold} if threshold is not None else {"factor": factor}
        return cls(**src, tile_keys=tile_keys,
                   vote_rows=vote_rows, vote_heads=vote_heads, split_tiles=split_tiles,
                   order=order, disabled_until_timestep=disabled_until, screen=screen,
                   screen_z=screen_z, screen_ahead=screen_ahead)

    def __reduce__(self):  # picklable (multiprocessing, torch.save of modules that hold one)
        return (SkipSoftmax.from_fields, (self.fields(),))

    def __eq__(self, other) -> bool:
        return isinstance(other, SkipSoftmax) and self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        c = self._cfg
        if not c.enabled:
            src = "dense"
        elif c.threshold is not None:
            src = f"threshold={c.threshold!r}"
        elif c.factor is not None:
            src = f"factor={c.factor!r}"
        elif c.piecewise is not None:
            src = f"piecewise={self.fields()[11]!r}, target_sparsity={c.target_sparsity!r}"
        else:
            src = f"calibration={c.calibration!r}, target_sparsity={c.target_sparsity!r}"
        extra = f", disabled_until_timestep={self._disabled_until!r}" if self._disabled_until is not None else ""
        order = f"order={c.order!r}" if c.order_explicit else f"order=None (default: {c.order!r})"
        if c.screen != "off":
            extra += f", screen={c.screen!r}" + (f", screen_z={c.screen_z!r}" if c.screen == "tight" else "")
            extra += ", screen_ahead=True" if c.screen_ahead else ""
        return (f"SkipSoftmax({src}, tile_keys={c.tile_keys}, vote_rows={c.vote_rows}, "
                f"vote_heads={c.vote_heads}, {order}{extra})")


def check_skip(skip) -> None:
    """The type check of every skip= argument: a SkipSoftmax or None."""
    if skip is not None and not isinstance(skip, SkipSoftmax):
        raise TypeError(f"skip: expected a blasst.SkipSoftmax (or None), got {type(skip).__name__}")


class SkipStats:
    """Statistics of one call (SPEC §5), filled in place when passed as ``stats=``.

    Counts are (vote group, key tile) pairs; ``counted_at`` names the vote group they were counted
    at. With ``histogram=True`` the per-head delta histograms are collected too, which gives the
    exact one-pass sparsity curve ``sparsity_at(lam)`` for every lambda.
    """

    __slots__ = ("_raw", "histogram", "record_deltas", "gated")

    def __init__(self, *, histogram: bool = False, record_deltas: bool = False):
        self._raw = _core.SkipStats()
        self.histogram = bool(histogram)
        self.record_deltas = bool(record_deltas)
        self.gated = False  # True when timestep gating forced the dense path for this call

    def sparsity(self) -> float:
        return self._raw.sparsity()

    @property
    def total_visited(self) -> int:
        return self._raw.total_visited()

    @property
    def total_skipped(self) -> int:
        return self._raw.total_skipped()

    @property
    def visited(self):
        return list(self._raw.visited)

    @property
    def skipped(self):
        return list(self._raw.skipped)

    @property
    def lambdas(self):
        return list(self._raw.lambdas)

    # SPEC §2b FP8 screen (filled when the call's SkipSoftmax has screen != "off"; else empty / 0)
    @property
    def screened(self):
        return list(self._raw.screened)

    @property
    def screen_wrong(self):
        return list(self._raw.screen_wrong)

    @property
    def total_screened(self) -> int:
        return self._raw.total_screened()

    @property
    def total_screen_wrong(self) -> int:
        return self._raw.total_screen_wrong()

    @property
    def screen_deltas(self):
        return self._raw.screen_deltas

    @property
    def counted_at(self) -> str:
        return self._raw.counted_at

    @property
    def granularity(self) -> dict:
        return self._raw.granularity

    @property
    def histograms(self):
        return self._raw.histograms

    @property
    def deltas(self):
        return self._raw.deltas

    def sparsity_at(self, lam: float) -> float:
        return self._raw.sparsity_at(float(lam))

    def as_dict(self) -> dict:
        return {
            "sparsity": self.sparsity(),
            "visited": self.total_visited,
            "skipped": self.total_skipped,
            "visited_per_head": self.visited,
            "skipped_per_head": self.skipped,
            "lambdas": self.lambdas,
            "counted_at": self.counted_at,
            "granularity": self.granularity,
            "gated": self.gated,
        }

    def __repr__(self) -> str:
        return (f"SkipStats(sparsity={self.sparsity():.4f}, skipped={self.total_skipped}, "
                f"visited={self.total_visited}, counted_at={self.counted_at!r})")


class SparseAttentionConfig:
    """A parsed SPEC §7 ``sparse_attention_config`` block (parsed by the C++ config module)."""

    __slots__ = ("_raw", "source")

    def __init__(self, raw, source: str):
        self._raw = raw  # None: the file had no block (every layer dense)
        self.source = source

    @property
    def present(self) -> bool:
        return self._raw is not None

    @property
    def group_names(self):
        return [] if self._raw is None else list(self._raw.group_names)

    def skip_softmax(self, *, layer: str = "", phase: str = "prefill",
                     target_sparsity: Optional[float] = None) -> SkipSoftmax:
        if phase not in ("prefill", "decode"):
            raise ValueError(f"phase: must be 'prefill' or 'decode', got {phase!r}")
        if self._raw is None:
            return SkipSoftmax.dense()
        cfg = self._raw.resolve(layer, phase,
                                None if target_sparsity is None else float(target_sparsity))
        return SkipSoftmax._wrap(cfg, self._raw.disabled_until_timestep(layer))

    def disabled_until_timestep(self, layer: str = "") -> Optional[float]:
        return None if self._raw is None else self._raw.disabled_until_timestep(layer)

    def to_json(self) -> str:
        if self._raw is None:
            raise ValueError(f"{self.source}: has no sparse_attention_config block")
        return self._raw.to_json()

    def __repr__(self) -> str:
        return f"SparseAttentionConfig(source={self.source!r}, groups={self.group_names})"


def load_config(path_or_dict: Union[str, os.PathLike, Mapping[str, Any], SparseAttentionConfig]
                ) -> SparseAttentionConfig:
    """Parse a SPEC §7 configuration: a config.json path, a dict holding the
    sparse_attention_config key, or the bare block as a dict."""
    if isinstance(path_or_dict, SparseAttentionConfig):
        return path_or_dict
    if isinstance(path_or_dict, Mapping):
        text = json.dumps(dict(path_or_dict))
        return SparseAttentionConfig(_core.SparseAttentionConfig.parse(text, "<dict>"), "<dict>")
    if isinstance(path_or_dict, (str, os.PathLike)):
        path = os.fspath(path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        return SparseAttentionConfig(_core.SparseAttentionConfig.load_file(path), path)
    # transformers' PretrainedConfig and similar objects
    to_dict = getattr(path_or_dict, "to_dict", None)
    if callable(to_dict):
        return load_config(to_dict())
    raise TypeError("load_config: expected a path, a dict or a config object with to_dict(), "
                    f"got {type(path_or_dict).__name__}")


def load_model_configs(model_dir: Union[str, os.PathLike]) -> dict:
    """Multi-component models (SPEC §7): {component: SparseAttentionConfig} for the subfolders
    (transformer/, transformer_2/, ...) whose config.json carries a block; a component without
    one is absent (it stays dense)."""
    path = os.fspath(model_dir)
    return {name: SparseAttentionConfig(raw, os.path.join(path, name, "config.json"))
            for name, raw in _core.SparseAttentionConfig.load_model_dir(path)}
