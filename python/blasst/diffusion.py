"""Timestep gating for diffusion pipelines (SPEC §4).

The pipeline publishes, once per denoise step, where it stands: ``record_denoise_step(timestep,
num_train_timesteps)`` (t = timestep / num_train_timesteps) or, for rectified-flow schedulers,
``record_sigma(sigma)``. t runs 1.0 -> 0.0. An attention call whose SkipSoftmax carries
``disabled_until_timestep = D`` skips only once t <= D; with D set and nothing published it runs
dense and warns once. The gate is module-level: one pipeline per process (call ``reset()`` between
generations). It is read on the host at call time, so it is not captured into CUDA graphs; under
torch.compile it is read inside the custom op, at run time.

The rule is the C++ one (blasst::TimestepGate in include/blasst/gating.hpp, bound as
_core.TimestepGate): it checks what is published and decides whether a call may skip. This module
keeps the published t in one gate and gives the one warning through Python's warnings module.
"""
from __future__ import annotations

import warnings
from typing import Optional

from . import _core

_published = _core.TimestepGate()  # no D of its own: it holds the published t
_warned = False


def record_denoise_step(timestep: float, num_train_timesteps: float) -> float:
    """Publish the current denoise step; returns t = timestep / num_train_timesteps.

    Pass the scheduler's timestep (e.g. 999 ... 0) and its num_train_timesteps (e.g. 1000): the
    steps are spaced unevenly, so the step index would be wrong.
    """
    _published.record_timestep(float(_scalar(timestep)), float(num_train_timesteps))
    return _published.current


def record_sigma(sigma: float) -> float:
    """Rectified-flow schedulers: publish sigma in [0, 1] directly."""
    _published.record_sigma(float(_scalar(sigma)))
    return _published.current


def reset() -> None:
    """Forget the published step (a new generation); re-arms the one-time warning."""
    global _warned
    _published.reset()
    _warned = False


def current() -> Optional[float]:
    """The published t, or None."""
    return _published.current


def active(disabled_until: Optional[float]) -> bool:
    """May a call gated at D = disabled_until skip now? (SPEC §4)"""
    global _warned
    t = _published.current
    if t is None and disabled_until is not None:
        # The case the C++ gate answers with a line on stderr: here it is one RuntimeWarning per
        # generation instead, so the C++ gate is not asked.
        if not _warned:
            _warned = True
            warnings.warn(
                "blasst: a SkipSoftmax has disabled_until_timestep set but no denoise step was "
                "published (blasst.diffusion.record_denoise_step / record_sigma); running dense",
                RuntimeWarning, stacklevel=3)
        return False
    gate = _core.TimestepGate(disabled_until)
    if t is not None:
        gate.record_sigma(t)  # the published t, already checked: the gate takes it as it is
    return gate.active()


def _scalar(x):
    # Accept 0-d tensors/arrays from schedulers (torch timesteps are tensors).
    item = getattr(x, "item", None)
    return item() if callable(item) else x
