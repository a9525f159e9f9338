"""blasst.diffusers under diffusers' own context parallelism (model.enable_parallelism with a
ContextParallelConfig: Ulysses, ring, and both at once) on 2 or 4 CPU processes
(torch.distributed, gloo), reference engine: the blasst backend's forward / backward ops inside
diffusers' templated Ulysses and ring loops (blasst.diffusers._cp_ops), against the same model in
one process and against independent constructions.

Expected values: the one-process blasst run of the same model, weights and inputs (dense: its
float64 output to the accumulation error; skip: Ulysses attends over the whole sequence per head,
so its skip decisions and output equal the one-process run's). A ring seeds every chunk with the
rows' sink- and own-tile maxima (SPEC §2a): its forward equals per-chunk calls with the seeds of
ring_helpers (float64, from the SPEC's text) merged by LSE, and it skips more pairs than the same
chunks unseeded. Gradients: torch autograd through a float64 masked softmax per chunk (the keep
mask from the skip set of each chunk's call, decoded by the test), merged by LSE (SPEC §9).
Each case asserts that it happened (calls routed to blasst under the parallel config, tiles
skipped, seeds used). CPU stands in for the accelerator: diffusers' enable_parallelism asks
torch.accelerator.device_count(), which is 0 here; the workers answer 1.
"""
import json
import os

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

SHAPE = (1, 4, 2, 32, 64)  # latents -> 2 x 16 x 32 = 1024 tokens (8 tiles of 128)
# mode -> (ring degree, Ulysses degree); processes = their product. *_anything: diffusers' loops
# for chunks of unequal lengths (the direct calls give the ranks 320 and 192 rows)
MODES = {"ulysses": (1, 2), "ring": (2, 1), "unified": (2, 2), "ring_anything": (2, 1),
         "ulysses_anything": (1, 2)}


def _cp_config(mode):
    from diffusers.models._modeling_parallel import ContextParallelConfig
    ring, ulysses = MODES[mode]
    return ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses,
                                 ring_anything=mode == "ring_anything",
                                 ulysses_anything=mode == "ulysses_anything")


def _worker(rank, init_file, out_dir, mode):
    import blasst
    import blasst.diffusers as bd
    from blasst import _calls
    from test_diffusers_cpu import run, smooth_latents, tiny_wan
    from test_backward_cpu import _keep_from_words

    ring_degree, ulysses_degree = MODES[mode]
    world = ring_degree * ulysses_degree
    # CPU stands in for the accelerator (docstring): enable_parallelism asks for the count, the
    # *_anything loops gather chunk sizes on the current accelerator
    torch.accelerator.device_count = lambda: 1
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    blasst.set_num_threads(1)
    torch.set_num_threads(1)
    res = {}
    x = smooth_latents(torch.float64, seed=7, shape=SHAPE)
    enc = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    # lambda 0.02 at 1024 tokens: a fraction of the tiles after the sink and own tiles
    skip = blasst.SkipSoftmax(threshold=0.02, tile_keys=128, vote_rows=64, order="max_first")
    for case, setting in (("dense", blasst.SkipSoftmax.dense()), ("skip", skip)):
        model = tiny_wan(0, sharpen=6.0)
        handle = bd.enable(model, skip=setting)
        with bd.record_stats() as one:
            ref = run(model, 900, x, enc)
        model.enable_parallelism(config=_cp_config(mode))
        calls = handle.blasst_calls["transformer"]
        with bd.record_stats() as par:
            got = run(model, 900, x, enc)
        if case == "dense":
            ref_dense = ref
        res[case] = {
            "max_abs": float((got - ref).abs().max()), "scale": float(ref.abs().max()),
            "finite": bool(torch.isfinite(got).all()),
            "err_dense": [float((ref - ref_dense).abs().max()), float((got - ref_dense).abs().max())],
            "calls": handle.blasst_calls["transformer"] - calls,
            "fallbacks": dict(handle.fallbacks),
            "one": [one.layers["transformer/blocks.0.attn1"][k] for k in ("visited", "skipped")],
            "par": [par.layers["transformer/blocks.0.attn1"][k] for k in ("visited", "skipped")],
            "merged": [par.merged().layers["transformer/blocks.0.attn1"][k]
                       for k in ("visited", "skipped")],
            "merged_sparsity": par.merged().sparsity(), "one_sparsity": one.sparsity(),
        }
        bd.disable(model)
    # Direct calls of the registered backend with diffusers' ParallelConfig (the templated loops
    # and our ops, no model): output and gradients against independent constructions.
    from diffusers.models import attention_dispatch as ad
    from diffusers.models._modeling_parallel import ParallelConfig
    import ring_helpers as rh
    cp = _cp_config(mode)
    pcfg = ParallelConfig(context_parallel_config=cp)
    mesh = dist.device_mesh.init_device_mesh("cpu", cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    pcfg.setup(rank, world, torch.device("cpu"), mesh=mesh)
    L = 512
    qn, kn, vn = rh.sink_input(31, L=L, H=2, d=64)  # a sink key 0: far tiles are skipped
    q, k, v = (torch.from_numpy(a).double() for a in (qn, kn, vn))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    cuts = [0, 320, L] if mode.endswith("_anything") else [i * L // world for i in range(world + 1)]
    parts = [slice(cuts[i], cuts[i + 1]) for i in range(world)]
    part = parts[rank]  # this rank's rows (the model layout's split)
    n = part.stop - part.start
    # The ring's key chunks: after the Ulysses all-to-all, ring rank r holds the r-th of
    # ring_degree contiguous chunks (its Ulysses group's rows) for a subset of the heads, so a
    # rank's rows meet the keys in these chunks, every head alike (natural order: a vote
    # group's decisions depend on its rows and tiles only, not on which rows share the call).
    chunks = [slice(parts[c * ulysses_degree].start, parts[(c + 1) * ulysses_degree - 1].stop)
              for c in range(ring_degree)]
    seeded = ring_degree > 1
    seeds = None
    if seeded:  # SPEC §2a for the call the ring makes: its chunk's rows, tiles from its start
        ring_rows = chunks[rank // ulysses_degree]  # the mesh is (ring, Ulysses)
        off = part.start - ring_rows.start
        seeds = torch.from_numpy(rh.chunk_seed(qn[:, ring_rows], kn[:, ring_rows],
                                               kn[:, :128]))[:, :, off:off + n].contiguous()
    model = tiny_wan(0)
    lam_skip = blasst.SkipSoftmax(threshold=0.05, tile_keys=128, vote_rows=64, order="natural")

    def backend(setting):
        handle = bd.enable(model, skip=setting)
        member = ad.AttentionBackendName(handle.layers["transformer/blocks.0.attn1"]["backend"])
        return handle, ad._AttentionBackendRegistry._backends[member]

    def chunk_calls(setting, seed):
        """Per key chunk: this rank's rows, blasst forward with the chunk's skip set recorded."""
        outs = []
        for c in chunks:
            res_c, words = _calls.attention(q[:, part], k[:, c], v[:, c], False, None, setting,
                                            None, None, None, None, True, None,
                                            record_skip_set=True, seed_max=seed)
            outs.append((res_c, words))
        return outs

    # the library's seeds against the SPEC's (ring_helpers, float64) on the tensors the ring
    # hands its rows (this rank's chunk after the Ulysses exchange, every head); noise without a
    # sink, so that the own tile decides about half of the seeds
    if seeded:
        rows_r = chunks[cp._ring_local_rank]
        g = torch.Generator().manual_seed(40)
        qs, ks = (torch.randn(1, L, 2, 64, generator=g, dtype=torch.float64) for _ in range(2))
        res["seed_own"] = []
        for rows_per_vote in (64, 48):  # 48: tile_keys not a multiple of vote_rows
            sk = blasst.SkipSoftmax(threshold=0.05, tile_keys=128, vote_rows=rows_per_vote)
            got_seed = bd._ring_seed(qs[:, rows_r], ks[:, rows_r], None, sk, cp)
            want_seed = torch.from_numpy(rh.chunk_seed(qs[:, rows_r].numpy(),
                                                       ks[:, rows_r].numpy(),
                                                       ks[:, :128].numpy(), rows_per_vote))
            sink_only = torch.from_numpy(rh.chunk_seed(qs[:, rows_r].numpy(),
                                                       ks[:, :0].numpy(),
                                                       ks[:, :128].numpy(), rows_per_vote))
            res[f"seed_err_{rows_per_vote}"] = float((got_seed - want_seed).abs().max())
            res["seed_own"].append(float((want_seed > sink_only).double().mean()))
        got32 = bd._ring_seed(qs[:, rows_r].float(), ks[:, rows_r].float(), None, lam_skip, cp)
        res["seed_dtype"] = [str(got32.dtype), float((got32.double() - bd._ring_seed(
            qs[:, rows_r], ks[:, rows_r], None, lam_skip, cp)).abs().max())]

    # forward without gradients: expected = per-chunk calls with the SPEC's seeds, LSE-merged
    # (ring_helpers.lse_merge, float64); the same chunks unseeded counted beside it
    handle, fn = backend(lam_skip)
    with torch.no_grad():
        with bd.record_stats() as rec:
            got = fn(q[:, part].contiguous(), k[:, part].contiguous(), v[:, part].contiguous(),
                     _parallel_config=pcfg)
        per_chunk = chunk_calls(lam_skip, seeds)
        want, _ = rh.lse_merge([o.numpy() for (o, _), _ in per_chunk],
                               [lse.numpy() for (_, lse), _ in per_chunk])
        unseeded = 0
        for c in chunks:
            st_c = {}
            blasst.attention(q[:, part], k[:, c], v[:, c], skip=lam_skip, stats=st_c)
            unseeded += st_c["skipped"]
        st = {}
        blasst.attention(q, k, v, skip=lam_skip, stats=st)
    res["fwd_skip"] = {"err": float((got - torch.from_numpy(want)).abs().max()),
                       "skipped_one": st["skipped"], "visited_one": st["visited"],
                       "skipped": sum(e["skipped"] for e in rec.layers.values()),
                       "visited": sum(e["visited"] for e in rec.layers.values()),
                       "skipped_unseeded": unseeded}
    bd.disable(model)
    # gradients through the templated autograd.Function and our backward op. Expected: torch
    # autograd through a float64 masked softmax per key chunk, the keep mask decoded from the
    # skip set that chunk's call records (with the seeds on a ring), merged by LSE.
    # (diffusers 0.42.1 has no backward for its *_anything loops: NotImplementedError)
    grad_cases = () if mode.endswith("_anything") else \
        (("grad_dense", blasst.SkipSoftmax.dense()), ("grad_skip", lam_skip))
    for case, setting in grad_cases:
        handle, fn = backend(setting)
        leaves = [t[:, part].clone().requires_grad_(True) for t in (q, k, v)]
        with bd.record_stats() as rg:  # under autograd: blasst calls without statistics
            out = fn(*leaves, _parallel_config=pcfg)
        out.backward(do[:, part])
        rg_calls = sum(e["blasst"] for e in rg.layers.values())
        rg_visited = sum(e["visited"] for e in rg.layers.values())
        whole = [t.clone().requires_grad_(True) for t in (q, k, v)]
        outs, lses, skipped = [], [], 0
        for c, (_, words) in zip(chunks, chunk_calls(setting, seeds if setting.enabled else None)):
            keep = None
            if words is not None:
                keep, n_skip = _keep_from_words(words, 1, 2, n, c.stop - c.start)
                skipped += n_skip
            o, lse = rh.masked_chunk(whole[0][:, part], whole[1][:, c], whole[2][:, c], keep)
            outs.append(o)
            lses.append(lse)
        ref = rh.torch_merge(outs, lses)
        ref.backward(do[:, part])
        # every rank's rows: the gradients of k and v sum over the ranks' rows
        for t in whole[1:]:
            dist.all_reduce(t.grad)
        res[case] = {
            "out": float((out.detach() - ref.detach()).abs().max()),
            "grads": [float((leaves[0].grad - whole[0].grad[:, part]).abs().max())] +
                     [float((a.grad - b.grad[:, part]).abs().max())
                      for a, b in zip(leaves[1:], whole[1:])],
            "scale": [float(b.grad.abs().max()) for b in whole], "skipped": skipped,
            "recorded": [rg_calls, rg_visited],
        }
        bd.disable(model)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    from mp_helpers import end_worker
    end_worker()  # (the process ends here)


def _launch(tmp_path, mode):
    os.environ.setdefault("PYTHONPATH", "")
    here = os.path.dirname(__file__)
    if here not in os.environ["PYTHONPATH"].split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ["PYTHONPATH"]) if p)
    world = MODES[mode][0] * MODES[mode][1]
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), mode), nprocs=world, join=True)
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]


@pytest.mark.parametrize("mode", list(MODES))
def test_context_parallel_matches_one_process(tmp_path, mode):
    ranks = _launch(tmp_path, mode)
    ulysses = MODES[mode][0] == 1  # no ring: every rank attends over the whole sequence
    # block 0's self-attention pairs over the ranks (each rank: a subset of the heads under
    # Ulysses, of the rows under the ring) against the one-process run's
    one = ranks[0]["skip"]["one"]
    visited = sum(r["skip"]["par"][0] for r in ranks)
    skipped = sum(r["skip"]["par"][1] for r in ranks)
    assert visited == one[0], (visited, one)
    for r in ranks:  # StatsRecorder.merged: the same sums on every rank
        assert r["skip"]["merged"] == [visited, skipped], (r["skip"], visited, skipped)
    if ulysses:
        assert ranks[0]["skip"]["merged_sparsity"] == ranks[0]["skip"]["one_sparsity"]
    if ulysses:  # the whole sequence per head: the same decisions
        assert skipped == one[1], (skipped, one)
    else:
        # Seeded chunks skip on their own running maxima (seed + the chunk's own tiles), so the
        # set differs from one pass by construction; what it must be is checked exactly below
        # (fwd_skip). Printed for the record (the 0.01 target is the GPU run at 32k).
        assert skipped > 0, (skipped, visited)
        print(f"[{mode}, model] block 0 sparsity {skipped / visited:.4f} ({skipped} of "
              f"{visited}) vs one process {one[1] / one[0]:.4f}")
    for rank, res in enumerate(ranks):
        for case in ("dense", "skip"):
            r = res[case]
            # routed to blasst under the parallel config; the only fallbacks: cross-attention
            # (attn2, ignored by default), never "context_parallel"
            assert r["calls"] > 0 and set(r["fallbacks"]) <= {"ignored"}, (mode, rank, case, r)
        # dense: the reference accumulates in float32 (a dense call matches float64 SDPA to
        # ~1e-6, test_diffusers_cpu.py DENSE_ATOL); the model output stays within this bound.
        # Ulysses with skipping: the same skip decisions as one process, so the same bound.
        # (A ring's chunks skip on their own, seeded: its skip output is checked exactly against
        # its own construction below, fwd_skip.)
        for case in ("dense", "skip") if ulysses else ("dense",):
            r = res[case]
            assert r["max_abs"] <= 5e-6 * max(1.0, r["scale"]), (mode, rank, case, r)
        assert res["skip"]["one"][1] > 0, ("the one-process run skipped nothing", res["skip"])
        assert res["skip"]["finite"] and res["dense"]["finite"], (mode, rank, res["skip"])
        if not ulysses:
            # the seeded ring's skip error against the dense output: of the one-process run's
            # order (it skips other pairs, SPEC §2a): at most twice it, printed for the record
            one_err, par_err = res["skip"]["err_dense"]
            print(f"[{mode}, model] rank {rank}: skip error vs dense {par_err:.2e}, one process "
                  f"{one_err:.2e}")
            assert 0 < one_err and par_err <= 2 * one_err, (mode, rank, res["skip"])
        if not ulysses:  # the library's seeds are the SPEC's (float64: to rounding)
            assert res["seed_err_64"] <= 1e-12 and res["seed_err_48"] <= 1e-12, res
            assert all(f > 0.1 for f in res["seed_own"]), res  # own tiles decided some seeds
            assert res["seed_dtype"][0] == "torch.float32" and res["seed_dtype"][1] <= 1e-4, res
        f = res["fwd_skip"]
        assert f["skipped_one"] > 0, f
        assert f["err"] <= 1e-5, (mode, rank, f)  # diffusers merges the ring in float32
        if not ulysses:  # the seeds are what lets a chunk without the sink skip (SPEC §2a)
            assert f["skipped"] > f["skipped_unseeded"], f
            print(f"[{mode}, direct] rank {rank}: seeded {f['skipped']} of {f['visited']}, "
                  f"unseeded {f['skipped_unseeded']}; one process {f['skipped_one']} of "
                  f"{f['visited_one']}")
        if mode.endswith("_anything"):
            continue
        assert res["grad_skip"]["skipped"] > 0 and res["grad_dense"]["skipped"] == 0, res
        for case in ("grad_dense", "grad_skip"):
            r = res[case]
            assert r["recorded"] == [MODES[mode][0], 0], (mode, case, r)  # one call per chunk
            assert r["out"] <= 1e-5 and all(e <= 1e-5 * max(1.0, s) for e, s in
                                            zip(r["grads"], r["scale"])), (mode, rank, case, r)
