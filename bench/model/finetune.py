"""Sparsity-aware fine-tuning vs a dense fine-tune control (issue 15, SPEC §9;
bench/model/README.md, "Sparsity-aware fine-tuning").

From one checkpoint of recipe.py, with two skip settings chosen at run time on training-split
text, fine-tune the same number of steps K on the same batches with the same LR sequence:
  aware (one arm per setting): blasst.attention with the SkipSoftmax active in the forward and
           the skip backward (the gradient of the kept-tiles function, the forward's skip set
           held fixed); the first aware arm runs for a time budget and fixes K;
  control (one arm): dense attention (torch SDPA, or blasst dense with --control-attn blasst);
           it depends on no setting, so one control serves both.
Then evaluate on held-out text: base / control / aware, each dense and with every setting's
lambda, and report the loss gaps (skip vs the same model's dense loss) and their ratio
(post-hoc gap of the control / gap of the aware model).

    python bench/model/finetune.py --ckpt DIR --out OUT          # GPU (a recipe run's folder)
    python bench/model/finetune.py --tiny --out OUT [--ckpt DIR] # CPU smoke (reference engine);
                                                                 # no --ckpt: trains a tiny one

Writes OUT/results.json (rewritten after every phase), OUT/results.md, OUT/log.txt; no
checkpoints."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import recipe  # noqa: E402
from model import LM, ModelConfig, sdpa_attention  # noqa: E402
from recipe import BlasstAttn, Stream, batches, curve, lambda_for_target, load_checkpoint, log  # noqa: E402

HOLD = 30  # steps at peak LR after the warm-up; the rate over steps 10..30 fixes the step count


class SkipTrainAttn:
    """The training forward of the aware arm: blasst.attention with autograd recording (so no
    statistics here: they are taken by a no-grad pass over the same batch, see measure)."""

    def __init__(self, skip):
        import blasst
        self.blasst, self.skip = blasst, skip

    def __call__(self, q, k, v, layer):
        return self.blasst.attention(q, k, v, causal=True, skip=self.skip)


class BlasstDenseTrainAttn(SkipTrainAttn):
    def __init__(self):
        super().__init__(None)


def lr_at(step, peak, warmup, total):
    """Linear warm-up, peak until HOLD, cosine to 10 % at `total`: the same sequence for every arm
    (the first arm fixes `total` at step HOLD, before any step that depends on it)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step < HOLD or total <= HOLD:
        return peak
    frac = min(1.0, (step - HOLD) / max(1, total - HOLD))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def eval_per_seq(model, seqs, attn, dev, max_tokens):
    """Mean NLL (nats/token) of each sequence."""
    out = []
    for b in batches(seqs, max_tokens):
        x = torch.from_numpy(b[:, :-1]).to(dev)
        y = torch.from_numpy(b[:, 1:]).to(dev)
        logits = model(x, attn)
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                              reduction="none").view(y.shape).mean(1)
        out.extend(float(v) for v in nll)
    return np.array(out)


def skips_for(blasst, setting, n_layers, tile_kw):
    if setting is None:
        return {}
    return {l: blasst.SkipSoftmax(threshold=setting["lambda"], order=setting["order"], **tile_kw)
            for l in range(n_layers)}


def make_skip(blasst, setting, tile_kw):
    return None if setting is None else blasst.SkipSoftmax(
        threshold=setting["lambda"], order=setting["order"], **tile_kw)


def eval_model(model, seqs, blasst, settings, n_layers, tile_kw, dev, mt):
    """{name: {loss, per_seq, sparsity, sparsity_per_layer}} for 'dense' and every setting."""
    res = {}
    for name, s in [("dense", None)] + [(k, v) for k, v in settings.items()]:
        a = BlasstAttn(skips_for(blasst, s, n_layers, tile_kw), tile_kw=tile_kw)
        per = eval_per_seq(model, seqs, a, dev, mt)
        res[name] = {"loss": float(per.mean()), "per_seq": per.tolist(),
                     "sparsity": a.sparsity(), "sparsity_per_layer": a.per_layer(),
                     "counted_at": a.counted_at}
    return res


def paired(a, b):
    """mean of a - b per sequence and its standard error across sequences."""
    d = np.asarray(a) - np.asarray(b)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se


def choose_settings(model, sel_seqs, blasst, n_layers, tile_kw, dev, mt, args, R):
    """The run-time rule (README): on training-split text, one dense max-first pass with delta
    histograms gives the pooled one-pass curve; setting 'target' = the pooled lambda whose curve
    reaches --target (lowered to the cap's sparsity - 0.1 if the cap does not reach target +
    0.02); setting 'max' = of max-first and natural order at the lambda cap, the one whose
    measured post-hoc loss increase on this text is the larger (max-first on a tie)."""
    cap = args.lambda_cap
    t1 = time.time()
    probe = {l: blasst.SkipSoftmax(threshold=1e-30, order="max_first", **tile_kw)
             for l in range(n_layers)}
    ca = BlasstAttn(probe, histogram=True, tile_kw=tile_kw)
    dense = eval_per_seq(model, sel_seqs, ca, dev, mt)
    pooled = [s for l in range(n_layers) for s in ca.hists.get(l, [])]
    s_cap = curve(pooled, cap)
    target = args.target
    if s_cap < target + 0.02:
        target = round(max(0.05, s_cap - 0.1), 3)
    lam_t, cur_t, reach_t = lambda_for_target(pooled, target, hi=cap)
    frontier = {}
    for ft in args.frontier_targets:
        if ft < s_cap - 0.02 and abs(ft - target) > 0.02:
            lam_f, cur_f, _ = lambda_for_target(pooled, ft, hi=cap)
            frontier[f"mf_{ft:g}"] = {"order": "max_first", "lambda": lam_f, "target": ft,
                                      "calib_sparsity": cur_f, "role": "frontier"}
    cands = {"max_first_cap": {"order": "max_first", "lambda": cap},
             "natural_cap": {"order": "natural", "lambda": cap}}
    meas = {}
    for name, c in cands.items():
        a = BlasstAttn(skips_for(blasst, c, n_layers, tile_kw), tile_kw=tile_kw)
        per = eval_per_seq(model, sel_seqs, a, dev, mt)
        d, se = paired(per, dense)
        meas[name] = {**c, "sparsity": a.sparsity(), "loss_delta": d, "loss_delta_se": se,
                      "rel_loss_delta": d / float(dense.mean())}
    best = max(meas, key=lambda n: (meas[n]["loss_delta"], n == "max_first_cap"))
    settings = {
        "target": {"order": "max_first", "lambda": lam_t, "target": target,
                   "calib_sparsity": cur_t, "reachable": reach_t, "role": "trained"},
        "max": {"order": meas[best]["order"], "lambda": cap, "from": best,
                "calib_sparsity": meas[best]["sparsity"], "role": "trained"},
    }
    R["selection"] = {"text": "training split", "seqs": len(sel_seqs), "ctx": sel_seqs.shape[1] - 1,
                      "dense_loss": float(dense.mean()), "lambda_cap": cap,
                      "max_first_curve_at_cap": s_cap, "target_asked": args.target,
                      "target_used": target, "candidates_at_cap": meas,
                      "seconds": time.time() - t1}
    log(f"selection (training text): max-first curve at cap {s_cap:.3f}; target {target} -> "
        f"lambda {lam_t:.3g} ({cur_t:.3f}); at cap: " + ", ".join(
            f"{n} sparsity {m['sparsity']:.3f} dloss {m['loss_delta']:+.4f}" for n, m in meas.items())
        + f" -> max = {best}")
    return settings, frontier


def finetune_arm(name, base_sd, cfg, attn, train, args, P, dev, K, measure_skip, tile_kw, R):
    """One arm: fresh copy of the checkpoint, AdamW, the shared batch order and LR sequence.
    K None: this arm fixes the step count from its rate over steps 10..HOLD. Returns the model
    (trained, fp32) and the arm's record."""
    import blasst
    torch.manual_seed(args.seed)
    model = LM(cfg)
    model.load_state_dict(base_sd)
    model = model.to(dev).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    qkv = [p for n_, p in model.named_parameters() if n_.endswith(("wq.weight", "wk.weight",
                                                                   "wv.weight"))]
    rng = np.random.default_rng(args.seed + 7)  # the same batches for every arm
    ctx, bs = P["ctx"], args.batch
    rec = {"name": name, "losses": [], "grad_norm": [], "qkv_grad_norm": [], "lr": [],
           "train_sparsity": [], "truncated": False}
    fixed = K is not None
    total = K if fixed else args.max_steps
    t0 = time.time()
    t10 = None
    step = 0
    meas_skips = skips_for(blasst, measure_skip, cfg.n_layers, tile_kw) if measure_skip else None
    while step < total:
        el = time.time() - t0
        if not fixed:  # the time budget decides K, once, at step HOLD; then K steps exactly
            if el >= args.ft_seconds:
                total = step
                break
            if step == 10:
                t10 = el
            if step == HOLD and t10 is not None:
                rate = (el - t10) / (HOLD - 10)
                total = max(HOLD + 1, min(args.max_steps, int((args.ft_seconds - el) / rate) + HOLD))
                log(f"{name}: {rate * 1e3:.0f} ms/step -> {total} steps for every arm")
                rec["ms_per_step_at_hold"] = rate * 1e3
                fixed = True
        elif el > args.arm_seconds_cap:
            rec["truncated"] = True
            R["errors"].append(f"{name}: stopped at step {step} of {total} (arm time cap)")
            log(f"{name}: arm time cap {args.arm_seconds_cap} s reached at step {step}")
            break
        lr = lr_at(step, args.lr, args.warmup, total)
        for gp in opt.param_groups:
            gp["lr"] = lr
        b = train.seqs(ctx, bs, rng)
        x = torch.from_numpy(b[:, :-1]).to(dev, non_blocking=True)
        y = torch.from_numpy(b[:, 1:]).to(dev, non_blocking=True)
        if meas_skips is not None and (step % args.measure_every == 0):
            # the training forward's skip set, from a no-grad pass over the same batch and
            # weights (the skip test depends on q, k only: the same decisions)
            a = BlasstAttn(meas_skips, tile_kw=tile_kw)
            with torch.no_grad(), amp:
                model(x, a)
            rec["train_sparsity"].append({"step": step, "sparsity": a.sparsity(),
                                          "per_layer": a.per_layer()})
        with amp:
            logits = model(x, attn)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        del logits
        if step % args.log_every == 0:
            # the q/k/v projections get their gradient only through the attention's backward
            rec["qkv_grad_norm"].append({"step": step, "norm": float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.float()) if p.grad is not None
                             else p.new_zeros(()) for p in qkv])))})
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec["losses"].append(loss.detach())
        rec["grad_norm"].append(gn.detach())
        rec["lr"].append(lr)
        step += 1
        if step % 50 == 0 or step == 1:
            log(f"{name}: step {step}/{total} loss {loss.item():.4f} lr {lr:.2e} "
                f"({time.time() - t0:.0f} s)")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rec["seconds"] = time.time() - t0
    rec["steps"] = step
    rec["planned_steps"] = total
    rec["losses"] = [float(v) for v in rec["losses"]]
    rec["grad_norm"] = [float(v) for v in rec["grad_norm"]]
    rec["ms_per_step"] = 1e3 * rec["seconds"] / max(1, step)
    rec["tokens"] = step * bs * ctx
    n = max(1, min(10, len(rec["losses"]) // 4))
    rec["loss_first"] = float(np.mean(rec["losses"][:n])) if rec["losses"] else None
    rec["loss_last"] = float(np.mean(rec["losses"][-n:])) if rec["losses"] else None
    if meas_skips is not None and step > 0:  # and once after the last step
        a = BlasstAttn(meas_skips, tile_kw=tile_kw)
        with torch.no_grad(), amp:
            model(x, a)
        rec["train_sparsity"].append({"step": step, "sparsity": a.sparsity(),
                                      "per_layer": a.per_layer()})
    log(f"{name}: {step} steps in {rec['seconds']:.1f} s ({rec['ms_per_step']:.0f} ms/step), "
        f"train loss {rec['loss_first']:.4f} -> {rec['loss_last']:.4f}")
    del opt
    return model, rec


def summarize(R):
    """Per trained setting: the gaps and their ratio, from the evaluation records."""
    E = R["eval"]
    out = {}
    for sname in R["settings"]:
        c, a = E.get("control"), E.get(f"aware_{sname}")
        base = E.get("base")
        if c is None or a is None:
            continue
        g_post, se_post = paired(c[sname]["per_seq"], c["dense"]["per_seq"])
        g_aw, se_aw = paired(a[sname]["per_seq"], a["dense"]["per_seq"])
        d_dense, se_dd = paired(a["dense"]["per_seq"], c["dense"]["per_seq"])
        s = {"posthoc_gap": g_post, "posthoc_gap_se": se_post,
             "aware_gap": g_aw, "aware_gap_se": se_aw,
             "gap_ratio": g_post / g_aw if g_aw > 0 else None,
             "aware_gap_over_posthoc": g_aw / g_post if g_post > 0 else None,
             "aware_dense_minus_control_dense": d_dense, "aware_dense_minus_control_dense_se": se_dd,
             "aware_dense_rel": d_dense / c["dense"]["loss"],
             "aware_skip_minus_control_dense": a[sname]["loss"] - c["dense"]["loss"],
             "control_posthoc_sparsity": c[sname]["sparsity"],
             "aware_sparsity": a[sname]["sparsity"]}
        if base is not None:
            s["base_posthoc_gap"] = paired(base[sname]["per_seq"], base["dense"]["per_seq"])[0]
            s["base_sparsity"] = base[sname]["sparsity"]
        s["issue_target_gap_le_half"] = bool(g_post > 0 and g_aw <= 0.5 * g_post)
        s["issue_target_dense_within_1pct"] = bool(abs(s["aware_dense_rel"]) <= 0.01)
        out[sname] = s
    R["summary"] = out


def markdown(R):
    L = ["# Sparsity-aware fine-tuning vs post-hoc skip", ""]
    L.append(f"Checkpoint: `{R.get('ckpt_dir')}`; device {R.get('gpu', R.get('device'))}; "
             f"torch {R.get('torch')}; context {R['params']['ctx']}, batch {R['params']['batch']}, "
             f"AdamW peak lr {R['params']['lr']:g} (warm-up {R['params']['warmup']}, hold to "
             f"{HOLD}, cosine to 10 %), control attention {R['params']['control_attn']}.")
    sel = R.get("selection")
    if sel:
        L.append("")
        L.append(f"Selection on training text ({sel['seqs']} x {sel['ctx']} tokens): max-first "
                 f"one-pass curve at lambda cap {sel['lambda_cap']:g} = "
                 f"{sel['max_first_curve_at_cap']:.3f}; target {sel['target_used']} (asked "
                 f"{sel['target_asked']}); at the cap: " + "; ".join(
                     f"{n}: sparsity {m['sparsity']:.3f}, dloss {m['loss_delta']:+.4f} "
                     f"(se {m['loss_delta_se']:.4f})" for n, m in sel["candidates_at_cap"].items()))
    L += ["", "| setting | order | lambda | trained |", "|---|---|---|---|"]
    for n, s in {**R.get("settings", {}), **R.get("frontier", {})}.items():
        L.append(f"| {n} | {s['order']} | {s['lambda']:.4g} | {'yes' if s['role'] == 'trained' else 'no'} |")
    L += ["", "Arms (same batches, same LR sequence):", "",
          "| arm | attention | steps | s | ms/step | train loss first -> last | setting's sparsity on the "
          "training batch (first, last step) |",
          "|---|---|---|---|---|---|---|"]
    for a in R.get("arms", []):
        ts = a.get("train_sparsity") or []
        tsp = f"{ts[0]['sparsity']:.3f}, {ts[-1]['sparsity']:.3f}" if ts else "-"
        L.append(f"| {a['name']} | {a['attention']} | {a['steps']} | {a['seconds']:.1f} | "
                 f"{a['ms_per_step']:.0f} | {a['loss_first']:.4f} -> {a['loss_last']:.4f} | {tsp} |")
    E = R.get("eval", {})
    names = ["dense"] + list(R.get("settings", {})) + list(R.get("frontier", {}))
    L += ["", f"Held-out evaluation ({R.get('eval_seqs')} x {R['params']['ctx']} tokens): loss "
          "(sparsity) per model and evaluation setting; d = vs the same model's dense loss.", "",
          "| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for m, ev in E.items():
        cells = []
        for n in names:
            if n not in ev:
                cells.append("-")
                continue
            r = ev[n]
            if n == "dense":
                cells.append(f"{r['loss']:.4f}")
            else:
                cells.append(f"{r['loss']:.4f} (s {r['sparsity']:.3f}, d "
                             f"{r['loss'] - ev['dense']['loss']:+.4f})")
        L.append(f"| {m} | " + " | ".join(cells) + " |")
    S = R.get("summary", {})
    if S:
        L += ["", "| setting | post-hoc gap (control) | aware gap | ratio post-hoc / aware | "
              "aware dense - control dense | aware skip - control dense | sparsity control / aware | "
              "base post-hoc gap | gap <= 0.5x | dense within 1 % |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for n, s in S.items():
            ratio = f"{s['gap_ratio']:.2f}" if s["gap_ratio"] is not None else "n/a (aware gap <= 0)"
            L.append(f"| {n} | {s['posthoc_gap']:+.4f} +- {s['posthoc_gap_se']:.4f} | "
                     f"{s['aware_gap']:+.4f} +- {s['aware_gap_se']:.4f} | {ratio} | "
                     f"{s['aware_dense_minus_control_dense']:+.4f} ({100 * s['aware_dense_rel']:+.2f} %) | "
                     f"{s['aware_skip_minus_control_dense']:+.4f} | "
                     f"{s['control_posthoc_sparsity']:.3f} / {s['aware_sparsity']:.3f} | "
                     f"{s.get('base_posthoc_gap', float('nan')):+.4f} | "
                     f"{'yes' if s['issue_target_gap_le_half'] else 'no'} | "
                     f"{'yes' if s['issue_target_dense_within_1pct'] else 'no'} |")
        L += ["", "Gaps are mean per-sequence differences (nats/token) +- their standard error "
              "across the held-out sequences (paired: same sequences)."]
    if R.get("errors"):
        L += ["", "Errors:", ""] + [f"- {e}" for e in R["errors"]]
    return "\n".join(L) + "\n"


def tiny_checkpoint(dirpath, seed):
    """A tiny recipe run (CPU, --tiny) to fine-tune when no --ckpt is given."""
    rc = recipe.main(["--out", dirpath, "--tiny", "--seed", str(seed), "--eval-seconds", "0",
                      "--no-calibrated", "--no-decode", "--max-steps", "40",
                      "--train-seconds", "600"])  # a step count, not a time: deterministic
    if rc != 0:
        raise RuntimeError(f"tiny recipe run failed (rc {rc})")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default=None, help="a recipe.py run folder (ckpt_*.pt, tokenizer.json, "
                                                 "results.json); --tiny without it trains one")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--ft-seconds", type=float, default=None,
                    help="time budget of the first (aware, 'target') arm; fixes K for all arms")
    ap.add_argument("--steps", type=int, default=None,
                    help="fixed K (no time budget; --tiny default 20; 0: the time budget)")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--arm-seconds-cap", type=float, default=None,
                    help="safety stop of an arm with fixed K (default 1.5 x ft-seconds)")
    ap.add_argument("--lr", type=float, default=None,
                    help="peak LR (default: 0.1 x the checkpoint's training LR = its final LR)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (20; --tiny 4)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--frontier-targets", default="0.5", help="extra eval-only max-first targets")
    ap.add_argument("--lambda-cap", type=float, default=0.999)
    ap.add_argument("--eval-tokens", type=int, default=None)
    ap.add_argument("--sel-tokens", type=int, default=None)
    ap.add_argument("--control-attn", choices=("sdpa", "blasst"), default="sdpa")
    ap.add_argument("--measure-every", type=int, default=None)
    ap.add_argument("--settings", default="target,max", help="which trained settings to run")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=None,
                    help="(testing) context other than the checkpoint's training context")
    ap.add_argument("--corpus-bytes", type=int, default=None,
                    help="(testing) a smaller corpus than the checkpoint's (token counts differ)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (--tiny default 1: tiny ops, often a shared CPU)")
    args = ap.parse_args(argv)
    if args.threads or args.tiny:
        torch.set_num_threads(args.threads or 1)
    os.makedirs(args.out, exist_ok=True)
    recipe.LOG = open(os.path.join(args.out, "log.txt"), "w")
    tmp = None
    if args.ckpt is None:
        if not args.tiny:
            ap.error("--ckpt DIR is needed (only --tiny trains its own checkpoint)")
        tmp = tempfile.TemporaryDirectory(prefix="ft_tiny_ckpt_")
        log(f"no --ckpt: training a tiny checkpoint in {tmp.name}")
        tiny_checkpoint(tmp.name, 1234)
        recipe.LOG = open(os.path.join(args.out, "log.txt"), "a")  # recipe.main replaced it
        args.ckpt = tmp.name
    with open(os.path.join(args.ckpt, "results.json")) as f:
        prev = json.load(f)
    tiny = bool(prev.get("tiny")) or args.tiny
    args.tiny = tiny
    dev = torch.device(args.device or ("cpu" if tiny else "cuda"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        log("ERROR: CUDA requested but torch.cuda.is_available() is False")
        return 2
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    pp = prev["params"]
    P = {"ctx": args.ctx or pp["ctx"], "corpus_bytes": args.corpus_bytes or pp["corpus_bytes"], "heldout_pct": pp["heldout_pct"],
         "tile_kw": pp.get("tile_kw", {}), "max_tokens": pp.get("max_tokens", 65536)}
    if args.lr is None:
        args.lr = 0.1 * pp["lr"]  # where the checkpoint's cosine schedule ended
    if args.batch is None:
        args.batch = pp["batch"]
    if args.ft_seconds is None:
        args.ft_seconds = 20.0 if tiny else 100.0
    if args.steps is None and tiny:
        args.steps = 20
    if args.steps == 0:
        args.steps = None
    if args.warmup is None:
        args.warmup = 4 if tiny else 20
    if args.arm_seconds_cap is None:
        args.arm_seconds_cap = 1.5 * args.ft_seconds if args.steps is None else 1e9
    if args.measure_every is None:
        args.measure_every = 4 if tiny else 25
    args.log_every = 1 if tiny else 10
    args.frontier_targets = [float(x) for x in args.frontier_targets.split(",") if x]
    eval_tokens = args.eval_tokens or (4096 if tiny else 262144)
    sel_tokens = args.sel_tokens or (2048 if tiny else 65536)
    tile_kw = P["tile_kw"]
    cfg = ModelConfig(**{k: v for k, v in prev["model"].items() if k != "n_params"})
    workers = args.workers or (1 if tiny else min(16, os.cpu_count() or 1))
    R = {"tiny": tiny, "device": str(dev), "torch": torch.__version__, "seed": args.seed,
         "ckpt_dir": args.ckpt if tmp is None else "(tiny, trained here)", "model": cfg.to_dict(),
         "params": {"ctx": P["ctx"], "batch": args.batch, "lr": args.lr, "warmup": args.warmup,
                    "hold": HOLD, "ft_seconds": args.ft_seconds, "steps": args.steps,
                    "target": args.target, "lambda_cap": args.lambda_cap,
                    "control_attn": args.control_attn, "eval_tokens": eval_tokens,
                    "sel_tokens": sel_tokens, "tile_kw": tile_kw, "measure_every": args.measure_every,
                    "weight_decay": 0.1, "betas": [0.9, 0.95], "grad_clip": 1.0},
         "phases": {}, "arms": [], "eval": {}, "errors": []}
    if dev.type == "cuda":
        R["gpu"] = torch.cuda.get_device_name(0)
    res_path = os.path.join(args.out, "results.json")

    def dump():
        with open(res_path, "w") as f:
            json.dump(R, f, indent=1)

    def write_md():
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(markdown(R))

    # ---- data: the checkpoint's corpus, split and tokenizer (recipe.py / corpus.py)
    t = time.time()
    C = corpus.load_corpus(P["corpus_bytes"], P["heldout_pct"])
    tj = os.path.join(args.ckpt, "tokenizer.json")
    with open(tj) as f:
        tjd = json.load(f)
    if tjd.get("word_re", corpus.WORD_RE.pattern) != corpus.WORD_RE.pattern:
        raise RuntimeError(f"{tj}: pre-tokenizer differs from corpus.WORD_RE")
    tok = corpus.Tokenizer([tuple(m) for m in tjd["merges"]])
    train = Stream(corpus.encode_docs(tok, [x[1] for x in C["train"]], workers))
    held = Stream(corpus.encode_docs(tok, [x[1] for x in C["heldout"]], workers))
    del C
    R["tokens"] = {"train": int(len(train.tokens)), "heldout": int(len(held.tokens))}
    if prev.get("tokens"):
        R["tokens_match_ckpt_run"] = all(prev["tokens"][k] == R["tokens"][k] for k in ("train", "heldout"))
        if not R["tokens_match_ckpt_run"]:
            R["errors"].append(f"token counts differ from the checkpoint's run: {prev['tokens']}")
    R["phases"]["data_s"] = time.time() - t
    log(f"data: {R['tokens']} tokens in {R['phases']['data_s']:.1f} s "
        f"(match the checkpoint's run: {R.get('tokens_match_ckpt_run')})")

    # ---- checkpoint
    t = time.time()
    names = prev.get("checkpoint") or sorted(n for n in os.listdir(args.ckpt)
                                             if n.startswith("ckpt_") and n.endswith(".pt"))
    base_sd = {k: v.float() for k, v in load_checkpoint(args.ckpt, names).items()}
    R["checkpoint"] = names
    R["phases"]["ckpt_s"] = time.time() - t
    T_after_ckpt = time.time()
    import blasst
    R["blasst"] = {"version": blasst.__version__, "cuda": blasst.cuda_available()}

    def eval_copy(sd_or_model):
        m = sd_or_model
        if isinstance(m, dict):
            m = LM(cfg)
            m.load_state_dict(sd_or_model)
            m = m.to(dev)
        m = m.eval()
        return m.to(torch.bfloat16) if dev.type == "cuda" else m

    ctx = P["ctx"]
    mt = P["max_tokens"]
    held_seqs = held.seqs(ctx, max(2, eval_tokens // ctx), np.random.default_rng(args.seed + 1))
    sel_seqs = train.seqs(ctx, max(2, sel_tokens // ctx), np.random.default_rng(args.seed + 3))
    R["eval_seqs"] = len(held_seqs)

    # ---- the settings (run-time rule, training-split text) and the base model's evaluation
    t = time.time()
    base = eval_copy(base_sd)
    settings, frontier = choose_settings(base, sel_seqs, blasst, cfg.n_layers, tile_kw, dev, mt,
                                         args, R)
    R["settings"] = settings
    R["frontier"] = frontier
    all_settings = {**settings, **frontier}
    R["eval"]["base"] = eval_model(base, held_seqs, blasst, all_settings, cfg.n_layers, tile_kw,
                                   dev, mt)
    del base
    R["phases"]["select_and_base_eval_s"] = time.time() - t
    dump()

    # ---- the arms: the aware ones first (the first fixes K), then the one dense control (it
    # depends on no setting: same K, batches and LR; evaluated post hoc with every setting)
    K = args.steps
    arms = [("aware", s) for s in args.settings.split(",") if s in settings] + [("control", None)]
    for kind, sname in arms:
        name = f"aware_{sname}" if kind == "aware" else "control"
        try:
            if kind == "aware":
                st = settings[sname]
                attn = SkipTrainAttn(make_skip(blasst, st, tile_kw))
                attn_name = f"blasst skip ({st['order']}, lambda {st['lambda']:.3g})"
            elif args.control_attn == "blasst":
                attn, attn_name = BlasstDenseTrainAttn(), "blasst dense"
            else:
                attn, attn_name = sdpa_attention, "torch SDPA"
            model, rec = finetune_arm(name, base_sd, cfg, attn, train, args, P, dev, K,
                                      settings[sname] if kind == "aware" else None, tile_kw, R)
            if K is None:
                K = rec["steps"]
            rec["attention"] = attn_name
            rec["setting"] = sname
            R["arms"].append(rec)
            R["fixed_steps"] = K
            t1 = time.time()
            em = eval_copy(model)
            R["eval"][name] = eval_model(em, held_seqs, blasst, all_settings, cfg.n_layers,
                                         tile_kw, dev, mt)
            rec["eval_seconds"] = time.time() - t1
            del model, em
        except Exception as e:
            R["errors"].append(f"{name}: {e!r}")
            log(f"{name} failed: {traceback.format_exc()}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        summarize(R)
        dump()
        write_md()
    R["phases"]["after_ckpt_s"] = time.time() - T_after_ckpt
    R["phases"]["total_s"] = time.time() - recipe.T0
    summarize(R)
    dump()
    write_md()
    for n, s in R.get("summary", {}).items():
        log(f"{n}: post-hoc gap {s['posthoc_gap']:+.4f} (sparsity {s['control_posthoc_sparsity']:.3f}), "
            f"aware gap {s['aware_gap']:+.4f} (sparsity {s['aware_sparsity']:.3f}), ratio "
            f"{s['gap_ratio'] if s['gap_ratio'] is None else round(s['gap_ratio'], 3)}, aware dense - "
            f"control dense {s['aware_dense_minus_control_dense']:+.4f}")
    log(f"done: {R['phases']['after_ckpt_s']:.1f} s after the checkpoint load, "
        f"{len(R['errors'])} errors")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        log("FAILED:\n" + traceback.format_exc())
        sys.exit(1)
