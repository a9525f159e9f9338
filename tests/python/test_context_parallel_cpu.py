"""Context parallelism on 2 CPU processes (torch.distributed, gloo) through blasst.attention:
ring attention (K/V chunks passed around, every chunk run with seed_max = the maxima of the rows'
seed tiles, SPEC §2a, merged by LSE) and Ulysses (heads redistributed: each rank attends over the
whole sequence for its heads) against the single-process results of the reference engine."""
import os

import numpy as np
import pytest

import blasst
import ring_helpers as rh

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

WORLD = 2
L, H, D = 1024, 2, 64
LAM = 0.05
SEED = 21


def _skip(order):
    return blasst.SkipSoftmax(threshold=LAM, order=order)


def _attend(q, k, v, skip, seed=None):
    st = {}
    out, lse = blasst.attention(q, k, v, skip=skip, return_lse=True, stats=st,
                                seed_max=None if seed is None else torch.from_numpy(seed))
    return out.numpy(), lse.numpy(), st


def _ring(rank, q, k, v, skip, seed):
    """This rank's rows against every K/V chunk: its own first, then the one received from the
    previous rank (isend to rank + 1, recv from rank - 1), merged by LSE."""
    outs, lses, vis, skp = [], [], 0, 0
    kv = torch.stack([k, v])
    for step in range(WORLD):
        o, l, st = _attend(q, kv[0], kv[1], skip, seed)
        outs.append(o)
        lses.append(l)
        vis += st["visited"]
        skp += st["skipped"]
        if step + 1 < WORLD:
            nxt = torch.empty_like(kv)
            req = dist.isend(kv, (rank + 1) % WORLD)
            dist.recv(nxt, (rank - 1) % WORLD)
            req.wait()
            kv = nxt
    out, lse = rh.lse_merge(outs, lses)
    return out, lse, vis, skp


def _worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD)
    blasst.set_num_threads(1)
    torch.set_num_threads(1)
    q, k, v = rh.sink_input(SEED, L, H, D)
    n = L // WORLD
    rows = slice(rank * n, (rank + 1) * n)
    ql, kl, vl = (torch.from_numpy(np.ascontiguousarray(x[:, rows])) for x in (q, k, v))

    # Ring. Seeds, computed once: the sink tile (rank 0's first tile, broadcast) and the rows' own
    # tiles (the tile holding key r0 of each vote group: in this rank's chunk, chunks being whole
    # tiles); float64 scores.
    sink_k = kl[:, :rh.TILE].clone()
    dist.broadcast(sink_k, 0)
    qd = ql[0].double().numpy()
    s_sink = np.einsum("ihc,jhc->hij", qd, sink_k[0].double().numpy()) / np.sqrt(D)
    s_own = np.einsum("ihc,jhc->hij", qd, kl[0].double().numpy()) / np.sqrt(D)
    seed = np.empty((1, H, n))
    for i in range(n):
        own = ((rank * n + i) // rh.ROWS) * rh.ROWS // rh.TILE - rank * n // rh.TILE
        seed[0, :, i] = np.maximum(s_sink[:, i].max(axis=1),
                                   s_own[:, i, own * rh.TILE:(own + 1) * rh.TILE].max(axis=1))
    dense = _ring(rank, ql, kl, vl, None, seed)
    seeded = _ring(rank, ql, kl, vl, _skip("natural"), seed)
    unseeded = _ring(rank, ql, kl, vl, _skip("natural"), None)
    counts = torch.tensor([seeded[2], seeded[3], unseeded[2], unseeded[3]], dtype=torch.int64)
    dist.all_reduce(counts)  # summed statistics of the ranks

    # Ulysses: gather every rank's chunk (all heads; gloo has no all_to_all), keep this rank's
    # heads over the whole sequence, attend, then gather the outputs and keep this rank's rows.
    hs = slice(rank * H // WORLD, (rank + 1) * H // WORLD)
    full = []
    for x in (ql, kl, vl):
        parts = [torch.empty_like(x) for _ in range(WORLD)]
        dist.all_gather(parts, x)
        full.append(torch.cat(parts, dim=1)[:, :, hs].contiguous())
    uo, ul, ust = _attend(*full, _skip("max_first"))
    uo_t, ul_t = torch.from_numpy(uo), torch.from_numpy(ul)
    parts_o = [torch.empty_like(uo_t) for _ in range(WORLD)]
    parts_l = [torch.empty_like(ul_t) for _ in range(WORLD)]
    dist.all_gather(parts_o, uo_t)
    dist.all_gather(parts_l, ul_t)
    u_out = torch.cat(parts_o, dim=2)[:, rows].numpy()
    u_lse = torch.cat(parts_l, dim=1)[:, :, rows].numpy()
    ucounts = torch.tensor(ust["skipped_per_head"] + ust["visited_per_head"], dtype=torch.int64)
    parts_c = [torch.empty_like(ucounts) for _ in range(WORLD)]
    dist.all_gather(parts_c, ucounts)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), dense_out=dense[0], dense_lse=dense[1],
             ring_out=seeded[0], ring_lse=seeded[1], counts=counts.numpy(), u_out=u_out,
             u_lse=u_lse, u_counts=torch.stack(parts_c).numpy())
    dist.barrier()
    from mp_helpers import end_worker
    end_worker()  # (the process ends here)


def test_ring_and_ulysses_on_two_processes(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this torch build")
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    res = [np.load(tmp_path / f"rank{r}.npz") for r in range(WORLD)]

    q, k, v = (torch.from_numpy(x) for x in rh.sink_input(SEED, L, H, D))
    ref_out, ref_lse, _ = _attend(q, k, v, None)
    mf_out, mf_lse, st = _attend(q, k, v, _skip("max_first"))
    assert st["skipped"] > 0
    n = L // WORLD
    # Ring, dense: every rank's rows are the exact attention's.
    for r in range(WORLD):
        rows = slice(r * n, (r + 1) * n)
        np.testing.assert_allclose(res[r]["dense_out"], ref_out[:, rows], rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(res[r]["dense_lse"], ref_lse[:, :, rows], rtol=1e-5, atol=1e-4)
    # Ring with skipping: the summed statistics count every (vote group, tile) pair once; the
    # seeded ring skips what the single-process max-first call skips (less 1 % of the pairs),
    # the unseeded ring clearly less.
    vis_s, skp_s, vis_u, skp_u = res[0]["counts"]
    assert (res[1]["counts"] == res[0]["counts"]).all()
    assert vis_s == vis_u == st["visited"]
    margin = 0.01 * st["visited"]
    assert skp_s >= st["skipped"] - margin, (skp_s, st["skipped"])
    assert skp_u < skp_s - 5 * margin, (skp_u, skp_s)
    ring_out = np.concatenate([res[r]["ring_out"] for r in range(WORLD)], axis=1)
    err = lambda a: np.linalg.norm(a - ref_out) / np.linalg.norm(ref_out)
    assert err(ring_out) <= 2 * err(mf_out) + 1e-6
    # Ulysses: the single-process call, bit for bit, and its per-head statistics.
    for r in range(WORLD):
        rows = slice(r * n, (r + 1) * n)
        assert np.array_equal(res[r]["u_out"], mf_out[:, rows])
        assert np.array_equal(res[r]["u_lse"], mf_lse[:, :, rows])
    per_rank = res[0]["u_counts"]  # [rank, skipped per own head + visited per own head]
    hw = H // WORLD
    assert per_rank[:, :hw].reshape(-1).tolist() == st["skipped_per_head"]
    assert per_rank[:, hw:].reshape(-1).tolist() == st["visited_per_head"]
