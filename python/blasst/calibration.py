"""SPEC §6 calibration of recorded one-pass curves, with the library's own fit (C++ calibrate()).

Record delta histograms from a model run (``blasst.SkipStats(histogram=True)`` passed as
``stats=`` to ``blasst.attention``/``blasst.decode``, one per layer and sequence length), then::

    cal = blasst.calibration.fit([(stats_2k, 2048), (stats_4k, 4096), (stats_8k, 8192)])
    cal.a, cal.b                  # the interop form factor = a * exp(b * s), lambda = factor / Lk
    cal.piecewise                 # the richer form (targets, log_factors, finite_size)
    cal.validation["max_error"]   # max |achieved - target| over in-range targets (SPEC §6)
    cal.save("model_dir/config.json", target_sparsity=0.5)   # SPEC §7; blasst.load_config reads it

Per layer: pass ``{layer_name: samples}``; the config then holds one group per layer (``layers`` =
``layer_pattern`` with ``{}`` replaced by the name) followed by a catch-all group with the fit
pooled over all layers (C++ ``to_configs``; docs/calibration.md §2, docs/config.md).

A sample is a tuple ``(source, Lk)`` or ``(source, Lk, granularity)``: ``source`` is a
``SkipStats`` (or a list of them: pooled), a 1-D histogram array of ``DeltaHistogram`` counts
(1026 entries, as ``SkipStats.histograms`` gives per head) or a list of such arrays;
``granularity`` (required for raw arrays, taken from the stats otherwise) is the dict
``SkipStats.granularity`` reports (tile_keys, rows, heads, split_tiles, order). ``Lk`` is the key
length of the call (decode: the cache length). All samples of one fit share one granularity.

From a model run, with no hand-placed statistics: ``record()`` makes the transformers backend
(``attn_implementation="blasst"``) and the diffusers backend (``blasst.diffusers.enable``) run
every attention call they serve as the dense probe and keep its histogram per component, layer,
phase and key length::

    with blasst.calibration.record() as rec:
        for n in (2048, 4096, 8192):
            model(input_ids[:, :n])          # or pipe(...): every denoise step is recorded
    cal = rec.fit()                          # one fit per layer plus the pooled one
    cal.save("model_dir/config.json", 0.5, layer_pattern="{}")   # names are module paths
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core, _recording
from ._skip import SkipSoftmax, SkipStats, SparseAttentionConfig

__all__ = ["fit", "record", "Calibration", "Recording", "DEFAULT_TARGETS", "PROBE_THRESHOLD"]

DEFAULT_TARGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_GRAN_KEYS = ("tile_keys", "rows", "heads", "split_tiles", "order")


def _gran_tuple(g) -> Optional[tuple]:
    if g is None:
        return None
    if not isinstance(g, Mapping):
        raise TypeError(f"granularity: expected a dict as SkipStats.granularity gives, got "
                        f"{type(g).__name__}")
    missing = [k for k in ("tile_keys", "rows", "heads") if k not in g]
    if missing:
        raise ValueError(f"granularity: missing {', '.join(missing)} (keys: {', '.join(_GRAN_KEYS)})")
    return (int(g["tile_keys"]), int(g["rows"]), int(g["heads"]), int(g.get("split_tiles", 0)),
            str(g.get("order", "natural")))


def _targets(targets) -> List[float]:
    """The fit's targets as floats (None: DEFAULT_TARGETS)."""
    try:
        return [float(t) for t in (DEFAULT_TARGETS if targets is None else targets)]
    except (TypeError, ValueError):
        raise ValueError(f"calibration: targets must be numbers, got {targets!r}") from None


def _sample_tuple(item, component: str, layer: str, phase: str, index: int) -> tuple:
    if isinstance(item, Mapping):
        source, length, gran = item.get("stats", item.get("histogram")), item.get("length"), \
            item.get("granularity")
    elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
        source, length = item[0], item[1]
        gran = item[2] if len(item) == 3 else None
    else:
        raise TypeError(f"calibration: sample {index}: expected (stats_or_histogram, Lk) or "
                        f"(stats_or_histogram, Lk, granularity), got {type(item).__name__}")
    if isinstance(length, bool) or not isinstance(length, int):
        try:
            import numbers
            if not isinstance(length, numbers.Integral):
                raise TypeError
            length = int(length)
        except TypeError:
            raise TypeError(f"calibration: sample {index}: Lk must be an int, got "
                            f"{type(length).__name__}") from None
    sources = list(source) if isinstance(source, (list, tuple)) else [source]
    stats, hists = [], []
    for s in sources:
        if isinstance(s, SkipStats):
            stats.append(s._raw)
        elif isinstance(s, _core.SkipStats):
            stats.append(s)
        else:
            import numpy as np
            a = np.asarray(s)
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise TypeError(f"calibration: sample {index}: expected SkipStats or a 1-D integer "
                                f"histogram array, got {type(s).__name__} "
                                f"(ndim {a.ndim}, dtype {a.dtype})")
            if a.dtype.kind == "i" and a.size and a.min() < 0:
                raise ValueError(f"calibration: sample {index}: negative histogram count")
            hists.append(np.ascontiguousarray(a, dtype=np.uint64))
    if not sources:
        raise ValueError(f"calibration: sample {index}: no statistics or histograms")
    return (component, layer, phase, length, stats, hists, _gran_tuple(gran))


class Calibration:
    """A fitted calibration (C++ ``CalibrationResult`` with its ``ValidationReport``).

    ``fits``: every fit as a dict (component, layer ("" = pooled), phase, granularity, a, b, r2,
    lengths, range (lo, hi), max_sparsity, points, extrapolated, inverse_law, warnings, piecewise,
    curve_error...), pooled fits first. ``validation``: the fits applied back to the samples
    (tolerance, max_error, max_error_fixed, max_error_curve, ok, curve_ok, rows with lambda and
    achieved per (layer, length, target)).
    """

    def __init__(self, raw, tolerance: float):
        self._raw = raw
        self.tolerance = float(tolerance)
        self.fits: List[Dict[str, Any]] = list(raw.fits)
        self.targets: List[float] = list(raw.targets)
        self.validation: Dict[str, Any] = raw.validate(None, self.tolerance)

    def fit_for(self, layer: str = "", phase: Optional[str] = None,
                component: str = "default") -> Dict[str, Any]:
        """The fit of one layer ("" = pooled over layers) and phase (default: the only one)."""
        found = [f for f in self.fits if f["layer"] == layer and f["component"] == component
                 and (phase is None or f["phase"] == phase)]
        if not found:
            raise KeyError(f"no fit for component {component!r}, layer {layer!r}, phase {phase!r}")
        if len(found) > 1:
            raise KeyError("several fits match (prefill and decode): pass phase=")
        return found[0]

    @property
    def a(self) -> float:
        return self.fit_for()["a"]

    @property
    def b(self) -> float:
        return self.fit_for()["b"]

    @property
    def r2(self) -> float:
        return self.fit_for()["r2"]

    @property
    def piecewise(self):
        """(targets, log_factors, finite_size or None) of the pooled fit, as SkipConfig.piecewise."""
        return self.fit_for()["piecewise"]

    def validate(self, targets: Optional[Sequence[float]] = None,
                 tolerance: Optional[float] = None) -> Dict[str, Any]:
        """Validation at other targets or tolerance (C++ validate on the calibration samples)."""
        return self._raw.validate(None if targets is None else [float(t) for t in targets],
                                  self.tolerance if tolerance is None else float(tolerance))

    def sparsity_at(self, sample: int, lam: float) -> float:
        """Sparsity of the sample's pooled curve (index in the order passed) at lambda."""
        return self._raw.sparsity_at(int(sample), float(lam))

    def _configs(self, target_sparsity, target_decode, disabled_until_timestep, ignore,
                 layer_pattern):
        td = target_sparsity if target_decode is None else target_decode
        return self._raw.to_configs(float(target_sparsity), float(td), disabled_until_timestep,
                                    [str(p) for p in (ignore or [])], str(layer_pattern))

    def to_config(self, target_sparsity: float = 0.5, *, target_decode: Optional[float] = None,
                  disabled_until_timestep: Optional[float] = None,
                  ignore: Optional[Iterable[str]] = None, layer_pattern: str = "{}"
                  ) -> Union[SparseAttentionConfig, Dict[str, SparseAttentionConfig]]:
        """The SPEC §7 config (C++ to_configs): one SparseAttentionConfig, or {component: config}
        when the samples named several components."""
        cfgs = self._configs(target_sparsity, target_decode, disabled_until_timestep, ignore,
                             layer_pattern)
        out = {name: SparseAttentionConfig(raw, "<calibration>") for name, raw in cfgs}
        if len(out) == 1 and "default" in out:
            return out["default"]
        return out

    def to_json(self, target_sparsity: float = 0.5, **kw) -> str:
        cfg = self.to_config(target_sparsity, **kw)
        if isinstance(cfg, dict):
            raise ValueError("to_json: several components; use save(model_dir)")
        return cfg._raw.to_json()

    def save(self, path: Union[str, os.PathLike], target_sparsity: float = 0.5, **kw) -> List[str]:
        """Write the config (C++ config writer: the block is inserted into an existing config.json,
        other keys kept). One component: ``path`` is the config.json (a directory gets
        ``path/config.json``); several: ``path`` is the model directory, one
        ``path/<component>/config.json`` each. Returns the files written."""
        cfgs = self._configs(target_sparsity, kw.pop("target_decode", None),
                             kw.pop("disabled_until_timestep", None), kw.pop("ignore", None),
                             kw.pop("layer_pattern", "{}"))
        if kw:
            raise TypeError(f"save: unexpected arguments {', '.join(kw)}")
        path = os.fspath(path)
        written = []
        if len(cfgs) == 1 and cfgs[0][0] == "default":
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            cfgs[0][1].write_into(path)
            written.append(path)
        else:
            for name, raw in cfgs:
                p = os.path.join(path, name, "config.json")
                os.makedirs(os.path.dirname(p), exist_ok=True)
                raw.write_into(p)
                written.append(p)
        return written


# -- calibration from a model run -------------------------------------------------------------------
# The probe's lambda: below every recordable delta (the histogram's lowest edge is e^-64, SPEC §5),
# so the probe skips nothing the histogram can tell apart from dense; the running maxima, and so the
# histogram, do not depend on lambda (SPEC §5).
PROBE_THRESHOLD = 1e-30


class Recording:
    """What a ``record()`` block collected: per (component, layer, phase, key length) the
    histogram statistics of every call, pooled at ``fit`` time.

    ``samples``: {(component, layer, phase, Lk): [SkipStats, ...]}; ``calls``: the number of
    calls recorded; ``masks``: per prefill (component, layer) the set of (mask, Lq == Lk) seen.
    The probe (``probe``) is a SkipSoftmax at PROBE_THRESHOLD with the order and vote geometry
    given to ``record()``: the deltas are counted at the granularity the deployed path uses
    (SPEC §5; the statistics report it and ``fit`` refuses to mix granularities).
    """

    def __init__(self, probe: SkipSoftmax):
        self.probe = probe
        self.samples: Dict[Tuple[str, str, str, int], List[SkipStats]] = {}
        self.masks: Dict[Tuple[str, str], set] = {}
        self.calls = 0
        self._lock = threading.Lock()

    # Called by the framework backends (blasst.transformers, blasst.diffusers) once per call.
    def new_stats(self) -> SkipStats:
        return SkipStats(histogram=True)

    def add(self, component: str, layer: str, phase: str, lq: int, lk: int, causal: bool,
            stats: SkipStats) -> None:
        if phase not in ("prefill", "decode"):
            raise ValueError(f"Recording.add: phase must be 'prefill' or 'decode', got {phase!r}")
        with self._lock:
            self.samples.setdefault((component, layer, phase, int(lk)), []).append(stats)
            if phase == "prefill":
                self.masks.setdefault((component, layer), set()).add(
                    ("causal" if causal else "full", int(lq) == int(lk)))
            self.calls += 1

    def lengths(self, phase: Optional[str] = None) -> List[int]:
        """The key lengths recorded (in one phase, or in any)."""
        return sorted({k[3] for k in self.samples if phase is None or k[2] == phase})

    def layers(self, phase: Optional[str] = None) -> List[Tuple[str, str]]:
        """(component, layer) of every layer recorded (in one phase, or in any)."""
        return sorted({(k[0], k[1]) for k in self.samples if phase is None or k[2] == phase})

    def mask(self) -> Optional[str]:
        """The prefill mask for the finite-size term (SPEC §6): "causal" or "full" when every
        prefill call had that mask and Lq == Lk (the term's geometry), else None."""
        seen = set().union(*self.masks.values()) if self.masks else set()
        if len(seen) == 1:
            m, square = next(iter(seen))
            if square:
                return m
        return None

    def fit(self, targets: Optional[Sequence[float]] = None, *, phases: Optional[Sequence[str]] = None,
            per_layer: bool = True, finite_size: bool = True, allow_any_target: bool = False,
            tolerance: float = 0.03) -> "Calibration":
        """The SPEC §6 fit of what was recorded (C++ calibrate(), as ``fit``): per component and
        phase a pooled fit over the layers, and with ``per_layer`` one fit per layer. ``phases``
        picks "prefill" / "decode" (default: those recorded). A fit needs two or more key
        lengths; a layer recorded at one length gets the C++ fit's warning, not an error."""
        with self._lock:
            items = sorted(self.samples.items())
        if not items:
            raise ValueError("Recording.fit: nothing was recorded (no attention call went "
                             "through blasst inside the record() block: attn_implementation="
                             "'blasst' for transformers, blasst.diffusers.enable for diffusers)")
        have = sorted({k[2] for k, _ in items})
        want = have if phases is None else [str(p) for p in phases]
        bad = [p for p in want if p not in ("prefill", "decode")]
        if bad:
            raise ValueError(f"Recording.fit: phases must be 'prefill' / 'decode', got {bad}")
        missing = [p for p in want if p not in have]
        if missing:
            raise ValueError(f"Recording.fit: no {', '.join(missing)} call was recorded "
                             f"(recorded: {', '.join(have)})")
        tuples = [(c, l if per_layer else "", ph, lk, [st._raw for st in sts], [], None)
                  for (c, l, ph, lk), sts in items if ph in want]
        tg = _targets(targets)
        mask = self.mask() if "prefill" in want else None
        raw = _core.Calibration.fit(tuples, tg, bool(allow_any_target), bool(per_layer), mask,
                                    bool(finite_size))
        return Calibration(raw, tolerance)

    def __repr__(self) -> str:
        return (f"blasst.calibration.Recording(calls={self.calls}, layers={len(self.layers())}, "
                f"lengths={self.lengths()})")


@contextlib.contextmanager
def record(*, order: str = "max_first", tile_keys: int = 128, vote_rows: int = 64,
           vote_heads: int = 1, split_tiles: int = 0) -> Iterator[Recording]:
    """Record the one-pass curves of a model run for ``Recording.fit`` (eager calls only).

    While the block runs, every attention call served by blasst's transformers backend
    (``attn_implementation="blasst"``; layers named as ``blasst.transformers`` names them,
    component "default") or by its diffusers backend (the layers ``blasst.diffusers.enable``
    routed; component = the pipeline component, layer = the module path) runs as the probe,
    ``SkipSoftmax(threshold=PROBE_THRESHOLD, order=order, ...)``, with a histogram, in place
    of the layer's own settings. ``order`` and the vote geometry are those the deployed config
    will use (the CPU reference takes them; the CUDA kernels use their own vote groups, which
    the statistics report). Calls the backends delegate elsewhere (attention masks, dropout,
    ignored layers, unsupported inputs) are not recorded. One recording at a time.

    The saved config holds a group per recorded layer and a catch-all group with the pooled fit,
    which also matches layers that were not recorded: give ``save(..., ignore=patterns)`` for
    those that must stay dense (e.g. ``blasst.diffusers.DEFAULT_IGNORE``, cross-attention)."""
    probe = SkipSoftmax(threshold=PROBE_THRESHOLD, order=order, tile_keys=tile_keys,
                        vote_rows=vote_rows, vote_heads=vote_heads, split_tiles=split_tiles)
    rec = Recording(probe)
    with _recording.calibrating(rec):
        yield rec


def fit(samples, targets: Optional[Sequence[float]] = None, phase: str = "prefill", *,
        component: str = "default", mask: Optional[str] = None, finite_size: bool = True,
        allow_any_target: bool = False, tolerance: float = 0.03) -> Calibration:
    """Fit the SPEC §6 calibration of recorded curves with the C++ calibrate().

    samples: a list of samples (module docstring) pooled over layers, or ``{layer: samples}`` for
    one fit per layer plus the pooled one. phase: "prefill" or "decode" for every sample (or
    ``{phase: samples}`` one level up: ``{"prefill": ..., "decode": ...}``). targets: default
    0.1..0.9 (each in [0.1, 0.9] unless allow_any_target). mask ("causal"/"full", prefill only):
    enables the finite-size variant of the richer form (kept when it fits better). tolerance: the
    validation's (SPEC §6: 0.03).
    """
    if isinstance(samples, Mapping) and samples and set(samples) <= {"prefill", "decode"}:
        by_phase = dict(samples)
    else:
        by_phase = {phase: samples}
    tuples: list = []
    per_layer = False
    for ph, smp in by_phase.items():
        if ph not in ("prefill", "decode"):
            raise ValueError(f"phase: must be 'prefill' or 'decode', got {ph!r}")
        if isinstance(smp, Mapping):
            per_layer = True
            for layer, items in smp.items():
                if not str(layer):
                    raise ValueError("calibration: a layer name must not be empty")
                for it in items:
                    tuples.append(_sample_tuple(it, component, str(layer), ph, len(tuples)))
        elif isinstance(smp, (list, tuple)):
            for it in smp:
                tuples.append(_sample_tuple(it, component, "", ph, len(tuples)))
        else:
            raise TypeError(f"calibration: samples must be a list or a {{layer: samples}} dict, "
                            f"got {type(smp).__name__}")
    if not tuples:
        raise ValueError("calibration: no samples")
    tg = _targets(targets)
    if not tg:
        raise ValueError("calibration: no targets")
    if mask is not None and mask not in ("causal", "full"):
        raise ValueError(f"mask: must be 'causal', 'full' or None, got {mask!r}")
    raw = _core.Calibration.fit(tuples, tg, bool(allow_any_target), per_layer, mask,
                                bool(finite_size))
    return Calibration(raw, tolerance)
