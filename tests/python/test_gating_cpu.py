"""SPEC §4 timestep gating through blasst.diffusion."""
import warnings

import pytest

import blasst
from test_skip_cpu import dominant_first_tile


def run(rng, skip):
    q, k, v = dominant_first_tile(rng)
    stats = {}
    blasst.attention(q, k, v, skip=skip, stats=stats)
    return stats


def test_no_step_published_runs_dense_with_one_warning(rng):
    skip = blasst.SkipSoftmax(threshold=1e-2, disabled_until_timestep=0.5, order="natural")
    with pytest.warns(RuntimeWarning, match="no denoise step was published"):
        st = run(rng, skip)
    assert st["skipped"] == 0 and st["gated"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call must not warn again
        st = run(rng, skip)
    assert st["skipped"] == 0


def test_gate_opens_when_t_drops_below_D(rng):
    skip = blasst.SkipSoftmax(threshold=1e-2, disabled_until_timestep=0.5, order="natural")
    assert blasst.diffusion.record_denoise_step(900, 1000) == pytest.approx(0.9)
    st = run(rng, skip)
    assert st["skipped"] == 0 and st["gated"]
    blasst.diffusion.record_denoise_step(500, 1000)  # t == D: active
    st = run(rng, skip)
    assert st["skipped"] == 6 and not st["gated"]
    blasst.diffusion.record_sigma(0.1)
    assert run(rng, skip)["skipped"] == 6


def test_ungated_skip_ignores_the_timestep(rng):
    blasst.diffusion.record_denoise_step(999, 1000)
    assert run(rng, blasst.SkipSoftmax(threshold=1e-2, order="natural"))["skipped"] == 6


def test_reset_forgets_t():
    blasst.diffusion.record_sigma(0.3)
    assert blasst.diffusion.current() == pytest.approx(0.3)
    blasst.diffusion.reset()
    assert blasst.diffusion.current() is None


@pytest.mark.parametrize("call", [
    lambda: blasst.diffusion.record_sigma(1.5),
    lambda: blasst.diffusion.record_sigma(float("nan")),
    lambda: blasst.diffusion.record_denoise_step(1200, 1000),
    lambda: blasst.diffusion.record_denoise_step(-1, 1000),
    lambda: blasst.diffusion.record_denoise_step(10, 0),
])
def test_out_of_range_steps_are_errors(call):
    with pytest.raises(ValueError):
        call()


def test_scheduler_tensor_like_timestep():
    class Scalar:  # what a scheduler's 0-d tensor looks like
        def item(self):
            return 250.0
    assert blasst.diffusion.record_denoise_step(Scalar(), 1000) == pytest.approx(0.25)
