"""blasst.attention(..., seed_max=...) on CPU torch tensors (SPEC §2a, seeded maxima for a key
chunk): ring attention simulated on one process against the unsplit call; errors."""
import numpy as np
import pytest

import blasst
import oracle
import ring_helpers as rh

torch = pytest.importorskip("torch")

LAM = 0.05


def t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def run(q, k, v, skip, seed=None):
    st = {}
    out, lse = blasst.attention(q, k, v, skip=skip, return_lse=True, stats=st,
                                seed_max=None if seed is None else t(seed))
    return out.numpy(), lse.numpy(), st


def ring(q, k, v, chunks, skip, seed):
    """Every query row against each K/V chunk in turn (natural order inside a chunk), seeded
    with `seed` or unseeded (None), merged by LSE; (out, lse, visited, skipped)."""
    L = k.shape[1]
    outs, lses, vis, skp = [], [], 0, 0
    for c in range(chunks):
        sl = slice(c * L // chunks, (c + 1) * L // chunks)
        o, l, st = run(t(q), t(k[:, sl]), t(v[:, sl]), skip, seed)
        outs.append(o)
        lses.append(l)
        vis += st["visited"]
        skp += st["skipped"]
    o, l = rh.lse_merge(outs, lses)
    return o, l, vis, skp


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("chunks", [2, 4])
def test_ring_seeded_matches_unsplit(chunks):
    q, k, v = rh.sink_input(11)
    ref, ref_lse = oracle.attention(q, k, v)
    seed = rh.seed_tiles_max(q, k)
    # Dense: the seeded chunks merged by LSE are the exact attention.
    o, l, _, skp = ring(q, k, v, chunks, None, seed)
    assert skp == 0
    np.testing.assert_allclose(o, ref, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(l, ref_lse, rtol=1e-5, atol=1e-4)
    # Skipping: the unsplit max-first call, the seeded ring and the unseeded ring.
    o0, _, st0 = run(t(q), t(k), t(v), blasst.SkipSoftmax(threshold=LAM, order="max_first"))
    assert st0["skipped"] > 0
    nat = blasst.SkipSoftmax(threshold=LAM, order="natural")
    os_, _, vis_s, skp_s = ring(q, k, v, chunks, nat, seed)
    _, _, vis_u, skp_u = ring(q, k, v, chunks, nat, None)
    assert vis_s == vis_u == st0["visited"]  # every (vote group, tile) pair once
    margin = 0.01 * st0["visited"]
    assert skp_s >= st0["skipped"] - margin, (skp_s, st0)
    assert skp_u < skp_s - 5 * margin, (skp_u, skp_s)
    assert rel(os_, ref) <= 2 * rel(o0, ref) + 1e-6


def test_minus_inf_seed_is_no_seed():
    q, k, v = (t(x[:, :300]) for x in rh.sink_input(3))
    skip = blasst.SkipSoftmax(threshold=LAM, order="max_first")
    o0, l0, st0 = run(q, k, v, skip)
    assert st0["skipped"] > 0
    for dt in (np.float32, np.float64):
        o1, l1, st1 = run(q, k, v, skip, np.full((1, 2, 300), -np.inf, dt))
        assert np.array_equal(o0, o1) and np.array_equal(l0, l1)
        assert st1["skipped_per_head"] == st0["skipped_per_head"]


def test_seed_max_errors():
    q, k, v = (t(x[:, :100]) for x in rh.sink_input(5))
    with pytest.raises(ValueError, match=r"^seed_max: dimension 2 \(queries"):
        blasst.attention(q, k, v, seed_max=torch.zeros(1, 2, 99, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^seed_max: dtype bf16"):
        blasst.attention(q, k, v, seed_max=torch.zeros(1, 2, 100, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^seed_max: \+inf at sequence 0, head 1, query 3"):
        s = torch.zeros(1, 2, 100, dtype=torch.float64)
        s[0, 1, 3] = float("inf")
        blasst.attention(q, k, v, seed_max=s)
    with pytest.raises(ValueError, match=r"^seed_max: not available .* autograd"):
        blasst.attention(q.clone().requires_grad_(), k, v, seed_max=torch.zeros(1, 2, 100))
    # A seed above every score of its row: all its tiles skipped, out 0 and lse -inf.
    o, l, st = run(q, k, v, blasst.SkipSoftmax(threshold=0.5, order="natural"),
                   np.full((1, 2, 100), 1000.0))
    assert st["skipped"] == st["visited"] > 0
    assert (o == 0).all() and np.isneginf(l).all()


@pytest.mark.gpu
def test_cuda_seeded_chunks_match_the_reference():
    """The CUDA prefill kernel through blasst.attention(seed_max=) (float32 seeds on the device,
    what every CUDA ring of blasst.diffusers passes): per K/V chunk of a 2-chunk ring, the skipped
    pairs, the recorded skip set (bit for bit) and out / LSE against the CPU reference on the
    same bf16 values with the same seeds."""
    if not (torch.cuda.is_available() and blasst.cuda_available()):
        pytest.skip("GPU test: needs a CUDA device and blasst built with the kernels")
    from blasst import _calls
    q, k, v = (torch.from_numpy(a).to(torch.bfloat16) for a in rh.sink_input(11, L=1024, d=64))
    seed = t(rh.seed_tiles_max(q.double().numpy(), k.double().numpy()).astype(np.float32))
    nat = blasst.SkipSoftmax(threshold=LAM, order="natural")
    for sl in (slice(0, 512), slice(512, 1024)):
        args = (q, k[:, sl].contiguous(), v[:, sl].contiguous())
        st_c, st_g = {}, {}
        o_c, l_c = blasst.attention(*(a.float() for a in args), skip=nat, return_lse=True,
                                    stats=st_c, seed_max=seed)
        o_g, l_g = blasst.attention(*(a.cuda() for a in args), skip=nat, return_lse=True,
                                    stats=st_g, seed_max=seed.cuda())
        assert st_c["skipped"] > 0 and st_g["skipped"] == st_c["skipped"], (sl, st_c, st_g)
        assert st_g["visited"] == st_c["visited"]
        assert float((o_g.float().cpu() - o_c).abs().max()) <= 2e-2, sl
        fin = torch.isfinite(l_c)
        assert torch.equal(torch.isfinite(l_g.cpu()), fin), sl  # rows that kept nothing: -inf
        assert float((l_g.cpu()[fin] - l_c[fin]).abs().max()) <= 1e-2, sl
        _, w_c = _calls.attention(*(a.float() for a in args), False, None, nat, None, None, None,
                                  None, False, None, record_skip_set=True, seed_max=seed)
        _, w_g = _calls.attention(*(a.cuda() for a in args), False, None, nat, None, None, None,
                                  None, False, None, record_skip_set=True, seed_max=seed.cuda())
        assert torch.equal(w_g.cpu(), w_c), sl
