"""A denoise loop with timestep-gated Skip-Softmax (SPEC §4), on a toy DiT-like attention.

The loop publishes each step's timestep with blasst.diffusion.record_denoise_step; the attention
calls carry a SkipSoftmax with disabled_until_timestep = D, so the early (noisy, t > D) steps run
dense and skipping starts once t <= D. The "model" is a stand-in: queries and keys are tokens on a
T x H x W grid whose similarity falls off with distance (the structure real DiT attention has),
sharpened as the sample gets cleaner. Runs on the CPU reference with numpy; with torch and a GPU
(--cuda) it runs the kernels on bf16 tensors.

    python python/examples/denoise_loop.py [--steps 20] [--grid 4 16 16] [--cuda]
"""
import argparse
import math

import numpy as np

import blasst


def grid_tokens(T, H, W, d, rng):
    """Token features whose dot products fall off with 3-D grid distance."""
    t, h, w = np.meshgrid(np.arange(T), np.arange(H), np.arange(W), indexing="ij")
    pos = np.stack([t.ravel(), h.ravel(), w.ravel()], axis=1).astype(np.float64)
    freqs = rng.standard_normal((3, d // 2)) * 0.35
    ang = pos @ freqs
    feats = np.concatenate([np.cos(ang), np.sin(ang)], axis=1)
    return feats / np.sqrt(d // 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--grid", type=int, nargs=3, default=[4, 16, 16], metavar=("T", "H", "W"))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=1e-3, help="lambda")
    ap.add_argument("--disabled-until", type=float, default=0.86, help="D in [0, 1]")
    ap.add_argument("--cuda", action="store_true", help="torch bf16 tensors on the GPU")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    T, H, W = args.grid
    L, d, heads = T * H * W, args.dim, args.heads
    base = grid_tokens(T, H, W, d, rng)                        # [L, d]
    skip = blasst.SkipSoftmax(threshold=args.threshold, order="max_first",
                              disabled_until_timestep=args.disabled_until)
    num_train_timesteps = 1000
    # Uneven spacing, as real schedulers use: the gate reads the timestep, not the step index.
    timesteps = (num_train_timesteps - 1) * (1 - np.linspace(0, 1, args.steps) ** 1.5)
    x = rng.standard_normal((L, d))
    blasst.diffusion.reset()
    print(f"{L} tokens ({T}x{H}x{W}), {heads} heads, d={d}, lambda={args.threshold}, "
          f"D={args.disabled_until}")
    for i, ts in enumerate(timesteps):
        t = blasst.diffusion.record_denoise_step(float(ts), num_train_timesteps)
        sharp = 2.0 + 14.0 * (1.0 - t)                           # cleaner sample: sharper attention
        feats = (1.0 - t) * base * sharp + t * x * 0.3
        q = np.repeat(feats[None, :, None, :], heads, axis=2).astype(np.float32)
        k = q + 0.05 * rng.standard_normal(q.shape).astype(np.float32)
        v = rng.standard_normal((1, L, heads, d)).astype(np.float32)
        if args.cuda:
            import torch
            q, k, v = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
        stats = {}
        out = blasst.attention(q, k, v, skip=skip, stats=stats)
        x = 0.9 * x + 0.1 * np.asarray(out[0, :, 0].float().cpu() if args.cuda else out[0, :, 0],
                                       dtype=np.float64)
        state = "dense (gated)" if stats["gated"] else f"sparsity {stats['sparsity']:.3f}"
        print(f"step {i:2d}  timestep {ts:6.1f}  t={t:.3f}  {state}")
    blasst.diffusion.reset()
    assert math.isfinite(float(np.abs(x).sum()))


if __name__ == "__main__":
    main()
