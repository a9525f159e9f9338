"""Timestep gating for diffusion pipelines (SPEC §4).

The pipeline publishes, once per denoise step, where it stands: ``record_denoise_step(timestep,
num_train_timesteps)`` (t = timestep / num_train_timesteps) or, for rectified-flow schedulers,
``record_sigma(sigma)``. t runs 1.0 -> 0.0. An attention call whose SkipSoftmax carries
``disabled_until_timestep = D`` skips only once t <= D; with D set and nothing published it runs
dense and warns once. The gate is module-level: one pipeline per process (call ``reset()`` between
generations). It is read on the host at call time, so it is not captured into CUDA graphs; under
torch.compile it is read inside the custom op, at run time.
"""
from __future__ import annotations

import math
import threading
import warnings
from typing import Optional

_lock = threading.Lock()
_t: Optional[float] = None
_warned = False


def _publish(t: float, what: str) -> None:
    global _t
    if not math.isfinite(t) or t < 0.0 or t > 1.0:
        raise ValueError(f"{what}: must land in [0, 1], got {t!r}")
    with _lock:
        _t = float(t)


def record_denoise_step(timestep: float, num_train_timesteps: float) -> float:
    """Publish the current denoise step; returns t = timestep / num_train_timesteps.

    Pass the scheduler's timestep (e.g. 999 ... 0) and its num_train_timesteps (e.g. 1000): the
    steps are spaced unevenly, so the step index would be wrong.
    """
    ts = float(_scalar(timestep))
    n = float(num_train_timesteps)
    if not math.isfinite(n) or n <= 0.0:
        raise ValueError(f"num_train_timesteps: must be a positive number, got {num_train_timesteps!r}")
    if not math.isfinite(ts):
        raise ValueError(f"timestep: must be finite, got {timestep!r}")
    t = ts / n
    _publish(t, f"timestep / num_train_timesteps ({ts!r} / {n!r})")
    return t


def record_sigma(sigma: float) -> float:
    """Rectified-flow schedulers: publish sigma in [0, 1] directly."""
    s = float(_scalar(sigma))
    _publish(s, "sigma")
    return s


def reset() -> None:
    """Forget the published step (a new generation); re-arms the one-time warning."""
    global _t, _warned
    with _lock:
        _t = None
        _warned = False


def current() -> Optional[float]:
    """The published t, or None."""
    return _t


def active(disabled_until: Optional[float]) -> bool:
    """May a call gated at D = disabled_until skip now? (SPEC §4)"""
    global _warned
    if disabled_until is None:
        return True
    t = _t
    if t is None:
        if not _warned:
            _warned = True
            warnings.warn(
                "blasst: a SkipSoftmax has disabled_until_timestep set but no denoise step was "
                "published (blasst.diffusion.record_denoise_step / record_sigma); running dense",
                RuntimeWarning, stacklevel=3)
        return False
    return t <= disabled_until


def _scalar(x):
    # Accept 0-d tensors/arrays from schedulers (torch timesteps are tensors).
    item = getattr(x, "item", None)
    return item() if callable(item) else x
