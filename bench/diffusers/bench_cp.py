"""Context parallelism on several GPUs (issue 20): step time of a Wan-style DiT under diffusers'
own engine (model.enable_parallelism with ContextParallelConfig: Ulysses, ring, Ulysses x ring),
blasst dense and Skip-Softmax at target sparsities against diffusers' native backend under the
same parallel config, and the scaling against one GPU, all in one run on the same GPUs.

Model and inputs: bench_wan.py's (WanTransformer3DModel, random weights, 12 heads x 128, keys
sharing the queries' projection so that attention has locality; 480p x 81 frames = 32,760
tokens, or --latent). One process per GPU (torch.multiprocessing, NCCL).

Per parallel config and configuration (diffusers' _native_cudnn and _native_flash backends,
which run its templated ring with an LSE; blasst dense; skip at each target): median ms of
one transformer forward over interleaved rounds (every rank in step: barrier, CUDA sync), the
same on one GPU (rank 0's model without parallelism, before the parallel runs), speed-up over
cuDNN under the same config and scaling over one GPU. lambda per target: bisection of the
threshold on the one-GPU run's measured sparsity (max-first order), then used unchanged under
every parallel config: the sparsity each config reaches at that lambda is measured (visited and
skipped pairs summed over the ranks), with the unseeded ring's beside the seeded one (the same
ring with blasst.diffusers._ring_seed returning no seed: what a ring without SPEC §2a seeding
skips), and the output error against the one-GPU output of the same configuration.

    python3 bench/diffusers/bench_cp.py [--world 2] [--modes ulysses,ring] [--layers 4]
        [--targets 0.5,0.7] [--rounds 5] [--out DIR]
    python3 bench/diffusers/bench_cp.py --cpu-check   # the same code on 2 CPU processes (gloo),
                                                      # tiny model, float32: a logic check only
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODES = {"ulysses": lambda w: dict(ulysses_degree=w), "ring": lambda w: dict(ring_degree=w),
         "unified": lambda w: dict(ring_degree=2, ulysses_degree=w // 2)}


def _model_and_inputs(args, device):
    import bench_wan as bw
    import torch.nn.functional as F
    if args.cpu_check:  # a tiny Wan: 2 heads x 16, float32, 1,024 tokens
        m = bw.model(2, device, 6.0, torch.float32, num_attention_heads=2, attention_head_dim=16,
                     in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64,
                     rope_max_seq_len=64)
        g = torch.Generator().manual_seed(7)
        shape = (1, 4, 2, 32, 64)
        low = torch.randn(1, 4, 2, 4, 4, generator=g)
        x = F.interpolate(low, size=shape[2:], mode="trilinear", align_corners=True)
        x = x + 0.1 * torch.randn(*shape, generator=g)
        enc = torch.randn(1, 8, 32, generator=g)
        return m, x.to(device), enc.to(device), 2 * 16 * 32
    m = bw.model(args.layers, device, args.qk_gain)
    x, enc = bw.inputs(device)
    return m, x, enc, bw.LATENT[2] * (bw.LATENT[3] // 2) * (bw.LATENT[4] // 2)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(step, device, n):
    step()
    _sync(device)
    if dist.is_initialized():
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / n * 1e3


def _sparsity(rec, reduce):
    return (rec.merged() if reduce else rec).sparsity()  # merged: summed over the ranks


def _worker(rank, args, init_file):
    import blasst
    import blasst.diffusers as bd
    from diffusers.models._modeling_parallel import ContextParallelConfig
    cpu = args.cpu_check
    if cpu:
        torch.accelerator.device_count = lambda: 1  # CPU stands in for the accelerator
        device = torch.device("cpu")
        torch.set_num_threads(1)
        blasst.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group("gloo" if cpu else "nccl", init_method="file://" + init_file,
                            rank=rank, world_size=args.world,
                            **({} if cpu else {"device_id": device}))
    t_step = torch.tensor([500.0], device=device)

    def stepper(m, x, enc):
        def step():
            with torch.no_grad():
                return m(x, t_step, enc, return_dict=False)[0]
        return step

    # one GPU: every rank runs its own copy (the same weights); rank 0's figures are reported
    m1, x, enc, tokens = _model_and_inputs(args, device)
    step1 = stepper(m1, x, enc)
    peers = ["native"] if cpu else ["_native_cudnn", "_native_flash"]

    def run_peer(m, step, backend):
        m.set_attention_backend(backend)
        try:
            return step().float()
        finally:
            m.reset_attention_backend()

    ref_native = run_peer(m1, step1, peers[0])

    def skip_at(lam):
        return blasst.SkipSoftmax.dense() if lam is None else \
            blasst.SkipSoftmax(threshold=lam, order="max_first")

    def measure(step, m, lam, reduce):
        bd.enable(m, skip=skip_at(lam))
        try:
            with bd.record_stats() as rec:
                out = step().float()
            return out, _sparsity(rec, reduce), dict(rec.fallbacks)
        finally:
            bd.disable(m)

    # lambda per target sparsity: bisection of log10(lambda) on the one-GPU run
    lams = {}
    for target in args.targets:
        lo, hi = -12.0, math.log10(0.999)  # lambda >= 1 is dense (SPEC §3)
        for _ in range(args.bisect_steps):
            mid = 0.5 * (lo + hi)
            _, sp, _ = measure(step1, m1, 10 ** mid, False)
            if sp < target:
                lo = mid
            else:
                hi = mid
        lams[target] = 10 ** hi
    # every rank bisected the same model and inputs; rank 0's lambdas for all (bit-identical runs
    # are likely but not guaranteed across GPUs)
    shared = [lams]
    dist.broadcast_object_list(shared, src=0)
    lams = shared[0]
    configs = [(p, "peer", p) for p in peers] + [("blasst dense", "dense", None)] + \
        [(f"skip {t:.0%}", "skip", lams[t]) for t in args.targets]
    def outputs(m, step, cfgs, reduce):
        """name -> (output, sparsity, fallbacks) of each configuration (statistics on)."""
        return {name: (run_peer(m, step, lam), 0.0, {}) if kind == "peer" else
                measure(step, m, lam, reduce) for name, kind, lam in cfgs}

    lam_of = {name: None if kind == "peer" else lam for name, kind, lam in configs}
    one = {}
    for name, (out, sp, fb) in outputs(m1, step1, configs, False).items():
        one[name] = dict(out=out, sparsity=sp, fallbacks=fb, lam=lam_of[name],
                         rel_err_native=float((out - ref_native).norm() / ref_native.norm()))
    def timed_config(m, step, kind, lam):
        if kind == "peer":
            m.set_attention_backend(lam)
        else:
            bd.enable(m, skip=skip_at(lam))
        try:
            return _timed(step, device, args.reps)
        finally:
            if kind == "peer":
                m.reset_attention_backend()
            else:
                bd.disable(m)

    times1 = {name: [] for name, _, _ in configs}
    for _ in range(args.rounds):
        for name, kind, lam in configs:
            times1[name].append(timed_config(m1, step1, kind, lam))
    del m1
    results = {"tokens": tokens, "world": args.world, "peers": peers,
               "lams": {str(k): v for k, v in lams.items()},
               "one": {n: dict(ms=statistics.median(times1[n]), ms_rounds=times1[n],
                               sparsity=one[n]["sparsity"], lam=one[n]["lam"],
                               rel_err_native=one[n]["rel_err_native"]) for n in one},
               "parallel": {}}
    for mode in args.modes:
        cfg = ContextParallelConfig(**MODES[mode](args.world))
        m, _, _, _ = _model_and_inputs(args, device)
        m.enable_parallelism(config=cfg)
        step = stepper(m, x, enc)
        # diffusers' "native" backend has no LSE, so no ring (on the CPU check: no peer there)
        mode_configs = [c for c in configs if not (c[2] == "native" and cfg.ring_degree > 1)]
        rows = {}
        for name, (out, sp, fb) in outputs(m, step, mode_configs, True).items():
            rows[name] = dict(sparsity=sp, fallbacks=fb,
                              rel_err_one=float((out - one[name]["out"]).norm() /
                                                one[name]["out"].norm()))
        for name, kind, lam in mode_configs:
            if kind == "skip" and cfg.ring_degree > 1:  # the same ring without seeds
                seed_fn = bd._ring_seed
                bd._ring_seed = lambda q, k, scale, skip, cp: torch.full(
                    (q.shape[0], q.shape[2], q.shape[1]), -math.inf,
                    dtype=torch.float64 if q.dtype == torch.float64 else torch.float32,
                    device=q.device)
                try:
                    _, rows[name]["sparsity_unseeded"], _ = measure(step, m, lam, True)
                finally:
                    bd._ring_seed = seed_fn
        times = {name: [] for name, _, _ in mode_configs}
        for _ in range(args.rounds):
            for name, kind, lam in mode_configs:
                times[name].append(timed_config(m, step, kind, lam))
        for name in rows:
            rows[name]["ms"] = statistics.median(times[name])
            rows[name]["ms_rounds"] = times[name]
        results["parallel"][mode] = dict(config={"ring_degree": cfg.ring_degree,
                                                 "ulysses_degree": cfg.ulysses_degree}, rows=rows)
        del m
    if rank == 0:
        _report(args, results, device)
    dist.barrier()
    dist.destroy_process_group()
    # leave without the interpreter's teardown: a gloo worker aborts now and then at exit after
    # all its work ('terminate called without an active exception'; tests/python/mp_helpers.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _report(args, res, device):
    name_dev = "CPU (gloo, logic check)" if device.type == "cpu" else torch.cuda.get_device_name()
    lines = [f"# Context parallelism: Wan-style DiT step, {res['tokens']} tokens, {args.world} x "
             f"{name_dev}", "",
             "lambda per target from the one-GPU run: " +
             ", ".join(f"{float(t):.0%}: {lam:.3g}" for t, lam in res["lams"].items()), "",
             f"| config | configuration | step ms | x {res['peers'][0]} (same config) | scaling vs 1 GPU | "
             "sparsity | unseeded ring | rel. error vs 1 GPU |", "|---|---|---|---|---|---|---|---|"]
    one, peer = res["one"], res["peers"][0]
    for name, r in one.items():
        lines.append(f"| 1 GPU | {name} | {r['ms']:.2f} | {one[peer]['ms'] / r['ms']:.3f} | "
                     f"1 | {r['sparsity']:.3f} | - | {r['rel_err_native']:.2e} (vs {peer}) |")
    for mode, p in res["parallel"].items():
        rows = p["rows"]
        label = f"{mode} (ring {p['config']['ring_degree']}, Ulysses {p['config']['ulysses_degree']})"
        for name, r in rows.items():
            uns = r.get("sparsity_unseeded")
            base = rows[peer]["ms"] if peer in rows else float("nan")
            lines.append(f"| {label} | {name} | {r['ms']:.2f} | {base / r['ms']:.3f} | "
                         f"{one[name]['ms'] / r['ms']:.2f} | {r['sparsity']:.3f} | "
                         f"{'-' if uns is None else f'{uns:.3f}'} | {r['rel_err_one']:.2e} |")
    text = "\n".join(lines)
    print(text, flush=True)
    os.makedirs(args.out, exist_ok=True)
    tag = "cpu_check" if device.type == "cpu" else f"{args.world}gpu"
    with open(os.path.join(args.out, f"bench_cp_{tag}.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, f"bench_cp_{tag}.json"), "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=0, help="processes / GPUs (0: every GPU)")
    ap.add_argument("--modes", default="")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--targets", default="0.5,0.7")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="steps per timing")
    ap.add_argument("--bisect-steps", type=int, default=10)
    ap.add_argument("--qk-gain", type=float, default=4.0)
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.cpu_check:
        args.world = args.world or 2
        args.rounds, args.reps, args.bisect_steps = min(args.rounds, 2), 1, min(args.bisect_steps, 4)
    else:
        n = torch.cuda.device_count()
        args.world = args.world or n
        if args.world < 2 or n < args.world:
            sys.exit(f"bench_cp: needs {max(2, args.world)} GPUs, torch sees {n}")
    modes = args.modes.split(",") if args.modes else \
        ["ulysses", "ring"] + (["unified"] if args.world >= 4 else [])
    for mo in modes:
        if mo not in MODES:
            sys.exit(f"bench_cp: unknown mode {mo!r} (one of {', '.join(MODES)})")
    args.modes = modes
    args.targets = [float(t) for t in args.targets.split(",")]
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(args, os.path.join(tmp, "init")), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
