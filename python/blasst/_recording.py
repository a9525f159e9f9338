"""The statistics recorders of the framework integrations (blasst.transformers, blasst.diffusers):
each keeps a list of the recorders active now, under a lock; ``active`` adds one for the duration
of a with block. ``calibrating`` does the same for the one blasst.calibration.record() block that
may be active, which both integrations consult per call."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List


@contextlib.contextmanager
def active(recorders: List[Any], lock: threading.Lock, rec: Any) -> Iterator[Any]:
    """Register rec in recorders while the block runs; yield it."""
    with lock:
        recorders.append(rec)
    try:
        yield rec
    finally:
        with lock:
            recorders.remove(rec)


# The blasst.calibration.record() block in force (at most one): while it is, the framework
# backends run each attention call they serve as its probe and hand it the statistics.
_calibration: List[Any] = []
_calibration_lock = threading.Lock()


def calibration() -> Any:
    """The active blasst.calibration.Recording, or None."""
    return _calibration[0] if _calibration else None


@contextlib.contextmanager
def calibrating(rec: Any) -> Iterator[Any]:
    """Make rec the active calibration recording while the block runs (one at a time)."""
    with _calibration_lock:
        if _calibration:
            raise RuntimeError("blasst.calibration.record: another recording is active; "
                               "nest nothing, finish the first block")
        _calibration.append(rec)
    try:
        yield rec
    finally:
        with _calibration_lock:
            _calibration.remove(rec)


def needs_grad(*ts) -> bool:
    """Whether autograd records a call on these tensors (grad mode on, one of them requires
    grad): the integrations then run blasst's differentiable op, which takes no statistics."""
    import torch
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def stats_counts(stats: Any) -> dict:
    """The visited / skipped / gated counts the StatsRecorders read, from a dict or a SkipStats;
    None (a call that ran under autograd, without statistics): a blasst call with no pairs."""
    if stats is None:
        return {"visited": 0, "skipped": 0, "gated": False}
    if isinstance(stats, dict):
        return stats
    return {"visited": stats.total_visited, "skipped": stats.total_skipped,
            "gated": bool(getattr(stats, "gated", False))}
