"""Transformer-level speed of blasst.diffusers on a Wan-style DiT (issue 16), against diffusers'
native backend (torch SDPA) on the same model, inputs and GPU in the same run.

Model: WanTransformer3DModel with random weights at a Wan 2.1 1.3B-like width (12 heads x 128,
ffn 8960) and NUM_LAYERS blocks; latents of 21 x 60 x 104 (480p, 81 frames) -> 21 x 30 x 52 =
32,760 tokens after the 1x2x2 patch. Random weights give no natural attention locality, so keys
share the queries' projection and q, k are scaled up (as tests/python/test_diffusers_gpu.py);
the sparsity each threshold reaches is measured, not assumed, and reported with the output error
against the native step.

Per configuration: median ms of one transformer forward (one denoise step, timestep past the
gate), interleaved rounds, each timing after one untimed call. Attention share: the CUDA time of
the native step's attention kernels (names matching flash / fmha / sdpa / attention; self- and
cross-attention) over the step's CUDA time, from torch.profiler. --qk-gain sets how peaked the
random model's self-attention is (the q/k norm gain; larger: sparser at every lambda).

    python3 bench/diffusers/bench_wan.py [--layers 4] [--rounds 5] [--qk-gain 4] [--out DIR]
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import blasst
import blasst.diffusers as bd
from diffusers import WanTransformer3DModel

HEADS, HEAD_DIM = 12, 128
LATENT = (1, 16, 21, 60, 104)
TEXT = (1, 512, 4096)


def model(layers, device, qk_gain, dtype=torch.bfloat16, **dims):
    """The Wan-like model (dims: WanTransformer3DModel arguments over the defaults here)."""
    torch.manual_seed(0)
    args = dict(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                num_layers=layers)
    args.update(dims)
    m = WanTransformer3DModel(**args).eval()
    with torch.no_grad():
        for blk in m.blocks:
            a = blk.attn1
            a.to_k.weight.copy_(a.to_q.weight)
            a.to_k.bias.copy_(a.to_q.bias)
            a.norm_q.weight.mul_(qk_gain)
            a.norm_k.weight.copy_(a.norm_q.weight)
    return m.to(device=device, dtype=dtype)


def inputs(device):
    g = torch.Generator().manual_seed(7)
    low = torch.randn(LATENT[0], LATENT[1], 6, 8, 8, generator=g)
    x = F.interpolate(low, size=LATENT[2:], mode="trilinear", align_corners=True)
    x = x + 0.1 * torch.randn(*LATENT, generator=g)
    return x.to(device, torch.bfloat16), torch.randn(*TEXT, generator=g).to(device, torch.bfloat16)


def timed(fn, n=3):
    fn()  # untimed: first-call work (backend selection, allocations) stays out of the figure
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--thresholds", default="1e-3,1e-2,5e-2,1e-1")
    ap.add_argument("--qk-gain", type=float, default=4.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    m = model(args.layers, dev, args.qk_gain)
    x, enc = inputs(dev)
    t_step = torch.tensor([500.0], device=dev)
    tokens = LATENT[2] * (LATENT[3] // 2) * (LATENT[4] // 2)

    def step():
        with torch.no_grad():
            return m(x, t_step, enc, return_dict=False)[0]

    ref = step().float()
    lams = [float(s) for s in args.thresholds.split(",")]
    configs = [("native", None), ("blasst dense", "dense")] + [(f"skip lambda {lam:g}", lam) for lam in lams]
    rows = {}
    for name, lam in configs:  # sparsity and error once per configuration (statistics on)
        if lam is None:
            rows[name] = dict(sparsity=0.0, rel_err=0.0)
            continue
        skip = blasst.SkipSoftmax.dense() if lam == "dense" else blasst.SkipSoftmax(threshold=lam, order="max_first")
        bd.enable(m, skip=skip)
        try:
            with bd.record_stats() as rec:
                out = step().float()
            rows[name] = dict(sparsity=rec.sparsity(), rel_err=((out - ref).norm() / ref.norm()).item(),
                              fallbacks=dict(rec.fallbacks))
        finally:
            bd.disable(m)
    times = {name: [] for name, _ in configs}
    for _ in range(args.rounds):  # interleaved: each round times every configuration once
        for name, lam in configs:
            if lam is not None:
                skip = blasst.SkipSoftmax.dense() if lam == "dense" else blasst.SkipSoftmax(threshold=lam, order="max_first")
                bd.enable(m, skip=skip)
            step()
            times[name].append(timed(step))
            if lam is not None:
                bd.disable(m)
    # Attention share of the native step: its attention kernels' CUDA time over all its kernels'.
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    total = attn = 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = e.self_cuda_time_total
        total += t
        if any(w in e.key.lower() for w in ("flash", "fmha", "sdpa", "attention")):
            attn += t
    share = attn / total if total else float("nan")
    for name in rows:
        rows[name]["ms"] = statistics.median(times[name])
        rows[name]["ms_rounds"] = times[name]
    native = rows["native"]["ms"]
    lines = [f"# blasst.diffusers step time, WanTransformer3DModel random weights, {args.layers} layers, "
             f"{HEADS} x {HEAD_DIM}, {tokens} tokens, bf16, {torch.cuda.get_device_name()}", "",
             f"q/k gain {args.qk_gain:g}; native step: attention kernels {attn / 1e3:.2f} ms of "
             f"{total / 1e3:.2f} ms CUDA time = {100 * share:.1f} %", "",
             "| configuration | step ms (median of rounds) | x native | sparsity | rel. error vs native |",
             "|---|---|---|---|---|"]
    for name in rows:
        r = rows[name]
        lines.append(f"| {name} | {r['ms']:.2f} | {native / r['ms']:.3f} | {r['sparsity']:.3f} | {r['rel_err']:.2e} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    tag = f"_gain{args.qk_gain:g}"
    with open(os.path.join(args.out, f"bench_wan{tag}.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, f"bench_wan{tag}.json"), "w") as f:
        json.dump(dict(rows=rows, attention_share=share, attention_ms=attn / 1e3, cuda_ms=total / 1e3,
                       qk_gain=args.qk_gain, layers=args.layers, tokens=tokens), f, indent=1)


if __name__ == "__main__":
    main()
