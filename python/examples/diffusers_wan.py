"""A Wan pipeline with its self-attention on blasst (blasst.diffusers), timestep-gated.

With a local Diffusers-format Wan checkpoint (e.g. Wan2.2-T2V-A14B-Diffusers, whose transformer/
and transformer_2/ config.json carry a sparse_attention_config), the one added line is
``blasst.diffusers.enable(pipe)``. Without a checkpoint it builds a two-expert WanPipeline with
small random-weight transformers (no text encoder, no VAE: random prompt embeddings, latent output)
and a direct SkipSoftmax gated at --until, which shows the mechanics and the statistics:

    python python/examples/diffusers_wan.py --cpu                 # tiny, CPU reference engine
    python python/examples/diffusers_wan.py                       # GPU, random weights, 16k tokens
    python python/examples/diffusers_wan.py --model /path/to/Wan2.2-T2V-A14B-Diffusers --prompt "..."
"""
import argparse

import torch

import blasst
import blasst.diffusers


def random_pipeline(device, dtype, cpu):
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    def transformer(seed):
        torch.manual_seed(seed)
        heads, dim = (2, 16) if cpu else (8, 128)
        m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                  attention_head_dim=dim, in_channels=16, out_channels=16,
                                  text_dim=64, freq_dim=64, ffn_dim=4 * heads * dim,
                                  num_layers=2, rope_max_seq_len=1024).eval()
        with torch.no_grad():  # DiT-like locality for random weights: keys share the q projection
            for blk in m.blocks:
                blk.attn1.to_k.load_state_dict(blk.attn1.to_q.state_dict())
                blk.attn1.norm_q.weight.mul_(4.0)
                blk.attn1.norm_k.weight.copy_(blk.attn1.norm_q.weight)
        return m.to(device=device, dtype=dtype)

    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=3.0)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=sched,
                       transformer=transformer(0), transformer_2=transformer(1),
                       boundary_ratio=0.875)


def smooth_latents(shape, device, dtype):
    g = torch.Generator().manual_seed(0)
    low = torch.randn(shape[0], shape[1], 2, 4, 4, generator=g)
    x = torch.nn.functional.interpolate(low, size=shape[2:], mode="trilinear", align_corners=True)
    return (x + 0.1 * torch.randn(*shape, generator=g)).to(device, dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a local Diffusers-format Wan folder (default: random weights)")
    ap.add_argument("--prompt", default="a cat surfing a wave at sunset")
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU reference engine")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--until", type=float, default=0.9, help="disabled_until_timestep (random)")
    ap.add_argument("--threshold", type=float, default=0.05, help="lambda (random weights)")
    args = ap.parse_args()
    device = "cpu" if args.cpu else "cuda"
    dtype = torch.float32 if args.cpu else torch.bfloat16
    height, width, frames = (256, 256, 5) if args.cpu else (512, 512, 13)

    if args.model:
        from diffusers import WanPipeline
        pipe = WanPipeline.from_pretrained(args.model, torch_dtype=dtype).to(device)
        handle = blasst.diffusers.enable(pipe)   # settings from transformer*/config.json
        call = dict(prompt=args.prompt)
    else:
        pipe = random_pipeline(device, dtype, args.cpu)
        skip = blasst.SkipSoftmax(threshold=args.threshold, disabled_until_timestep=args.until)
        handle = blasst.diffusers.enable(pipe, skip=skip)   # cross-attention (attn2) stays dense
        g = torch.Generator().manual_seed(1)
        latent = (1, 16, (frames - 1) // 4 + 1, height // 8, width // 8)
        call = dict(prompt_embeds=torch.randn(1, 16, 64, generator=g).to(device, dtype),
                    negative_prompt_embeds=torch.randn(1, 16, 64, generator=g).to(device, dtype),
                    latents=smooth_latents(latent, device, dtype), output_type="latent")
    print(handle)
    with blasst.diffusers.record_stats() as rec, torch.no_grad():
        out = pipe(height=height, width=width, num_frames=frames, num_inference_steps=args.steps,
                   **call).frames
    print("output:", tuple(out.shape) if hasattr(out, "shape") else type(out).__name__)
    print(f"{'component':14s} {'t':>6s} {'blasst':>6s} {'gated':>6s} {'sparsity':>8s}")
    for s in rec.steps:
        sp = s["skipped"] / s["visited"] if s["visited"] else 0.0
        print(f"{s['component']:14s} {s['t']:6.3f} {s['blasst']:6d} {s['gated']:6d} {sp:8.3f}")
    print(f"overall sparsity {rec.sparsity():.3f}; fallbacks {dict(rec.fallbacks)}")
    blasst.diffusers.disable(pipe)


if __name__ == "__main__":
    main()
