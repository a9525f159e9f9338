#!/usr/bin/env python3
"""Train a small LM from scratch on an offline code corpus, then measure Skip-Softmax accuracy on
held-out files through blasst.attention (bench/model/README.md).

    python bench/model/recipe.py --out DIR            # GPU: the full recipe
    python bench/model/recipe.py --out DIR --tiny     # CPU: tiny model, 256-token context

Writes DIR/results.json (rewritten after every row), DIR/results.md, DIR/log.txt, the
tokenizer and the checkpoint shards (ckpt_*.pt, < 15 MiB each)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
from model import LM, ModelConfig, sdpa_attention  # noqa: E402
from tables import markdown  # noqa: E402

T0 = time.time()
LOG = None


def log(msg):
    line = f"[{time.strftime('%H:%M:%S')} +{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


# ---------------------------------------------------------------------------------------------
# data

class Stream:
    """Documents concatenated (each starts with BOS); sequences start at document starts."""

    def __init__(self, docs):
        self.tokens = np.concatenate(docs) if docs else np.zeros(0, np.uint16)
        lens = np.array([len(d) for d in docs], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if len(docs) else lens

    def valid_starts(self, length):
        return self.starts[self.starts + length + 1 <= len(self.tokens)]

    def seqs(self, length, n, rng):
        st = self.valid_starts(length)
        if len(st) == 0:
            raise RuntimeError(f"no document start leaves {length + 1} tokens")
        pick = rng.choice(st, size=n, replace=len(st) < n)
        return np.stack([self.tokens[s:s + length + 1] for s in pick]).astype(np.int64)


def batches(arr, max_tokens):
    L = arr.shape[1] - 1
    bs = max(1, max_tokens // L)
    for i in range(0, len(arr), bs):
        yield arr[i:i + bs]


# ---------------------------------------------------------------------------------------------
# blasst attention with per-layer settings and statistics

class BlasstAttn:
    def __init__(self, skips=None, histogram=False, tile_kw=None):
        import blasst
        self.blasst = blasst
        self.skips = skips or {}  # layer -> SkipSoftmax (missing: dense)
        self.histogram = histogram
        self.tile_kw = tile_kw or {}
        self.visited = {}
        self.skipped = {}
        self.hists = {}  # layer -> list of SkipStats
        self.counted_at = None

    def __call__(self, q, k, v, layer):
        skip = self.skips.get(layer)
        st = self.blasst.SkipStats(histogram=self.histogram)
        out = self.blasst.attention(q, k, v, causal=True, skip=skip, stats=st)
        self.visited[layer] = self.visited.get(layer, 0) + st.total_visited
        self.skipped[layer] = self.skipped.get(layer, 0) + st.total_skipped
        if self.histogram:
            self.hists.setdefault(layer, []).append(st)
        self.counted_at = st.counted_at
        return out

    def sparsity(self):
        v = sum(self.visited.values())
        return sum(self.skipped.values()) / v if v else 0.0

    def per_layer(self):
        return [self.skipped.get(i, 0) / self.visited[i] if self.visited.get(i) else 0.0
                for i in sorted(self.visited)]


class DecodeAttn:
    """Teacher-forced decode: every row runs dense causal attention (torch SDPA) except the last
    n_last query positions, whose attention goes through blasst.decode over the KV cache of their
    prefix, qlen query tokens per step (bottom-right causal within a step), the cache being the
    layer's full K/V with seqlens = the step's end (no copy). skips: layer -> SkipSoftmax (phase
    decode); missing: dense decode."""

    def __init__(self, skips, n_last, qlen, histogram=False):
        import blasst
        self.blasst = blasst
        self.skips = skips or {}
        self.n_last, self.qlen, self.histogram = n_last, qlen, histogram
        self.visited, self.skipped, self.hists = {}, {}, {}
        self.counted_at = None
        self.granularity = None

    def __call__(self, q, k, v, layer):
        L = q.shape[1]
        start = max(0, L - self.n_last)
        out = sdpa_attention(q, k, v, layer)
        kc, vc = k.contiguous(), v.contiguous()
        skip = self.skips.get(layer)
        parts = [out[:, :start]]
        for s in range(start, L, self.qlen):
            e = min(s + self.qlen, L)
            sl = torch.full((q.shape[0],), e, dtype=torch.int32, device=q.device)
            st = self.blasst.SkipStats(histogram=self.histogram)
            parts.append(self.blasst.decode(q[:, s:e].contiguous(), kc, vc, seqlens=sl,
                                            max_seqlen_k=e, skip=skip, causal=True, stats=st))
            self.visited[layer] = self.visited.get(layer, 0) + st.total_visited
            self.skipped[layer] = self.skipped.get(layer, 0) + st.total_skipped
            if self.histogram:
                self.hists.setdefault(layer, []).append(st)
            self.counted_at, self.granularity = st.counted_at, st.granularity
        return torch.cat(parts, dim=1)

    sparsity = BlasstAttn.sparsity
    per_layer = BlasstAttn.per_layer


def curve(stats_list, lam):
    v = sum(s.total_visited for s in stats_list)
    return sum(s.sparsity_at(lam) * s.total_visited for s in stats_list) / v if v else 0.0


def lambda_for_target(stats_list, target, lo=1e-30, hi=0.999):
    """Smallest-error lambda (bisection in log space) with curve(lambda) ~= target; returns
    (lambda, curve value, reachable)."""
    if curve(stats_list, hi) < target:
        return hi, curve(stats_list, hi), False
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        m = 0.5 * (a + b)
        if curve(stats_list, math.exp(m)) >= target:
            b = m
        else:
            a = m
    lam = math.exp(b)
    return lam, curve(stats_list, lam), True


# ---------------------------------------------------------------------------------------------
# evaluation helpers

@torch.no_grad()
def eval_loss(model, seqs, attn, dev, max_tokens, loss_from=0):
    """Mean NLL (nats/token) over targets at positions >= loss_from."""
    tot, n = 0.0, 0
    for b in batches(seqs, max_tokens):
        x = torch.from_numpy(b[:, :-1]).to(dev)
        y = torch.from_numpy(b[:, 1:]).to(dev)
        logits = model(x, attn)[:, loss_from:]
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                              y[:, loss_from:].reshape(-1), reduction="sum")
        tot += float(nll)
        n += y[:, loss_from:].numel()
    return tot / max(n, 1)


def copy_probe_seqs(stream, length, n, rng):
    """A held-out sequence whose last S = length/8 tokens repeat a random span of its first
    half. Loss is taken on the repeated span (all but its first token)."""
    base = stream.seqs(length, n, rng)
    S = max(4, length // 8)
    out = base.copy()
    for i in range(n):
        p = int(rng.integers(1, max(2, length // 2 - S)))
        out[i, length + 1 - S:] = base[i, p:p + S]
    return out, length + 1 - S  # loss_from index in the input positions (predicting copy[1:])


class AnalysisAttn:
    """Explicit softmax (float32): sink mass (probability on key 0), mass on document starts
    (BOS keys, key 0 included: a model that sinks into each document's first token rather than
    the sequence's shows it here, not in the sink mass) and mass by distance. bos_mask: [N, L]
    bool, key j of the n-th sequence (in the order eval_loss feeds them) is a BOS."""

    def __init__(self, n_layers, length, tile, bos_mask=None):
        self.n_layers, self.L, self.tile = n_layers, length, tile
        nb = int(math.floor(math.log2(length))) + 1
        self.nb = nb
        self.sink = [0.0] * n_layers
        self.bos_mask = bos_mask
        self.bos = [0.0] * n_layers
        self._row = self._next = 0  # rows of bos_mask in the current batch (advanced at layer 0)
        self.by_log2 = [[0.0] * (nb + 1) for _ in range(n_layers)]
        self.by_tile = [[0.0] * (length // tile + 1) for _ in range(n_layers)]
        self.rows = [0] * n_layers

    def __call__(self, q, k, v, layer):
        B, L, Hq, hd = q.shape
        g = Hq // k.shape[2]
        dev = q.device
        i = torch.arange(L, device=dev)
        dist = (i[:, None] - i[None, :])
        causal = dist >= 0
        b_log = torch.where(dist > 0, torch.floor(torch.log2(dist.clamp(min=1).float())).long() + 1,
                            torch.zeros_like(dist)).clamp(max=self.nb)
        b_tile = ((i[:, None] // self.tile) - (i[None, :] // self.tile)).clamp(min=0)
        if layer == 0:
            self._row, self._next = self._next, self._next + B
        isbos = None if self.bos_mask is None else torch.as_tensor(
            self.bos_mask[self._row:self._row + B, :L], device=dev, dtype=torch.float32)
        outs = []
        for h in range(Hq):
            qh = q[:, :, h].float()
            kh = k[:, :, h // g].float()
            vh = v[:, :, h // g].float()
            s = (qh @ kh.transpose(1, 2)) / math.sqrt(hd)
            s = s.masked_fill(~causal, float("-inf"))
            p = torch.softmax(s, dim=-1)
            outs.append((p @ vh).to(q.dtype))
            if isbos is not None:
                self.bos[layer] += float((p * isbos[:, None, :]).sum())
            ps = p.sum(0)  # [L, L]
            self.sink[layer] += float(ps[:, 0].sum())
            self.by_log2[layer] = (torch.tensor(self.by_log2[layer], device=dev) + torch.zeros(
                self.nb + 1, device=dev).index_add_(0, b_log.flatten(), ps.flatten())).tolist()
            self.by_tile[layer] = (torch.tensor(self.by_tile[layer], device=dev) + torch.zeros(
                len(self.by_tile[layer]), device=dev).index_add_(0, b_tile.flatten(),
                                                                ps.flatten())).tolist()
            self.rows[layer] += B * L
        return torch.stack(outs, dim=2)

    def result(self):
        r = []
        for l in range(self.n_layers):
            n = max(self.rows[l], 1)
            r.append({"sink_mass": self.sink[l] / n,
                      "bos_mass": None if self.bos_mask is None else self.bos[l] / n,
                      "mass_by_log2_distance": [x / n for x in self.by_log2[l]],
                      "mass_by_tile_distance": [x / n for x in self.by_tile[l]]})
        return r


# ---------------------------------------------------------------------------------------------

def ngram_baselines(train_tokens, held_tokens, vocab):
    tr = torch.from_numpy(train_tokens.astype(np.int64))
    he = torch.from_numpy(held_tokens.astype(np.int64))
    uni = torch.bincount(tr, minlength=vocab).double() + 0.5
    puni = uni / uni.sum()
    uni_loss = float(-torch.log(puni[he[1:]]).mean())
    pair = tr[:-1] * vocab + tr[1:]
    big = torch.bincount(pair, minlength=vocab * vocab).double().view(vocab, vocab)
    # interpolated (Jelinek-Mercer) bigram, lambda 0.9 -> a fair, simple baseline
    rows = big.sum(1, keepdim=True)
    pb = torch.where(rows > 0, big / rows.clamp(min=1), puni[None, :])
    p = 0.9 * pb[he[:-1], he[1:]] + 0.1 * puni[he[1:]]
    return uni_loss, float(-torch.log(p).mean())


def save_checkpoint(model, cfg, out, shard_bytes):
    sd = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        nb = v.numel() * 2
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nb
    if cur:
        shards.append(cur)
    names = []
    for i, s in enumerate(shards):
        name = f"ckpt_{i}.pt"
        torch.save(s, os.path.join(out, name))
        names.append(name)
    return names


def load_checkpoint(dirpath, names):
    sd = {}
    for n in names:
        sd.update(torch.load(os.path.join(dirpath, n), map_location="cpu"))
    return sd


def _layer_flags(fits, pooled, l, target, lam):
    f = fits[l] if fits[l] is not None else pooled
    fl = []
    if fits[l] is None:
        fl.append("pooled fit" if pooled is not None else "no fit: dense")
    if f is not None and target not in f["in_range"]:
        fl.append("extrapolated (target not reached at every calibration length)")
    if lam is not None and lam >= 1:
        fl.append("lambda >= 1: dense")
    return fl


def _fit_layers(calib, H, fit_lens, n_layers, targets, phase, C, R):
    fits = {}
    for l in range(n_layers):
        try:
            fits[l] = calib.fit_phase({L: H[L][l] for L in fit_lens}, targets)
            C["layers"].append(fits[l])
        except Exception as e:
            fits[l] = None
            C["layers"].append({"error": str(e)})
            C["errors"].append(f"layer {l}: {e}")
            # not an error: the layer's rows use the pooled fit and say so ("pooled fit" in their
            # layer_flags); the pooled fit failing below is one
            R["notes"].append(f"calibration {phase} layer {l}: {e} (falls to the pooled group)")
    try:
        pooled = calib.fit_phase({L: [s for l in range(n_layers) for s in H[L][l]]
                                  for L in fit_lens}, targets)
    except Exception as e:
        pooled = None
        C["errors"].append(f"pooled: {e}")
        R["errors"].append(f"calibration {phase} pooled: {e}")
    C["pooled"] = pooled
    return fits, pooled


def _vote(gran, dflt):
    return {k: int(gran.get(k, d)) for k, d in zip(("tile_keys", "rows", "heads", "split_tiles"),
                                                    dflt)}


def calibrated_rows(R, args, P, cfg, blasst, tile_kw, targets, calib_targets, cal_hists, ctx_data,
                    row, left, decode_row=None):
    """Fit SPEC §6 per layer (phase prefill, max-first order) from the training-split histograms
    of the training contexts, write one SPEC §7 file, parse it with blasst's loader and evaluate
    that one config at every context (bench/model/README.md, "Calibrated config")."""
    import calib
    order = "max_first"
    H = cal_hists.get(order, {})
    fit_lens = sorted(L for L in H if not ctx_data[L][3])
    if len(fit_lens) < 1:
        raise RuntimeError("no calibration histograms at a training context")
    t1 = time.time()
    n_layers = cfg.n_layers
    C = {"order": order, "phase": "prefill", "lengths": fit_lens, "targets": calib_targets,
         "fit": "blasst.calibration.fit (the package's C++ calibrate, via bench/model/calib.py)",
         "layers": [], "errors": []}
    fits, pooled = _fit_layers(calib, H, fit_lens, n_layers, calib_targets, "prefill", C, R)
    vote = _vote(R.get("calib_granularity", {}).get(order, {}), (128, 64, 1, 0))
    Hd = cal_hists.get("decode", {})
    dec_lens = sorted(L for L in Hd if L in fit_lens)
    dfits, dpooled, vote_d = {}, None, None
    if decode_row is not None and dec_lens:
        D = {"order": order, "phase": "decode", "lengths": dec_lens, "targets": calib_targets,
             "layers": [], "errors": []}
        dfits, dpooled = _fit_layers(calib, Hd, dec_lens, n_layers, calib_targets, "decode", D, R)
        vote_d = _vote(R.get("calib_granularity", {}).get("decode", {}), (128, 8, 1, 0))
        D["vote"] = vote_d
        R["calibration_decode"] = D
    config = calib.make_config(fits, pooled, order, vote, layer_fits_decode=dfits,
                               pooled_decode=dpooled, vote_decode=vote_d)
    path = os.path.join(args.out, "calibrated_config.json")
    calib.write_config(path, config)
    C["config"] = config
    C["config_file"] = os.path.basename(path)
    C["seconds"] = time.time() - t1
    R["calibration"] = C
    loaded = blasst.load_config(path)  # blasst's own parser (C++): validates what we wrote
    C["config_groups"] = loaded.group_names
    log(f"calibration: {sum(f is not None for f in fits.values())}/{n_layers} layers fitted over "
        f"L = {fit_lens} in {C['seconds']:.1f} s; " + "; ".join(
            f"L{l} a {f['a']:.3g} b {f['b']:.2f} R2 {f['r2']:.3f} range {f['range']}"
            for l, f in fits.items() if f is not None))

    def layer_fit(l):
        return fits[l] if fits[l] is not None else pooled

    for L in sorted(ctx_data):
        for target in targets:
            for form in ("piecewise", "exp"):
                if left() <= 0:
                    R["errors"].append(f"ctx {L} calibrated {form} {target}: budget spent")
                    continue
                try:
                    if form == "piecewise":
                        skips = {l: loaded.skip_softmax(layer=calib.layer_name(l), phase="prefill",
                                                        target_sparsity=target)
                                 for l in range(n_layers)}
                    else:
                        skips = {}
                        for l in range(n_layers):
                            f = layer_fit(l)
                            if f is not None:
                                skips[l] = blasst.SkipSoftmax(calibration=(f["a"], f["b"]),
                                                              target_sparsity=target, order=order,
                                                              **tile_kw)
                    lams = [skips[l].lambda_for(L) if l in skips else None
                            for l in range(n_layers)]
                except Exception as e:
                    R["errors"].append(f"ctx {L} calibrated {form} {target}: {e!r}")
                    log(f"calibrated {form} {target} at {L}: {e!r}")
                    continue
                flags = [_layer_flags(fits, pooled, l, target, lams[l]) for l in range(n_layers)]
                info = {"lambdas": [x if x is not None else 1.0 for x in lams],
                        "factors": [(x if x is not None else 1.0) * L for x in lams],
                        "reachable": [not fl for fl in flags], "layer_flags": flags,
                        "form": form, "beyond_calibration": L not in fit_lens}
                if L in H:  # the same lambdas on this context's calibration (training) curves
                    info["calib_sparsity"] = [calib.pooled_curve(H[L][l], lams[l])
                                              if lams[l] is not None and lams[l] < 1 else 0.0
                                              for l in range(n_layers)]

                def extra(r, target=target, L=L):
                    tol = 0.02 if L >= 8192 else 0.03
                    pl = r.get("sparsity_per_layer", [])
                    return {"tolerance": tol, "abs_error": abs(r["sparsity"] - target),
                            "within_tolerance": abs(r["sparsity"] - target) <= tol,
                            "layer_abs_error": [abs(x - target) for x in pl],
                            "layers_within_tolerance": sum(abs(x - target) <= tol for x in pl)}
                row(L, "blasst", order, f"cal_{form}", target, skips, info, extra)

    if decode_row is None:
        return
    # decode: teacher-forced last tokens through blasst.decode, dense and with the config's
    # decode phase (the layer's decode fit, else the pooled one)
    dec_fitted = bool(dec_lens) and (dpooled is not None or any(dfits.values()))
    for L in sorted(ctx_data):
        decode_row(L, "dec_dense", 0.0, {}, None)
        if not dec_fitted:
            if L == max(ctx_data):
                R["errors"].append("decode: no calibrated decode phase (no fit): dense rows only")
            continue
        for target in targets:
            if left() <= 0:
                R["errors"].append(f"ctx {L} decode {target}: budget spent")
                continue
            try:
                skips = {l: loaded.skip_softmax(layer=calib.layer_name(l), phase="decode",
                                                target_sparsity=target)
                         for l in range(n_layers)}
                lams = [skips[l].lambda_for(L) for l in range(n_layers)]
            except Exception as e:
                R["errors"].append(f"ctx {L} decode {target}: {e!r}")
                log(f"decode config at {L}, {target}: {e!r}")
                continue
            # the decode fit that applies: the layer's own within its group, else the pooled one
            # (a layer without a prefill fit has no group of its own: the catch-all applies)
            eff = {l: dfits.get(l) if fits.get(l) is not None else None for l in range(n_layers)}
            flags = [_layer_flags(eff, dpooled, l, target, lams[l]) for l in range(n_layers)]
            info = {"lambdas": lams, "factors": [x * L for x in lams],
                    "reachable": [not fl for fl in flags], "layer_flags": flags,
                    "form": "piecewise", "beyond_calibration": L not in dec_lens}
            decode_row(L, "dec_cal_piecewise", target, skips, info)


def main(argv=None):
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-seconds", type=float, default=None)
    ap.add_argument("--eval-seconds", type=float, default=None)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--corpus-bytes", type=int, default=None)
    ap.add_argument("--contexts", default=None, help="comma list of eval contexts")
    ap.add_argument("--extra-context", default=None, help="beyond-training contexts (flagged)")
    ap.add_argument("--targets", default="0.3,0.5,0.7,0.9")
    ap.add_argument("--train-ctx", type=int, default=None, help="(testing) training context")
    ap.add_argument("--batch", type=int, default=None, help="(testing) training batch")
    ap.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens per row")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--eval-only", action="store_true",
                    help="skip training: load --ckpt DIR's shards (+ tokenizer.json, results.json)")
    ap.add_argument("--ckpt", default=None, help="a previous run's output folder (--eval-only)")
    ap.add_argument("--calib-targets", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9",
                    help="targets of the SPEC §6 fit (calibrated config)")
    ap.add_argument("--cal-targets", default="0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9",
                    help="targets of the calibrated-config rows (prefill and decode)")
    ap.add_argument("--no-calibrated", action="store_true", help="skip the calibrated-config rows")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode calibration and rows")
    args = ap.parse_args(argv)
    if args.eval_only and not args.ckpt:
        ap.error("--eval-only needs --ckpt DIR")
    prev = None
    if args.eval_only:
        pj = os.path.join(args.ckpt, "results.json")
        if os.path.exists(pj):
            with open(pj) as f:
                prev = json.load(f)
        if prev is not None and prev.get("tiny") and not args.tiny:
            args.tiny = True  # the checkpoint's scale decides

    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "log.txt"), "w")
    tiny = args.tiny
    dev = torch.device(args.device or ("cpu" if tiny else "cuda"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        log("ERROR: CUDA requested but torch.cuda.is_available() is False")
        return 2
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    if tiny:
        P = dict(corpus_bytes=1_500_000, heldout_pct=10, bpe_sample=250_000, merges=191, ctx=256, batch=8,
                 train_seconds=20.0, max_steps=60, lr=3e-3, warmup=5, eval_seconds=25.0,
                 contexts=[256, 128], extra=[], eval_tokens=2048, copy_tokens=1024,
                 calib_tokens=2048, sink_len=256, sink_seqs=1, max_tokens=4096,
                 tile_kw=dict(tile_keys=16, vote_rows=4), tile=16,
                 dec_last=32, dec_qlen=1, dec_tile=16, dec_split=4,
                 cfg=ModelConfig(vocab=448, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                 head_dim=16, d_ff=192, max_len=512))
    else:
        P = dict(corpus_bytes=96_000_000, heldout_pct=5, bpe_sample=3_000_000, merges=3903, ctx=8192, batch=8,
                 train_seconds=290.0, max_steps=100000, lr=2e-3, warmup=60, eval_seconds=150.0,
                 contexts=[8192, 4096, 2048], extra=[16384], eval_tokens=131072,
                 copy_tokens=65536, calib_tokens=65536, sink_len=4096, sink_seqs=2,
                 max_tokens=65536, tile_kw={}, tile=128,
                 dec_last=256, dec_qlen=8, dec_tile=128, dec_split=16,
                 cfg=ModelConfig(vocab=4160, d_model=512, n_layers=8, n_heads=8, n_kv_heads=2,
                                 head_dim=64, d_ff=1408, max_len=16384))
    if args.train_seconds is not None:
        P["train_seconds"] = args.train_seconds
    if args.eval_seconds is not None:
        P["eval_seconds"] = args.eval_seconds
    if args.max_steps is not None:
        P["max_steps"] = args.max_steps
    if args.corpus_bytes is not None:
        P["corpus_bytes"] = args.corpus_bytes
    if args.train_ctx is not None:
        P["ctx"] = args.train_ctx
    if args.batch is not None:
        P["batch"] = args.batch
    if args.eval_tokens is not None:
        scale = args.eval_tokens / P["eval_tokens"]
        for k in ("copy_tokens", "calib_tokens"):
            P[k] = max(1, int(P[k] * scale))
        P["eval_tokens"] = args.eval_tokens
    if args.contexts:
        P["contexts"] = [int(x) for x in args.contexts.split(",")]
    if args.extra_context is not None:
        P["extra"] = [int(x) for x in args.extra_context.split(",") if x]
    if prev is not None:  # rebuild exactly what the checkpoint's run used
        given = {"corpus_bytes": args.corpus_bytes, "ctx": args.train_ctx}
        for k in ("corpus_bytes", "heldout_pct", "bpe_sample", "merges", "ctx"):
            if k in prev.get("params", {}) and given.get(k) is None:
                P[k] = prev["params"][k]
        P["cfg"] = ModelConfig(**{k: v for k, v in prev["model"].items() if k != "n_params"})
    targets = [float(x) for x in args.targets.split(",")]
    calib_targets = [float(x) for x in args.calib_targets.split(",")]
    workers = args.workers or (1 if tiny else min(16, os.cpu_count() or 1))
    cfg = P["cfg"]

    R = {"tiny": tiny, "device": str(dev), "torch": torch.__version__, "seed": args.seed,
         "eval_only": bool(args.eval_only), "ckpt_dir": args.ckpt,
         "params": {k: v for k, v in P.items() if k != "cfg"}, "model": cfg.to_dict(),
         "phases": {}, "rows": [], "errors": [], "notes": []}
    if dev.type == "cuda":
        R["gpu"] = torch.cuda.get_device_name(0)
    res_path = os.path.join(args.out, "results.json")

    def dump():
        with open(res_path, "w") as f:
            json.dump(R, f, indent=1)

    # ---- corpus + tokenizer
    t = time.time()
    C = corpus.load_corpus(P["corpus_bytes"], P["heldout_pct"])
    R["corpus"] = {"train_files": len(C["train"]), "heldout_files": len(C["heldout"]),
                   "train_bytes": sum(len(x[1]) for x in C["train"]),
                   "heldout_bytes": sum(len(x[1]) for x in C["heldout"]),
                   "heldout_example_paths": [x[0] for x in C["heldout"][:10]],
                   "files_by_package": dict(sorted(__import__("collections").Counter(
                       x[0].split(os.sep)[0] for s_ in ("train", "heldout") for x in C[s_]).items())),
                   "heldout_pct": P["heldout_pct"], "modules": list(corpus.DEFAULT_MODULES)}
    log(f"corpus: {R['corpus']['train_files']} train / {R['corpus']['heldout_files']} held-out "
        f"files, {R['corpus']['train_bytes'] / 1e6:.1f} / {R['corpus']['heldout_bytes'] / 1e6:.1f} MB")
    tj = os.path.join(args.ckpt, "tokenizer.json") if args.ckpt else None
    if tj and os.path.exists(tj):  # the checkpoint's tokenizer: not retrained
        with open(tj) as f:
            tjd = json.load(f)
        if tjd.get("word_re", corpus.WORD_RE.pattern) != corpus.WORD_RE.pattern:
            raise RuntimeError(f"{tj}: pre-tokenizer differs from corpus.WORD_RE")
        merges = [tuple(m) for m in tjd["merges"]]
        n = 0
        log(f"tokenizer: {len(merges)} merges from {tj}")
    else:
        if args.eval_only:
            log(f"no tokenizer.json in {args.ckpt}: retraining the BPE (deterministic)")
        sample, n = [], 0
        for _, txt in C["train"]:
            if n >= P["bpe_sample"]:
                break
            sample.append(txt)
            n += len(txt)
        merges = corpus.train_bpe(sample, P["merges"])
    tok = corpus.Tokenizer(merges)
    assert tok.vocab_size <= cfg.vocab, (tok.vocab_size, cfg.vocab)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump({"bos": corpus.BOS, "merges": [list(m) for m in merges],
                   "word_re": corpus.WORD_RE.pattern}, f)
    t_bpe = time.time() - t
    log(f"BPE: {len(merges)} merges ({n / 1e6:.2f} MB sample) in {t_bpe:.1f} s (vocab {tok.vocab_size})")
    t = time.time()
    train_docs = corpus.encode_docs(tok, [x[1] for x in C["train"]], workers)
    held_docs = corpus.encode_docs(tok, [x[1] for x in C["heldout"]], workers)
    train, held = Stream(train_docs), Stream(held_docs)
    nbytes = R["corpus"]["train_bytes"] + R["corpus"]["heldout_bytes"]
    R["tokens"] = {"train": int(len(train.tokens)), "heldout": int(len(held.tokens)),
                   "bytes_per_token": nbytes / max(1, len(train.tokens) + len(held.tokens))}
    R["phases"]["tokenizer_s"] = t_bpe
    R["phases"]["encode_s"] = time.time() - t
    log(f"encode: {R['tokens']} in {R['phases']['encode_s']:.1f} s ({workers} workers)")
    del C
    if prev is not None and prev.get("tokens"):
        same = {k: prev["tokens"][k] == R["tokens"][k] for k in ("train", "heldout")}
        R["tokens_match_ckpt_run"] = all(same.values())
        log(f"token counts vs the checkpoint's run: {prev['tokens']} -> "
            f"{'same' if all(same.values()) else 'DIFFERENT (corpus changed?)'}")
        if not all(same.values()):
            R["errors"].append(f"token counts differ from the checkpoint's run: {prev['tokens']}")
    if prev is not None and prev.get("baselines"):
        uni, bi = prev["baselines"]["unigram_loss"], prev["baselines"]["bigram_loss"]
    else:
        uni, bi = ngram_baselines(train.tokens, held.tokens, cfg.vocab)
    R["baselines"] = {"unigram_loss": uni, "bigram_loss": bi}
    log(f"baselines on held-out: unigram {uni:.3f}, bigram {bi:.3f} nats/token")
    dump()

    # ---- training (or the checkpoint of a previous run)
    ctx = P["ctx"]
    if args.eval_only:
        names = (prev or {}).get("checkpoint") or sorted(
            n_ for n_ in os.listdir(args.ckpt) if n_.startswith("ckpt_") and n_.endswith(".pt"))
        model = LM(cfg)
        sd = load_checkpoint(args.ckpt, names)
        model.load_state_dict({k: v.float() for k, v in sd.items()})
        model = model.to(dev)
        R["model"]["n_params"] = sum(p.numel() for p in model.parameters())
        R["checkpoint"] = names
        for k in ("train", "train_schedule"):
            if prev is not None and k in prev:
                R[k] = prev[k]
        if prev is not None:
            R["phases"]["train_s (checkpoint's run)"] = prev.get("phases", {}).get("train_s", 0.0)
        log(f"eval-only: loaded {names} from {args.ckpt} ({R['model']['n_params'] / 1e6:.2f} M parameters)")
        dump()
    else:
        # ---- training
        torch.manual_seed(args.seed)
        model = LM(cfg).to(dev)
        nparams = sum(p.numel() for p in model.parameters())
        R["model"]["n_params"] = nparams
        log(f"model: {nparams / 1e6:.2f} M parameters, {cfg}")
        fused = dev.type == "cuda"
        decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
        nodecay = [p for n_, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=P["lr"], betas=(0.9, 0.95), eps=1e-8, fused=fused)
        step_fn = model
        if args.compile and dev.type == "cuda":
            try:
                step_fn = torch.compile(model)
            except Exception as e:
                log(f"torch.compile failed ({e}); eager")
                step_fn = model
        rng = np.random.default_rng(args.seed)
        ctx, bs = P["ctx"], P["batch"]
        amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
        curve_log = []
        t_train = time.time()
        est_steps = P["max_steps"]
        step = 0
        tokens_seen = 0
        while True:
            el = time.time() - t_train
            if step >= est_steps or el >= P["train_seconds"]:
                break
            if step == 10:
                t_10 = el
            if step == 30:  # fix the schedule length from the rate measured over steps 10..30
                rate = (el - t_10) / 20
                est_steps = min(P["max_steps"], int((P["train_seconds"] - el) / rate) + 30)
                log(f"schedule: {rate * 1e3:.0f} ms/step -> {est_steps} steps")
                R["train_schedule"] = {"ms_per_step": rate * 1e3, "planned_steps": est_steps}
            if step < P["warmup"]:
                lr = P["lr"] * (step + 1) / P["warmup"]
            else:
                frac = min(1.0, (step - P["warmup"]) / max(1, est_steps - P["warmup"]))
                lr = P["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for gp in opt.param_groups:
                gp["lr"] = lr
            b = train.seqs(ctx, bs, rng)
            x = torch.from_numpy(b[:, :-1]).to(dev, non_blocking=True)
            y = torch.from_numpy(b[:, 1:]).to(dev, non_blocking=True)
            try:
                with amp:
                    logits = step_fn(x)
                    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
            except torch.OutOfMemoryError:
                logits = loss = None
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if bs == 1:
                    raise
                bs //= 2
                log(f"out of memory at step {step}: batch halved to {bs}")
                R["errors"].append(f"training OOM at step {step}: batch {bs}")
                continue
            del logits
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            tokens_seen += x.numel()
            if step % 10 == 0 or step == 1 or tiny:
                lv = loss.item()
                if not math.isfinite(lv):
                    log(f"step {step}: loss {lv}: diverged, stopping training")
                    R["errors"].append(f"training diverged at step {step}")
                    break
                curve_log.append({"step": step, "tokens": tokens_seen, "loss": lv, "lr": lr,
                                  "t": time.time() - t_train})
                if step % 50 == 0 or step == 1 or (tiny and step % 10 == 0):
                    log(f"step {step} tokens {tokens_seen} loss {lv:.4f} lr {lr:.2e} "
                        f"({time.time() - t_train:.0f} s)")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        R["phases"]["train_s"] = time.time() - t_train
        R["train"] = {"steps": step, "tokens": tokens_seen, "batch": bs, "ctx": ctx, "curve": curve_log,
                      "final_loss": curve_log[-1]["loss"] if curve_log else None,
                      "tokens_per_s": tokens_seen / max(1e-9, R["phases"]["train_s"])}
        log(f"training done: {step} steps, {tokens_seen} tokens, {R['phases']['train_s']:.1f} s, "
            f"{R['train']['tokens_per_s']:.0f} tok/s")
        names = save_checkpoint(model, cfg, args.out, 14 * 1024 * 1024)
        R["checkpoint"] = names
        dump()
        del opt
        # evaluate the checkpointed (bf16-rounded) weights, so that --eval-only of this run's
        # files reproduces these numbers exactly (on CUDA the model is cast to bf16 anyway)
        model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})

    # ---- evaluation
    model.eval()
    if dev.type == "cuda":
        model = model.to(torch.bfloat16)  # eval in bf16: SDPA and blasst see the same q/k/v
    t_eval = time.time()
    budget = P["eval_seconds"]

    def left():
        return budget - (time.time() - t_eval)

    mt = P["max_tokens"]
    erng = np.random.default_rng(args.seed + 1)
    tile_kw = P["tile_kw"]
    import blasst
    R["blasst"] = {"version": blasst.__version__, "cuda": blasst.cuda_available()}

    # sink mass and attention mass by distance (explicit softmax, held-out)
    try:
        sl = min(P["sink_len"], ctx)
        s_seqs = held.seqs(sl, P["sink_seqs"], np.random.default_rng(args.seed + 2))
        bos = s_seqs[:, :-1] == corpus.BOS  # the keys (input positions) that start a document
        an = AnalysisAttn(cfg.n_layers, sl, P["tile"], bos_mask=bos)
        sink_loss = eval_loss(model, s_seqs, an, dev, mt)
        R["attention_analysis"] = {"length": sl, "seqs": P["sink_seqs"], "loss": sink_loss,
                                   "bos_keys_per_seq": float(bos.sum(1).mean()),
                                   "layers": an.result()}
        log("sink mass per layer: " + " ".join(f"{l['sink_mass']:.3f}"
                                              for l in R["attention_analysis"]["layers"]) +
            "; mass on document starts (BOS keys, %.1f per sequence): " %
            R["attention_analysis"]["bos_keys_per_seq"] +
            " ".join(f"{l['bos_mass']:.3f}" for l in R["attention_analysis"]["layers"]))
    except Exception as e:
        R["errors"].append(f"attention analysis: {e!r}")
        log(f"attention analysis failed: {traceback.format_exc()}")
    dump()

    contexts = [(c, False) for c in P["contexts"]] + [(c, True) for c in P["extra"]]
    ctx_data = {}  # L -> (lm_seqs, cp_seqs, cp_from, beyond)
    dec_cal_seqs = {}  # L -> training-split sequences (decode calibration)
    g_heads = cfg.n_heads // cfg.n_kv_heads
    dec_kw = dict(order="max_first", tile_keys=P["dec_tile"], vote_rows=P["dec_qlen"],
                  vote_heads=g_heads, split_tiles=P["dec_split"])
    R["decode_setup"] = {"last_tokens": P["dec_last"], "q_len": P["dec_qlen"], **dec_kw,
                         "note": "teacher-forced: the last tokens' attention through blasst.decode "
                                 "over the KV cache of their prefix; other rows torch SDPA"}

    def decode_row(L, mode, target, skips, info):
        lm_seqs, _, _, beyond = ctx_data[L]
        if left() <= 0:
            R["errors"].append(f"ctx {L} {mode} {target}: budget spent")
            return None
        r = {"ctx": L, "beyond_training": beyond, "kind": "blasst.decode", "order": "max_first",
             "mode": mode, "target": target, "last_tokens": P["dec_last"]}
        t1 = time.time()
        try:
            n_last = min(P["dec_last"], L)
            if mode == "dec_dense":  # also once: torch SDPA on the same target tokens
                r["sdpa_loss_same_tokens"] = eval_loss(model, lm_seqs, sdpa_attention, dev, mt,
                                                       L - n_last)
            a = DecodeAttn(skips, n_last, P["dec_qlen"])
            r["loss"] = eval_loss(model, lm_seqs, a, dev, mt, L - n_last)
            r["sparsity"] = a.sparsity()
            r["sparsity_per_layer"] = a.per_layer()
            r["counted_at"] = a.counted_at
            if info:
                r.update(info)
            if mode != "dec_dense":
                tol = 0.02 if L >= 8192 else 0.03
                r.update({"tolerance": tol, "abs_error": abs(r["sparsity"] - target),
                          "within_tolerance": abs(r["sparsity"] - target) <= tol,
                          "layers_within_tolerance": sum(abs(x - target) <= tol
                                                         for x in r["sparsity_per_layer"])})
        except Exception as e:
            r["error"] = repr(e)
            R["errors"].append(f"ctx {L} {mode} {target}: {e!r}")
            log(f"decode row failed: {traceback.format_exc()}")
        r["seconds"] = time.time() - t1
        R["rows"].append(r)
        dump()
        log(f"ctx {L} decode {mode:18s} target {target} -> loss {r.get('loss', float('nan')):.4f} "
            f"sparsity {r.get('sparsity', 0):.3f} ({r['seconds']:.1f} s)")
        return r
    cal_hists = {}  # order -> L -> {layer: [SkipStats]} (training-split text)

    def row(L, kind, order, mode, target, skips, lam_info=None, extra=None):
        lm_seqs, cp_seqs, cp_from, beyond = ctx_data[L]
        if left() <= 0:
            R["errors"].append(f"ctx {L} {kind} {order} {mode} {target}: budget spent")
            return None
        r = {"ctx": L, "beyond_training": beyond, "kind": kind, "order": order, "mode": mode,
             "target": target}
        t1 = time.time()
        try:
            if kind == "sdpa":
                r["loss"] = eval_loss(model, lm_seqs, sdpa_attention, dev, mt)
                r["copy_loss"] = eval_loss(model, cp_seqs, sdpa_attention, dev, mt, cp_from)
            else:
                a = BlasstAttn(skips, tile_kw=tile_kw)
                r["loss"] = eval_loss(model, lm_seqs, a, dev, mt)
                r["sparsity"] = a.sparsity()
                r["sparsity_per_layer"] = a.per_layer()
                r["counted_at"] = a.counted_at
                a2 = BlasstAttn(skips, tile_kw=tile_kw)
                r["copy_loss"] = eval_loss(model, cp_seqs, a2, dev, mt, cp_from)
                r["copy_sparsity"] = a2.sparsity()
            if lam_info is not None:
                r.update(lam_info)
            if extra is not None:
                r.update(extra(r))
        except Exception as e:
            r["error"] = repr(e)
            R["errors"].append(f"ctx {L} {kind} {order} {mode} {target}: {e!r}")
            log(f"row failed: {traceback.format_exc()}")
        r["seconds"] = time.time() - t1
        R["rows"].append(r)
        dump()
        log(f"ctx {L} {kind:6s} {order or '-':9s} {mode or '-':10s} target {target} -> "
            f"loss {r.get('loss', float('nan')):.4f} copy {r.get('copy_loss', float('nan')):.4f} "
            f"sparsity {r.get('sparsity', 0):.3f} ({r['seconds']:.1f} s)")
        return r

    for L, beyond in contexts:
        if left() <= 0:
            R["errors"].append(f"context {L}: eval budget spent, not run")
            log(f"context {L}: eval budget spent, skipping")
            continue
        try:
            lm_seqs = held.seqs(L, max(1, P["eval_tokens"] // L), erng)
            cp_seqs, cp_from = copy_probe_seqs(held, L, max(1, P["copy_tokens"] // L), erng)
            cal_seqs = train.seqs(L, max(1, P["calib_tokens"] // L), erng)
        except Exception as e:
            R["errors"].append(f"context {L}: data: {e!r}")
            log(f"context {L}: no data: {e}")
            continue
        ctx_data[L] = (lm_seqs, cp_seqs, cp_from, beyond)
        dec_cal_seqs[L] = cal_seqs

        row(L, "sdpa", None, "dense", 0.0, None)
        row(L, "blasst", None, "dense", 0.0, {})
        for order in ("natural", "max_first"):
            if left() <= 0:
                break
            # one dense pass with delta histograms on training-split text -> one-pass curves
            try:
                t1 = time.time()
                probe = {i: blasst.SkipSoftmax(threshold=1e-30, order=order, **tile_kw)
                         for i in range(cfg.n_layers)}
                ca = BlasstAttn(probe, histogram=True, tile_kw=tile_kw)
                eval_loss(model, cal_seqs, ca, dev, mt)
                cal_hists.setdefault(order, {})[L] = ca.hists
                R.setdefault("calib_granularity", {})[order] = ca.hists[0][0].granularity
                log(f"ctx {L} {order}: calibration pass {time.time() - t1:.1f} s")
            except Exception as e:
                R["errors"].append(f"ctx {L} {order} calibration: {e!r}")
                log(f"calibration failed: {traceback.format_exc()}")
                # fallback: a grid of direct thresholds, so the order still gets rows
                for lam in (1e-4, 1e-3, 1e-2, 1e-1):
                    skips = {l: blasst.SkipSoftmax(threshold=lam, order=order, **tile_kw)
                             for l in range(cfg.n_layers)}
                    row(L, "blasst", order, "grid", lam, skips, {"lambda": lam, "reachable": True})
                continue
            pooled = [s for l in range(cfg.n_layers) for s in ca.hists.get(l, [])]
            for target in targets:
                try:
                    per = [lambda_for_target(ca.hists[l], target) for l in range(cfg.n_layers)]
                    glam, gcur, greach = lambda_for_target(pooled, target)
                except Exception as e:
                    R["errors"].append(f"ctx {L} {order} {target} lambda search: {e!r}")
                    continue
                skips = {l: blasst.SkipSoftmax(threshold=per[l][0], order=order, **tile_kw)
                         for l in range(cfg.n_layers)}
                row(L, "blasst", order, "per_layer", target, skips,
                    {"lambdas": [p[0] for p in per], "factors": [p[0] * L for p in per],
                     "calib_sparsity": [p[1] for p in per],
                     "reachable": [p[2] for p in per]})
                skips = {l: blasst.SkipSoftmax(threshold=glam, order=order, **tile_kw)
                         for l in range(cfg.n_layers)}
                row(L, "blasst", order, "fixed", target, skips,
                    {"lambda": glam, "factor": glam * L, "calib_sparsity_pooled": gcur,
                     "reachable": greach})
        if not args.no_decode and not args.no_calibrated and not beyond and left() > 0:
            try:  # decode one-pass curves on training-split text (probe: nothing skipped)
                t1 = time.time()
                probe = {i: blasst.SkipSoftmax(threshold=1e-30, **dec_kw)
                         for i in range(cfg.n_layers)}
                da = DecodeAttn(probe, min(P["dec_last"], L), P["dec_qlen"], histogram=True)
                eval_loss(model, dec_cal_seqs[L], da, dev, mt, L - min(P["dec_last"], L))
                cal_hists.setdefault("decode", {})[L] = da.hists
                R.setdefault("calib_granularity", {})["decode"] = da.granularity
                log(f"ctx {L} decode: calibration pass {time.time() - t1:.1f} s "
                    f"({da.counted_at})")
            except Exception as e:
                R["errors"].append(f"ctx {L} decode calibration: {e!r}")
                log(f"decode calibration failed: {traceback.format_exc()}")

    # ---- calibration the way a user does it (SPEC §6, §7): per-layer fits over the training
    # contexts from the max-first histograms above, one config file, applied at every context
    if not args.no_calibrated:
        try:
            cal_targets = [float(x) for x in args.cal_targets.split(",")]
            calibrated_rows(R, args, P, cfg, blasst, tile_kw, cal_targets, calib_targets, cal_hists,
                            ctx_data, row, left, None if args.no_decode else decode_row)
        except Exception as e:
            R["errors"].append(f"calibrated config: {e!r}")
            log(f"calibrated config failed: {traceback.format_exc()}")
    R["phases"]["eval_s"] = time.time() - t_eval
    R["phases"]["total_s"] = time.time() - T0
    dump()
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(R))
    log(f"eval done in {R['phases']['eval_s']:.1f} s; total {R['phases']['total_s']:.1f} s; "
        f"{len(R['rows'])} rows, {len(R['errors'])} errors")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        log("FAILED:\n" + traceback.format_exc())
        sys.exit(1)
