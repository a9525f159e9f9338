"""A small decoder-only LM (pre-norm, RoPE, GQA, SwiGLU, tied embeddings) whose attention call
is pluggable: training uses torch SDPA, evaluation blasst.attention (bench/model/README.md).

Attention functions take q [B, L, Hq, hd], k/v [B, L, Hk, hd] (blasst's layout, after RoPE) and
the layer index, and return [B, L, Hq, hd]."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelConfig:
    vocab: int = 4160
    d_model: int = 512
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    d_ff: int = 1408
    rope_theta: float = 50000.0
    max_len: int = 16384

    def to_dict(self):
        return asdict(self)


def sdpa_attention(q, k, v, layer):
    g = q.shape[2] // k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if g > 1:
        kt = kt.repeat_interleave(g, dim=1)
        vt = vt.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(cfg: ModelConfig, length: int, device):
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half))
    t = torch.arange(length, device=device, dtype=torch.float32)
    f = torch.outer(t, inv)  # [L, half]
    return f.cos(), f.sin()


def apply_rope(x, cos, sin):
    # x [B, L, H, hd]; rotate halves
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int):
        super().__init__()
        self.cfg, self.idx = cfg, idx
        d, hd = cfg.d_model, cfg.head_dim
        self.n1 = RMSNorm(d)
        self.wq = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.n2 = RMSNorm(d)
        self.w1 = nn.Linear(d, cfg.d_ff, bias=False)
        self.w3 = nn.Linear(d, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, d, bias=False)

    def forward(self, x, cos, sin, attn):
        B, L, _ = x.shape
        cfg = self.cfg
        h = self.n1(x)
        q = self.wq(h).view(B, L, cfg.n_heads, cfg.head_dim)
        k = self.wk(h).view(B, L, cfg.n_kv_heads, cfg.head_dim)
        v = self.wv(h).view(B, L, cfg.n_kv_heads, cfg.head_dim).contiguous()
        q = apply_rope(q, cos, sin).contiguous()
        k = apply_rope(k, cos, sin).contiguous()
        o = attn(q, k, v, self.idx)
        x = x + self.wo(o.reshape(B, L, cfg.n_heads * cfg.head_dim))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class LM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.d_model)
        self.apply(self._init)
        for b in self.blocks:
            nn.init.normal_(b.wo.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
            nn.init.normal_(b.w2.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens, attn=sdpa_attention):
        B, L = tokens.shape
        cos, sin = rope_tables(self.cfg, L, tokens.device)
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, cos, sin, attn)
        x = self.norm(x)
        return F.linear(x, self.emb.weight)

    def loss(self, tokens, targets, attn=sdpa_attention, reduction="mean"):
        logits = self.forward(tokens, attn)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1),
                               reduction=reduction)
