"""SPEC §2b FP8 screen through the Python API (CPU reference): settings, pickling, statistics."""
import pickle

import numpy as np
import pytest

import blasst


def sink_inputs(rng, L=512, H=2, d=64):
    """Random data with a dominant key 0 (every query row leans on it), so later tiles fall far
    below the running max and the strict screen has tiles to skip."""
    u = rng.standard_normal(d).astype(np.float32)
    u /= np.linalg.norm(u)
    q = rng.standard_normal((1, L, H, d)).astype(np.float32) + 4.0 * u
    k = rng.standard_normal((1, L, H, d)).astype(np.float32)
    k[0, 0] = 20.0 * u
    v = rng.standard_normal((1, L, H, d)).astype(np.float32)
    return q, k, v


def run(q, k, v, skip, record=False):
    st = blasst.SkipStats(record_deltas=record)
    out, lse = blasst.attention(q, k, v, skip=skip, stats=st, return_lse=True)
    return out, lse, st


def test_settings_round_trip_and_validate():
    s = blasst.SkipSoftmax(threshold=0.1, screen="tight", screen_z=4.5)
    assert (s.screen, s.screen_z) == ("tight", 4.5)
    t = blasst.SkipSoftmax.from_fields(s.fields())
    assert t == s and t.screen == "tight" and t.screen_z == 4.5
    assert pickle.loads(pickle.dumps(s)) == s
    assert blasst.SkipSoftmax(threshold=0.1) != s
    assert blasst.SkipSoftmax(threshold=0.1).screen == "off"
    assert "screen='tight'" in repr(s)
    # fields of an older build (13 entries) read as screen off
    old = blasst.SkipSoftmax.from_fields(blasst.SkipSoftmax(threshold=0.1).fields()[:13])
    assert old.screen == "off"
    with pytest.raises(ValueError, match="screen must be one of"):
        blasst.SkipSoftmax(threshold=0.1, screen="loose")
    with pytest.raises(Exception, match="skip.screen.z must be finite and >= 0"):
        blasst.SkipSoftmax(threshold=0.1, screen="tight", screen_z=float("nan"))
    with pytest.raises(Exception, match="skip.screen.z must be finite and >= 0"):
        blasst.SkipSoftmax(threshold=0.1, screen="tight", screen_z=-1.0)


def test_screen_ahead_settings_round_trip_and_validate():
    s = blasst.SkipSoftmax(threshold=0.1, screen="strict", screen_ahead=True)
    assert s.screen_ahead and s.screen == "strict"
    t = blasst.SkipSoftmax.from_fields(s.fields())
    assert t == s and t.screen_ahead
    assert pickle.loads(pickle.dumps(s)) == s
    assert s != blasst.SkipSoftmax(threshold=0.1, screen="strict")
    assert "screen_ahead=True" in repr(s)
    assert not blasst.SkipSoftmax(threshold=0.1, screen="strict").screen_ahead
    # fields of an older build (15 entries) read as screen ahead off
    old = blasst.SkipSoftmax.from_fields(s.fields()[:15])
    assert old.screen == "strict" and not old.screen_ahead
    with pytest.raises(ValueError, match="screen_ahead must be a bool"):
        blasst.SkipSoftmax(threshold=0.1, screen="strict", screen_ahead=1)
    # the C++ check: the screen ahead needs a margin, also on a dense configuration
    with pytest.raises(Exception, match="the screen ahead needs a margin"):
        blasst.SkipSoftmax(threshold=0.1, screen_ahead=True)
    with pytest.raises(Exception, match="the screen ahead needs a margin"):
        blasst.SkipSoftmax.from_fields(blasst.SkipSoftmax.dense().fields()[:15] + (True,))


def test_strict_screen_ahead_equals_plain_skip_and_screens_a_subset(rng):
    """SPEC §2b's theorem through the API: the strict screen ahead has no wrong screen, its
    screened pairs are at most those of the screen in the loop, and the output is the plain
    skip path's; the sink input makes it screen something."""
    q, k, v = sink_inputs(rng)
    plain = blasst.SkipSoftmax(threshold=0.2, order="natural")
    loop = blasst.SkipSoftmax(threshold=0.2, order="natural", screen="strict")
    ahead = blasst.SkipSoftmax(threshold=0.2, order="natural", screen="strict", screen_ahead=True)
    o0, l0, s0 = run(q, k, v, plain)
    _, _, s1 = run(q, k, v, loop)
    o2, l2, s2 = run(q, k, v, ahead)
    assert s2.total_screened > 0, "nothing screened ahead: the case this test exists for did not happen"
    assert s2.total_screen_wrong == 0
    assert all(a <= b for a, b in zip(s2.screened, s1.screened))
    assert s2.skipped == s0.skipped and s2.visited == s0.visited
    assert np.array_equal(o0, o2) and np.array_equal(l0, l2)


def test_strict_screen_equals_plain_skip_with_screened_pairs(rng):
    q, k, v = sink_inputs(rng)
    plain = blasst.SkipSoftmax(threshold=0.2, order="natural")
    strict = blasst.SkipSoftmax(threshold=0.2, order="natural", screen="strict")
    o0, l0, s0 = run(q, k, v, plain, record=True)
    o1, l1, s1 = run(q, k, v, strict, record=True)
    assert s0.screened == [] and s0.total_screened == 0
    assert s1.total_screened > 0 and s1.total_screen_wrong == 0
    assert len(s1.screened) == len(s1.visited) == 2
    assert s1.skipped == s0.skipped and s1.total_skipped > s1.total_screened
    assert np.array_equal(o0, o1) and np.array_equal(l0, l1)
    sd = np.asarray(s1.screen_deltas)
    assert sd.shape == np.asarray(s1.deltas).shape
    assert int((sd < np.log(0.2)).sum()) == s1.total_screened
    assert np.all(sd >= np.asarray(s1.deltas))  # strict: delta8 bounds the exact delta


def test_tight_zero_counts_wrong_screens_and_its_skips(rng):
    q = rng.standard_normal((1, 256, 1, 32)).astype(np.float32) * 1.6
    k = rng.standard_normal((1, 1024, 1, 32)).astype(np.float32) * 1.6
    v = rng.standard_normal((1, 1024, 1, 32)).astype(np.float32)
    z0 = blasst.SkipSoftmax(threshold=0.3, order="natural", vote_rows=1, tile_keys=64,
                            screen="tight", screen_z=0.0)
    _, _, st = run(q, k, v, z0)
    assert st.total_screen_wrong > 0
    assert st.total_screened >= st.total_screen_wrong
    assert st.total_skipped >= st.total_screened
