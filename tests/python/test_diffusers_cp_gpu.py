"""blasst.diffusers under diffusers' context parallelism on 2 GPUs (NCCL, one process per GPU,
sm_90a kernels, bf16): a random-weight Wan-style transformer at 32,768 tokens with Ulysses and
with a ring, against the same model on one GPU; and direct calls of the registered backend on a
sink-heavy input against the CPU reference engine. Needs 2 CUDA devices: skips with the reason
otherwise (a failure with BLASST_REQUIRE_GPUS=2). BLASST_CP_TEST_ON_CPU=1 runs the same code on 2
CPU processes (gloo, float32, 1,024 tokens), a check of the test's own logic only (there the
ring's sparsity is not held to the 32k target: 8 tiles per row).

Expected values and tolerances:
- model, dense: the one-GPU output of blasst dense; bf16 tolerance: relative L2 error <= 2e-2
  (five bf16 roundings, 5 * 2^-8; the projections run on other row counts under parallelism).
- model, skip at the one-GPU lambda for 50 % sparsity (bisection on the one-GPU run): Ulysses
  attends over the whole sequence per head, so its sparsity equals the one-GPU run's (to 0.005:
  a bf16 projection computed on fewer rows may round differently and flip a decision at the
  threshold) and its output is the one-GPU skip output to the bf16 tolerance. The seeded ring:
  sparsity within 0.01 of one GPU (the issue's target), more than the same ring unseeded
  (blasst.diffusers._ring_seed replaced by -inf seeds in the test), and an error against dense of
  the one-GPU skip run's order (<= 2x it + the bf16 tolerance).
- direct ring (L = 2,048, 2 heads, d = 128, sink key): forward against per-chunk CPU reference
  calls with the SPEC §2a seeds (float64 from the bf16 values, ring_helpers.chunk_seed) merged by
  LSE in float64; skipped pairs equal to those calls'; gradients against the float64 reference
  backward per chunk with the skip set the CUDA forward records for it and the ring's merged out
  and LSE, within 8 bf16 units of the largest entry (test_backward_cpu.py's bound).

    BLASST_REQUIRE_GPUS=2 python -m pytest tests/python/test_diffusers_cp_gpu.py -q -s
"""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

import blasst  # noqa: E402

pytestmark = pytest.mark.multigpu

WORLD = 2
ON_CPU = os.environ.get("BLASST_CP_TEST_ON_CPU") == "1"
BF16_TOL = 5 * 2.0 ** -8


def _problem():
    if ON_CPU:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() < WORLD:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return f"needs {WORLD} CUDA devices, torch sees {n}"
    if not blasst.built_with_cuda() or not blasst.cuda_available():
        return "blasst was built without the CUDA kernels or sees no usable sm_90 GPU"
    return None


def _wan(device, dtype):
    from test_diffusers_cpu import local_wan
    dims = dict(in_channels=16, out_channels=16, text_dim=64, freq_dim=64, rope_max_seq_len=1024)
    if not ON_CPU:  # 12 heads x 128, as Wan 2.1 1.3B
        dims.update(num_attention_heads=12, attention_head_dim=128, ffn_dim=4096)
    return local_wan(0, dtype, 4.0, device, **dims)


def _inputs(device, dtype):
    import torch.nn.functional as F
    shape = (1, 16, 2, 32, 64) if ON_CPU else (1, 16, 16, 64, 128)  # 1,024 / 32,768 tokens
    g = torch.Generator().manual_seed(7)
    low = torch.randn(1, 16, 2, 4, 4, generator=g)
    x = F.interpolate(low, size=shape[2:], mode="trilinear", align_corners=True)
    x = x + 0.1 * torch.randn(*shape, generator=g)
    enc = torch.randn(1, 16, 64, generator=g)
    return x.to(device, dtype), enc.to(device, dtype)


def _counts(rec):
    return [sum(e[k] for e in rec.layers.values()) for k in ("visited", "skipped")]


def _worker(rank, init_file, out_dir):
    import blasst.diffusers as bd
    from blasst import _calls
    from diffusers.models import attention_dispatch as ad
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    import ring_helpers as rh
    from test_backward_cpu import _keep_from_words

    if ON_CPU:
        torch.accelerator.device_count = lambda: 1
        device, dtype, backend = torch.device("cpu"), torch.float32, "gloo"
        torch.set_num_threads(1)
        blasst.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)
        device, dtype, backend = torch.device("cuda", rank), torch.bfloat16, "nccl"
    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank,
                            world_size=WORLD, **({} if ON_CPU else {"device_id": device}))

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    res = {}
    x, enc = _inputs(device, dtype)
    t = torch.tensor([500.0], device=device)

    def run(m):
        with torch.no_grad():
            return m(x, t, enc, return_dict=False)[0]

    # one GPU: lambda for 50 % by bisection of log10(lambda), the dense and skip outputs
    m1 = _wan(device, dtype)

    def one_gpu(skip):
        bd.enable(m1, skip=skip)
        try:
            with bd.record_stats() as rec:
                out = run(m1)
            return out, _counts(rec)
        finally:
            bd.disable(m1)

    dense1, _ = one_gpu(blasst.SkipSoftmax.dense())
    lo, hi = -10.0, math.log10(0.999)
    for _ in range(8):
        mid = 0.5 * (lo + hi)
        _, (v, s) = one_gpu(blasst.SkipSoftmax(threshold=10 ** mid, order="max_first"))
        lo, hi = (mid, hi) if s / v < 0.5 else (lo, mid)
    shared = [hi]  # rank 0's bisection for every rank (the runs are likely, not surely, equal)
    dist.broadcast_object_list(shared, src=0)
    hi = shared[0]
    skip = blasst.SkipSoftmax(threshold=10 ** hi, order="max_first")
    skip1, (v1, s1) = one_gpu(skip)
    res["one"] = {"lambda": 10 ** hi, "sparsity": s1 / v1, "skip_err_dense": rel(skip1, dense1)}
    del m1
    for mode, cfg in (("ulysses", ContextParallelConfig(ulysses_degree=WORLD)),
                      ("ring", ContextParallelConfig(ring_degree=WORLD))):
        m = _wan(device, dtype)
        m.enable_parallelism(config=cfg)
        r = {}
        for case, setting in (("dense", blasst.SkipSoftmax.dense()), ("skip", skip)):
            handle = bd.enable(m, skip=setting)
            with bd.record_stats() as rec:
                out = run(m)
            v, s = _counts(rec.merged())  # summed over the ranks
            r[case] = {"err_one": rel(out, dense1 if case == "dense" else skip1),
                       "err_dense": rel(out, dense1), "sparsity": s / v if v else 0.0,
                       "finite": bool(torch.isfinite(out).all()),
                       "calls": handle.blasst_calls["transformer"],
                       "fallbacks": dict(handle.fallbacks)}
            bd.disable(m)
        if mode == "ring":  # the same ring without seeds
            seed_fn = bd._ring_seed
            bd._ring_seed = lambda q, k, scale, sk, cp: torch.full(
                (q.shape[0], q.shape[2], q.shape[1]), -math.inf, dtype=torch.float32,
                device=q.device)
            try:
                bd.enable(m, skip=skip)
                with bd.record_stats() as rec:
                    run(m)
                v, s = _counts(rec.merged())
                r["skip"]["sparsity_unseeded"] = s / v
                bd.disable(m)
            finally:
                bd._ring_seed = seed_fn
        res[mode] = r
        del m

    # direct calls of the registered backend on a ring: forward and gradients
    cp = ContextParallelConfig(ring_degree=WORLD)
    pcfg = ParallelConfig(context_parallel_config=cp)
    mesh = dist.device_mesh.init_device_mesh(device.type, cp.mesh_shape,
                                             mesh_dim_names=cp.mesh_dim_names)
    pcfg.setup(rank, WORLD, device, mesh=mesh)
    L, H, d = (512, 2, 64) if ON_CPU else (2048, 2, 128)
    qn, kn, vn = rh.sink_input(31, L=L, H=H, d=d)
    q, k, v = (torch.from_numpy(a).to(dtype) for a in (qn, kn, vn))  # CPU copies, rounded
    n = L // WORLD
    part = slice(rank * n, (rank + 1) * n)
    chunks = [slice(c * n, (c + 1) * n) for c in range(WORLD)]
    qd = q.double()
    seeds = torch.from_numpy(rh.chunk_seed(qd[:, part].numpy(), k[:, part].double().numpy(),
                                           k[:, :128].double().numpy())).float()
    lam = blasst.SkipSoftmax(threshold=0.05, tile_keys=128, vote_rows=64, order="natural")
    model = _wan(device, dtype)
    handle = bd.enable(model, skip=lam)
    member = ad.AttentionBackendName(handle.layers["transformer/blocks.0.attn1"]["backend"])
    fn = ad._AttentionBackendRegistry._backends[member]
    with torch.no_grad():
        with bd.record_stats() as rec:
            got = fn(*(a[:, part].to(device) for a in (q, k, v)), _parallel_config=pcfg)
    outs, lses, want_skipped = [], [], 0
    for c in chunks:  # the CPU reference per chunk with the same seeds (float32 values)
        st = {}
        o, lse = blasst.attention(q[:, part].float(), k[:, c].float(), v[:, c].float(), skip=lam,
                                  return_lse=True, stats=st, seed_max=seeds)
        outs.append(o.double().numpy())
        lses.append(lse.double().numpy())
        want_skipped += st["skipped"]
    want, _ = rh.lse_merge(outs, lses)
    res["direct"] = {"err": float((got.cpu().double() - torch.from_numpy(want)).abs().max()),
                     "skipped": _counts(rec)[1], "want_skipped": want_skipped}
    # gradients: against the float64 reference backward (blasst::attention_backward on CPU
    # tensors) of each chunk, given the skip set the CUDA forward records for it and the ring's
    # merged out (as the backward reads it: in the inputs' dtype) and LSE, summed over the chunks
    # (dQ) and over the ranks' rows (dK, dV). Not float64 autograd from scratch: an oracle with
    # the exact O differs by the bf16 rounding of O times |k|, which the sink amplifies past any
    # relative bound (test_backward_cpu.py, the first H200 run).
    from blasst import _torch_ops as ops
    leaves = [a[:, part].to(device).requires_grad_(True) for a in (q, k, v)]
    do = torch.randn(1, L, H, d, generator=torch.Generator().manual_seed(12)).to(dtype)
    out, lse = fn(*leaves, return_lse=True, _parallel_config=pcfg)  # lse (B, S, H)
    out.backward(do[:, part].to(device))
    o_ex = out.detach().cpu().double()
    l_ex = lse.detach().cpu().float().transpose(1, 2).contiguous()  # [B, H, S]
    want = [torch.zeros(1, n, H, d, dtype=torch.float64)] + \
        [torch.zeros(1, L, H, d, dtype=torch.float64) for _ in range(2)]
    skipped = 0
    for c in chunks:
        _, words = _calls.attention(q[:, part].to(device), k[:, c].to(device), v[:, c].to(device),
                                    False, None, lam, None, None, None, None, True, None,
                                    record_skip_set=True, seed_max=seeds.to(device))
        skipped += _keep_from_words(words, 1, H, n, n)[1]
        dq, dk, dv = ops.backward_into(do[:, part].double(), q[:, part].double(),
                                       k[:, c].double(), v[:, c].double(), o_ex, l_ex, None,
                                       None, None, 0, 0, False, None, ops.skip_to_str(lam),
                                       words.cpu())
        want[0] += dq
        want[1][:, c] += dk
        want[2][:, c] += dv
    for tt in want[1:]:
        dist.all_reduce(tt)
    want = [want[0], want[1][:, part], want[2][:, part]]
    # bf16 P and dS in the tensor-core products, bf16 outputs: a few u = 2^-8 of the largest
    # entry of the whole gradient (a key chunk that every row skipped has dK = dV = 0 on its rank)
    res["direct_grad"] = {
        "skipped": skipped,
        "rel": [float((a.grad.cpu().double() - w).abs().max() / max(float(w.abs().max()), 1e-30))
                for a, w in zip(leaves, want)],
        "finite": all(bool(torch.isfinite(a.grad).all()) for a in leaves),
    }
    bd.disable(model)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    from mp_helpers import end_worker
    end_worker()  # (the process ends here)


def test_context_parallel_on_two_gpus(tmp_path):
    problem = _problem()
    if problem is not None:
        pytest.skip(problem)
    here = os.path.dirname(__file__)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", ""))
                                               if p)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(WORLD)]
    for rank, res in enumerate(ranks):
        print(f"rank {rank}: {json.dumps(res)}")
        one = res["one"]
        assert 0.4 <= one["sparsity"] <= 0.6, one  # the bisection found the 50 % case
        for mode in ("ulysses", "ring"):
            r = res[mode]
            for case in ("dense", "skip"):
                assert r[case]["finite"] and r[case]["calls"] > 0, (mode, case, r[case])
                assert set(r[case]["fallbacks"]) <= {"ignored"}, (mode, case, r[case])
            assert r["dense"]["err_one"] <= BF16_TOL, (mode, r)
        u, g = res["ulysses"]["skip"], res["ring"]["skip"]
        assert abs(u["sparsity"] - one["sparsity"]) <= 0.005 and u["err_one"] <= BF16_TOL, (u, one)
        if not ON_CPU:  # the target at 32k tokens; the CPU check's 8 tiles miss it
            assert abs(g["sparsity"] - one["sparsity"]) <= 0.01, (g, one)
        assert g["sparsity"] > g["sparsity_unseeded"], g
        assert g["err_dense"] <= 2 * one["skip_err_dense"] + BF16_TOL, (g, one)
        dd = res["direct"]
        assert dd["want_skipped"] > 0 and dd["skipped"] == dd["want_skipped"], dd
        assert dd["err"] <= BF16_TOL, dd
        dg = res["direct_grad"]
        assert dg["skipped"] > 0 and dg["finite"] and all(e <= 8 * 2.0 ** -8 for e in dg["rel"]), dg
