"""Issue 21 through the Python API: hostile configs are refused quickly with a message naming the
file and the JSON path, and a NaN in q propagates to that row of the output and LSE (the NaN
rule of docs/reference.md) instead of giving zeros and -inf."""
import json
import os
import time

import numpy as np
import pytest

import blasst


def deep_config(levels):
    block = {"config_groups": {"g": {"threshold_scale_factor": 3}}}
    # json.dumps cannot write this deep (RecursionError): the text is put together by hand.
    return ('{"sparse_attention_config": ' + json.dumps(block) + ', "meta": ' + "[" * levels +
            "]" * levels + ', "sibling": 1}')


def test_deep_nesting_is_refused_quickly(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(deep_config(150000))
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"config\.json: <root>\.meta\[0\].*nested deeper than 64 levels"):
        blasst.load_config(str(p))
    assert time.monotonic() - t0 < 5.0
    # 64 levels (the top-level object and 63 arrays) are still a config.
    p.write_text(deep_config(63))
    assert blasst.load_config(str(p)).group_names == ["g"]


def test_many_groups_load_in_linear_time(tmp_path):
    n = 100000
    groups = {f"group_{i}": {"threshold_scale_factor": i + 1.0} for i in range(n)}
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"sparse_attention_config": {"config_groups": groups}}))
    t0 = time.monotonic()
    cfg = blasst.load_config(str(p))
    assert time.monotonic() - t0 < 5.0
    names = cfg.group_names
    assert len(names) == n and names[0] == "group_0" and names[-1] == f"group_{n - 1}"


def test_duplicate_keys_and_hostile_names(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"config_groups": {"g": {"threshold_scale_factor": 1}, "g": {"threshold_scale_factor": 2}}}')
    with pytest.raises(ValueError, match=r"<root>\.config_groups: duplicate key 'g'"):
        blasst.load_config(str(p))
    p.write_text(json.dumps({"config_groups": {"g\n\x1b[2J" + "x" * 100000: {"algorithm": "top\nk"}}}))
    with pytest.raises(ValueError) as e:
        blasst.load_config(str(p))
    msg = str(e.value)
    assert len(msg) < 400 and "\n" not in msg and "\x1b" not in msg
    assert "config_groups['g\\n\\x1b[2Jxxx" in msg and "unknown algorithm 'top\\nk'" in msg


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_is_refused_not_read(tmp_path):
    p = tmp_path / "config.json"
    os.mkfifo(p)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"config\.json: is a FIFO; inputs must be regular files"):
        blasst.load_config(str(p))
    assert time.monotonic() - t0 < 5.0


def test_nan_in_q_gives_nan_in_that_row():
    rng = np.random.default_rng(2121)
    q = rng.standard_normal((1, 50, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 70, 2, 16)).astype(np.float32)
    v = rng.standard_normal((1, 70, 2, 16)).astype(np.float32)
    q[0, 20, 1, 3] = np.nan
    out, lse = blasst.attention(q, k, v, return_lse=True)
    nan_rows = np.isnan(out).any(axis=-1)
    assert nan_rows[0, 20, 1] and np.isnan(out[0, 20, 1]).all() and np.isnan(lse[0, 1, 20])
    nan_rows[0, 20, 1] = False
    assert not nan_rows.any() and np.isfinite(np.delete(lse[0, 1], 20)).all() and np.isfinite(lse[0, 0]).all()
    clean = q.copy()
    clean[0, 20, 1, 3] = 0.0
    ref = blasst.attention(clean, k, v)
    keep = np.ones((50, 2), dtype=bool)
    keep[20, 1] = False
    np.testing.assert_array_equal(out[0][keep], ref[0][keep])  # the other rows are untouched
