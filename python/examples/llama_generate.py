"""Generate with attn_implementation="blasst" and report per-layer Skip-Softmax sparsity.

    python python/examples/llama_generate.py                      # tiny random Llama
    python python/examples/llama_generate.py --model /path/ckpt   # a local checkpoint

A checkpoint whose config.json carries sparse_attention_config (SPEC §7) gets its per-layer
settings from there; otherwise --factor sets one raw threshold_scale_factor for every layer.
Runs the CUDA kernels on a Hopper GPU (bf16), else the CPU reference (float32, slow for long
prompts).
"""
import argparse

import torch

import blasst
import blasst.transformers as bt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="local checkpoint folder (default: a tiny random Llama)")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--factor", type=float, default=None,
                    help="raw threshold_scale_factor for models without a config block")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    cuda = torch.cuda.is_available() and blasst.cuda_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    default = blasst.SkipSoftmax(factor=args.factor) if args.factor else None
    bt.register(skip=default)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="blasst",
                                                     dtype=dtype)
    else:
        cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, max_position_embeddings=8192)
        cfg._attn_implementation = "blasst"
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    model = model.to(device=device, dtype=dtype).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), bt.record_stats() as rec:
        out = model.generate(ids.to(device), max_new_tokens=args.new_tokens, do_sample=False)
    print(f"device {device} ({blasst.cuda_device_name() or 'CPU reference'}), "
          f"generated {out.shape[1] - ids.shape[1]} tokens")
    for key, e in sorted(rec.layers.items()):
        sp = e["skipped"] / e["visited"] if e["visited"] else 0.0
        print(f"  {key:40s} calls {e['calls']:3d}  sparsity {sp:.3f}")
    print(f"prefill sparsity {rec.sparsity('prefill'):.3f}, decode sparsity "
          f"{rec.sparsity('decode'):.3f}")


if __name__ == "__main__":
    main()
