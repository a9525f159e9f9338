#!/usr/bin/env python3
"""Backward beside its peers (issue 14, SPEC §8/§9): blasst.attention's autograd (our forward
recording its skip set, then the sm_90a backward kernels) against torch SDPA's cuDNN and flash
backends on the same tensors, in one process: forward + backward, and backward alone (the
autograd graph kept, only torch.autograd.grad timed). Skip rows: lambda from the forward's own
one-pass curve (a histogram run that skips nothing, SkipStats.sparsity_at, bisected in ln lambda)
at target sparsities 0.5 / 0.7 / 0.9 on the llm (causal) and dit (full) workloads of
bench/prefill/bench_prefill.py; the achieved sparsity is counted in a separate statistics run.

FLOPs: forward 4 B H Lq Lk d (halved for causal), backward 2.5x that (the FlashAttention
convention), forward + backward 3.5x; skip rows quote the speedup over our own dense rows.
Timing: interleaved rounds after a warm-up, median (CUDA events on a GPU, wall clock on the CPU).

  bench_backward_peers.py --out DIR [--quick] [--d64] [--iters N]
  bench_backward_peers.py --device cpu --tiny    the mechanics on the CPU reference (no peer but
                                                 SDPA's math backend, i.i.d. inputs; figures meaningless)
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "prefill"))
import bench_prefill as bp  # noqa: E402  (workloads and FLOP count)

import blasst  # noqa: E402


def inputs(kind, B, L, H, Hk, d, seed, dtype, device):
    if device == "cuda":
        q, k, v = bp.gen(kind, B, L, H, Hk, d, seed, dtype)
    else:  # CPU smoke run (the workload generators are CUDA-only): normal, llm with a strong sink
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(B, L, h, d, generator=g) for h in (H, Hk, Hk))
        if kind != "random":
            u = torch.randn(d, generator=g) * (12.0 / math.sqrt(d)) ** 0.5
            q += u
            k[:, 0] += u
        q, k, v = (x.to(dtype) for x in (q, k, v))
    g = torch.Generator(device=device).manual_seed(seed + 1)
    do = torch.randn(B, L, H, d, generator=g, device=device).to(dtype)
    return [x.requires_grad_(True) for x in (q, k, v)], do


def sdpa(q, k, v, causal, backend):
    """torch SDPA on [B, L, H, d] tensors (transposed views), output back in [B, L, H, d]."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def lambda_for(q, k, v, causal, s, order):
    """Smallest lambda whose one-pass sparsity (SPEC §5) reaches s on these tensors, or None."""
    st = blasst.SkipStats(histogram=True)
    with torch.no_grad():
        blasst.attention(q, k, v, causal=causal, stats=st,
                         skip=blasst.SkipSoftmax(threshold=1e-30, order=order))
    lo, hi = math.log(1e-30), 0.0  # sparsity_at is non-decreasing in lambda
    if st.sparsity_at(math.exp(hi) * (1 - 1e-9)) < s:
        return None
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if st.sparsity_at(math.exp(mid)) >= s:
            hi = mid
        else:
            lo = mid
    return math.exp(hi)


def achieved(q, k, v, causal, skip):
    st = blasst.SkipStats()
    with torch.no_grad():
        blasst.attention(q, k, v, causal=causal, skip=skip, stats=st)
    return st.sparsity()


def timed(fns, iters, warmup, device):
    """Median ms of each callable over interleaved rounds (bench_prefill's on a GPU)."""
    if device == "cuda":
        return [m for m, _ in bp.interleaved_ms(fns, iters, warmup)]
    for fn in fns:
        for _ in range(warmup):
            fn()
    ts = [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            ts[i].append(1e3 * (time.perf_counter() - t0))
    return [statistics.median(t) for t in ts]


def row(kind, B, L, H, Hk, d, causal, args):
    dtype = torch.bfloat16
    (q, k, v), do = inputs(kind, B, L, H, Hk, d, 1234 + L, dtype, args.device)
    peers = ([("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
             if args.device == "cuda" else [("math", SDPBackend.MATH)])
    runs = [("ours", lambda skip=None: blasst.attention(q, k, v, causal=causal, skip=skip))]
    runs += [(n, lambda skip=None, b=b: sdpa(q, k, v, causal, b)) for n, b in peers]
    r = {"workload": kind, "B": B, "L": L, "H": H, "Hk": Hk, "d": d, "mask": "causal" if causal else "full"}
    skips = []
    if kind != "random":
        for s in args.targets:
            lam = lambda_for(q, k, v, causal, s, args.order)
            if lam is None:
                skips.append({"target": s})
                continue
            sk = blasst.SkipSoftmax(threshold=lam, order=args.order)
            skips.append({"target": s, "lambda": lam, "skip": sk, "achieved": achieved(q, k, v, causal, sk)})
    names, fns = [], []
    for name, fwd in runs + [(f"skip{e['target']}", lambda skip=e["skip"]: blasst.attention(
            q, k, v, causal=causal, skip=skip)) for e in skips if "skip" in e]:
        def fwd_bwd(fwd=fwd):
            torch.autograd.grad(fwd(), (q, k, v), do)
        try:
            out = fwd()  # the graph kept for the backward-alone runs
        except RuntimeError as e:  # a peer without a kernel for this shape
            r[name + "_error"] = str(e).splitlines()[0]
            continue
        names += [name + "_fb", name + "_b"]
        fns += [fwd_bwd, lambda out=out: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)]
    ms = dict(zip(names, timed(fns, args.iters, args.warmup, args.device)))
    fl = bp.flops(B, H, L, L, d, causal)
    for n, t in ms.items():
        r[n + "_ms"] = t
    for name in [n for n, _ in runs]:
        if name + "_b" in ms:
            r[name + "_b_tflops"] = 2.5 * fl / ms[name + "_b"] / 1e9
            r[name + "_fb_tflops"] = 3.5 * fl / ms[name + "_fb"] / 1e9
    r["skip"] = []
    for e in skips:
        x = {"target": e["target"]}
        if "skip" in e:
            n = f"skip{e['target']}"
            x.update(lam=e["lambda"], achieved=e["achieved"], bwd_x=ms["ours_b"] / ms[n + "_b"],
                     fwd_bwd_x=ms["ours_fb"] / ms[n + "_fb"])
        r["skip"].append(x)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="B 1, H 32, d 128, L 8k and 16k")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke sizes (L 256, 2 heads)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--order", default="max_first", choices=["natural", "max_first"])
    ap.add_argument("--targets", type=float, nargs="*", default=[0.5, 0.7, 0.9])
    ap.add_argument("--d64", action="store_true",
                    help="add d = 64 rows at each length: random causal and full, and the llm (causal, "
                         "GQA 32/8) and dit (full) workloads with their skip rows")
    args = ap.parse_args()
    if args.tiny:
        configs = [("random", 1, 1024, 2, 2, 64, True), ("llm", 1, 1024, 2, 2, 64, True)]
    else:
        Ls = [8192, 16384] if args.quick else [8192, 16384, 32768]
        configs = []
        for L in Ls:
            configs += [("random", 1, L, 32, 32, 128, True), ("random", 1, L, 32, 32, 128, False),
                        ("llm", 1, L, 32, 8, 128, True), ("dit", 1, L, 32, 32, 128, False)]
            if args.d64:
                configs += [("random", 1, L, 32, 32, 64, True), ("random", 1, L, 32, 32, 64, False),
                            ("llm", 1, L, 32, 8, 64, True), ("dit", 1, L, 32, 32, 64, False)]
    rows = [row(*c, args) for c in configs]
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    peer = "cudnn" if args.device == "cuda" else "math"
    f = lambda x, p=0: "-" if x is None else f"{x:.{p}f}"
    lines = [f"# backward beside torch SDPA, {dev}, commit {commit}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "bf16; TFLOP/s (backward 2.5x, forward + backward 3.5x the forward's FLOPs); ms in brackets; "
             f"skip: {args.order} order, lambda from the forward's one-pass curve", "",
             "| workload | L | H/Hk | d | mask | bwd ours | bwd cuDNN | bwd flash | ours/cuDNN bwd | "
             "fwd+bwd ours | fwd+bwd cuDNN | fwd+bwd flash | skip 50 / 70 / 90: ach, bwd x, fwd+bwd x |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda n, kind: (f"{f(r.get(f'{n}_{kind}_tflops'))} ({f(r.get(f'{n}_{kind}_ms'), 2)})"
                                if f"{n}_{kind}_ms" in r else r.get(n + "_error", "-"))
        ratio = (r["ours_b_tflops"] / r[peer + "_b_tflops"]) if peer + "_b_tflops" in r else None
        sk = " / ".join("unreachable" if "achieved" not in e else
                        f"{e['achieved']:.2f}, {e['bwd_x']:.2f}x, {e['fwd_bwd_x']:.2f}x" for e in r["skip"]) or "-"
        lines.append(f"| {r['workload']} | {r['L']} | {r['H']}/{r['Hk']} | {r['d']} | {r['mask']} | {cell('ours', 'b')} | "
                     f"{cell(peer, 'b')} | {cell('flash', 'b')} | {f(ratio, 3)} | {cell('ours', 'fb')} | "
                     f"{cell(peer, 'fb')} | {cell('flash', 'fb')} | {sk} |")
    table = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_backward_peers.json"), "w") as fh:
        json.dump({"device": dev, "commit": commit, "order": args.order, "rows": rows}, fh, indent=1)
    with open(os.path.join(args.out, "bench_backward_peers.md"), "w") as fh:
        fh.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
