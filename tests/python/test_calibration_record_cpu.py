"""blasst.calibration.record(): calibration from a model run through the transformers and
diffusers backends (CPU tensors, reference engine).

Expected values are independent of the recorder: visited pair counts from the SPEC §5 geometry
(a closed count written here), and the one-pass property of SPEC §5 (the running maxima do not
depend on lambda), checked against a second run of the same model with a real skip setting: the
first layer's inputs do not depend on attention, so its achieved sparsity at lambda must equal the
recorded curve at lambda (exactly at a histogram bin edge, inside the bracketing edges elsewhere).
Each test asserts that its case happened (calls recorded, tiles skipped in the real run).
"""
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

import blasst  # noqa: E402
import blasst.diffusers as bd  # noqa: E402
import blasst.transformers as bt  # noqa: E402
from test_diffusers_cpu import inputs, run, tiny_wan  # noqa: E402
from test_transformers import prefill_and_decode, sink_prompt, tiny_llama  # noqa: E402

TILE, ROWS = 32, 16                # CPU-sized vote geometry (the kernels use 128 x 64)
BIN_LO, BIN_W = -64.0, 1.0 / 16.0  # SPEC §5 histogram edges: -64 + i / 16
HQ = 4                             # tiny_llama: 4 query heads, 2 KV heads


def causal_visited(lq, lk, rows=ROWS, tile=TILE):
    """SPEC §5: visited (vote group, key tile) pairs of one head, causal, bottom-right aligned:
    a group sees the tiles up to the one holding its last row's last visible key."""
    diag = lk - lq
    return sum((min(lk - 1, min(lq - 1, (g + 1) * rows - 1) + diag) // tile) + 1
               for g in range(-(-lq // rows)))


def bracket(stats, lam):
    """The recorded curve at the histogram edges on either side of ln(lam)."""
    pos = (math.log(lam) - BIN_LO) / BIN_W
    return (stats.sparsity_at(math.exp(BIN_LO + math.floor(pos) * BIN_W)),
            stats.sparsity_at(math.exp(BIN_LO + math.ceil(pos) * BIN_W)))


@pytest.fixture(scope="module", autouse=True)
def registered():
    return bt.register()


def llama():
    """A sink of moderate strength: layer 0's deltas then spread over e^-4 ... e^-1 at these
    lengths (a random-init model without one skips nothing, a strong sink everything)."""
    return tiny_llama("blasst", torch.float32, "cpu", layers=2, sink=True, sink_strength=1.5)


def prompt(n, seed=5):
    return sink_prompt(n, seed)


LENGTHS = (192, 384)


@pytest.fixture(scope="module")
def llama_recording():
    blasst.set_num_threads(2)
    model = llama()
    with torch.no_grad(), blasst.calibration.record(tile_keys=TILE, vote_rows=ROWS) as rec:
        for n in LENGTHS:
            prefill_and_decode(model, prompt(n), steps=2)
    return model, rec


def test_transformers_calls_recorded_per_layer_phase_and_length(llama_recording):
    _, rec = llama_recording
    names = [f"model.layers.{i}.self_attn" for i in range(2)]
    want = {("default", nm, "prefill", n) for nm in names for n in LENGTHS}
    want |= {("default", nm, "decode", n + s) for nm in names for n in LENGTHS for s in (1, 2)}
    assert set(rec.samples) == want
    assert rec.calls == len(want) and all(len(v) == 1 for v in rec.samples.values())
    assert rec.lengths("prefill") == list(LENGTHS)
    assert rec.mask() == "causal"  # every prefill call causal with Lq == Lk
    for (_, _, phase, lk), (st,) in rec.samples.items():
        g = st.granularity
        assert (g["tile_keys"], g["order"]) == (TILE, "max_first"), g
        if phase == "prefill":
            assert g["rows"] == ROWS
            assert st.total_visited == HQ * causal_visited(lk, lk), (lk, st.total_visited)
        else:  # one new token sees every cached key: all tiles, per vote group of the call
            assert st.total_visited * g["heads"] == HQ * -(-lk // TILE), (lk, g)
        # the probe skips nothing the histogram resolves
        assert st.sparsity_at(math.exp(BIN_LO)) == 0.0


def test_first_layer_curve_is_the_real_runs_sparsity(llama_recording):
    """SPEC §5's one-pass curve against a real skip run: layer 0 sees the same inputs."""
    model, rec = llama_recording
    n = LENGTHS[1]
    (st,) = rec.samples[("default", "model.layers.0.self_attn", "prefill", n)]
    for lam in (math.exp(-3.0), math.exp(-2.0), 0.3):  # two bin edges and a value between edges
        skip = blasst.SkipSoftmax(threshold=lam, order="max_first", tile_keys=TILE,
                                  vote_rows=ROWS)
        bt.register(skip)
        bt.clear_cache(model)  # skip_for caches a layer's settings on the module
        try:
            with torch.no_grad(), bt.record_stats() as real:
                model(prompt(n))
        finally:
            bt.register()
            bt.clear_cache(model)
        e = real.layers["model.layers.0.self_attn:prefill"]
        assert e["visited"] == st.total_visited
        achieved = e["skipped"] / e["visited"]
        assert achieved > 0.0, lam  # the real run skipped tiles
        lo, hi = bracket(st, lam)
        if lo == hi or abs((math.log(lam) - BIN_LO) / BIN_W % 1.0) < 1e-9:
            assert achieved == pytest.approx(st.sparsity_at(lam), abs=1e-12), lam
        assert lo - 1e-12 <= achieved <= hi + 1e-12, (lam, lo, achieved, hi)


def test_fit_save_load_and_apply(llama_recording, tmp_path):
    model, rec = llama_recording
    targets = (0.3, 0.5, 0.7)
    cal = rec.fit(targets, phases=["prefill"])
    layers = {f["layer"] for f in cal.fits}
    assert layers == {"", "model.layers.0.self_attn", "model.layers.1.self_attn"}
    assert all(f["phase"] == "prefill" and f["lengths"] == list(LENGTHS) for f in cal.fits)
    path = tmp_path / "config.json"
    assert cal.save(path, 0.5) == [str(path)]
    cfg = blasst.load_config(str(path))
    # the saved lambdas are the fit's own, to the last bit, per layer and length
    for f in cal.fits:
        if not f["layer"]:
            continue
        skip = cfg.skip_softmax(layer=f["layer"], phase="prefill")
        assert skip.enabled and skip.order == "max_first"
        for n in LENGTHS:
            rows = [r for r in cal.validation["rows"]
                    if r["layer"] == f["layer"] and r["length"] == n and r["target"] == 0.5]
            assert len(rows) == 1, rows
            assert skip.lambda_for(n) == rows[0]["lambda_curve"], (f["layer"], n)
    # applied through the model's own config: layer 0 achieves what its recorded curve says
    import json
    model.config.sparse_attention_config = json.loads(path.read_text())["sparse_attention_config"]
    bt.clear_cache(model)
    try:
        n = LENGTHS[1]
        with torch.no_grad(), bt.record_stats() as real:
            model(prompt(n))
        e = real.layers["model.layers.0.self_attn:prefill"]
        assert e["skipped"] > 0
        (st,) = rec.samples[("default", "model.layers.0.self_attn", "prefill", n)]
        lam = cfg.skip_softmax(layer="model.layers.0.self_attn", phase="prefill").lambda_for(n)
        lo, hi = bracket(st, lam)
        assert lo - 1e-12 <= e["skipped"] / e["visited"] <= hi + 1e-12
    finally:
        del model.config.sparse_attention_config
        bt.clear_cache(model)


def test_decode_fit_from_the_cached_steps(llama_recording):
    _, rec = llama_recording
    cal = rec.fit((0.3, 0.5), phases=["decode"], per_layer=False)
    (f,) = cal.fits
    assert f["phase"] == "decode" and f["layer"] == ""
    assert f["lengths"] == sorted(n + s for n in LENGTHS for s in (1, 2))


def test_diffusers_components_and_layers(tmp_path):
    model = tiny_wan(0)
    bd.enable(model, skip=blasst.SkipSoftmax.dense())
    x, enc = inputs()
    x2 = torch.cat([x, x.flip(-1)], dim=-1)  # 2 x 16 x 32 = 1024 tokens
    try:
        with blasst.calibration.record(tile_keys=TILE, vote_rows=ROWS) as rec:
            for t in (900, 500):
                run(model, t, x, enc)
                run(model, t, x2, enc)
        # self-attention only (attn2, cross-attention, is ignored by default), full mask
        assert rec.layers() == [("transformer", "blocks.0.attn1"), ("transformer", "blocks.1.attn1")]
        assert rec.lengths() == [512, 1024] and rec.mask() == "full"
        assert all(len(v) == 2 for v in rec.samples.values())  # two denoise steps pooled
        for (_, _, _, lk), sts in rec.samples.items():
            for st in sts:  # full mask: every vote group visits every tile; 2 heads
                assert st.total_visited == 2 * -(-lk // ROWS) * -(-lk // TILE)
        cal = rec.fit((0.3, 0.5, 0.7))
        assert {f["component"] for f in cal.fits} == {"transformer"}
        # the catch-all pooled group would match attn2 too: keep it dense as enable() did
        written = cal.save(tmp_path, 0.5, ignore=bd.DEFAULT_IGNORE)
        assert written == [str(tmp_path / "transformer" / "config.json")]
        handle = bd.enable(model, config=written[0])
        skip = handle.skip_for("transformer", "blocks.0.attn1")
        assert skip is not None and skip.enabled
        assert handle.skip_for("transformer", "blocks.0.attn2") is None
        with bd.record_stats() as real:
            run(model, 900, x2, enc)
        e = real.layers["transformer/blocks.0.attn1"]
        assert e["blasst"] == 1 and e["skipped"] > 0
        (st, _) = rec.samples[("transformer", "blocks.0.attn1", "prefill", 1024)]
        lo, hi = bracket(st, skip.lambda_for(1024))
        assert lo - 1e-12 <= e["skipped"] / e["visited"] <= hi + 1e-12
    finally:
        bd.disable(model)


def test_errors():
    with blasst.calibration.record() as rec:
        with pytest.raises(RuntimeError, match="another recording is active"):
            with blasst.calibration.record():
                pass
    with pytest.raises(ValueError, match="nothing was recorded"):
        rec.fit()
    with pytest.raises(ValueError, match="order"):
        with blasst.calibration.record(order="backwards"):
            pass
    model = llama()
    with torch.no_grad(), blasst.calibration.record(tile_keys=TILE, vote_rows=ROWS) as rec:
        model(prompt(64))
    with pytest.raises(ValueError, match="no decode call was recorded"):
        rec.fit(phases=["decode"])
    with pytest.raises(ValueError, match="phases must be"):
        rec.fit(phases=["training"])
    # outside the block the backend is back to the layer's own settings (dense here)
    with torch.no_grad():
        model(prompt(64))
    assert rec.calls == 2
