#!/usr/bin/env python3
"""Prefill benchmark (SPEC §8): our sm_90a kernel (dense, skip at achieved sparsity 0.5/0.7/0.9)
against torch SDPA (cuDNN and flash backends) on the same torch tensors, in one process.

Timing: CUDA events around each call, warm-up first, median of >= 20 calls, never on zeros.
Skip thresholds come from the one-pass curve (SPEC §5): one dense run of the skip variant with the
delta histogram on gives sparsity(lambda) exactly at every bin edge; lambda for a target s is the
smallest edge e with sparsity(exp(e)) >= s. The achieved sparsity is then counted in a separate
statistics run (not timed).

Workloads (seeded, generated here in torch; docs/prefill_kernel.md describes them):
  random: i.i.d. normal Q, K, V.
  llm:    RoPE positions (base 10000) on a per-head content vector shared by Q and K (recency),
          an attention-sink key at position 0 and 8 heavy-hitter keys, normal V.
  dit:    tokens on a T x H x W grid; Q and K share a 3-D sinusoidal position code, so attention
          falls off with 3-D distance; normal V.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HIST_SLOTS = 1026
KLO, KW = -64.0, 1.0 / 16.0


def load_lib(path):
    lib = ctypes.CDLL(path)
    vp, ll, ci, cd = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_double
    lib.blasst_prefill.restype = ci
    lib.blasst_prefill.argtypes = [vp, vp, vp, vp, vp, ll, ll, ll, ll, ll, ll, ci, ci, cd, ci, vp, vp, vp, vp, ci]
    lib.blasst_prefill_last_error.restype = ctypes.c_char_p
    if hasattr(lib, "blasst_prefill_screen"):  # builds from before the FP8 screen lack it
        lib.blasst_prefill_screen.restype = ci
        lib.blasst_prefill_screen.argtypes = [vp, vp, vp, vp, vp, ll, ll, ll, ll, ll, ll, ci, ci, cd, ci, ci,
                                              cd, vp, vp, vp, vp, vp]
    return lib


class Ours:
    def __init__(self, lib, q, k, v, causal):
        self.lib, self.q, self.k, self.v, self.causal = lib, q, k, v, causal
        self.o = torch.empty_like(q)
        B, L, H, d = q.shape
        self.lse = torch.empty(B, H, L, device=q.device, dtype=torch.float32)
        self.dims = (B, L, k.shape[1], H, k.shape[2], d)
        self.dtype = 0 if q.dtype == torch.bfloat16 else 1

    def __call__(self, lam=0.0, force_skip=0, counters=None, knobs=0):
        vis = skp = hist = None
        if counters is not None:
            vis, skp, hist = (c.data_ptr() if c is not None else None for c in counters)
        B, Lq, Lk, H, Hk, d = self.dims
        rc = self.lib.blasst_prefill(self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(),
                                     self.o.data_ptr(), self.lse.data_ptr(), B, Lq, Lk, H, Hk, d,
                                     self.dtype, int(self.causal), float(lam), int(force_skip),
                                     torch.cuda.current_stream().cuda_stream, vis, skp, hist, int(knobs))
        if rc != 0:
            raise RuntimeError(self.lib.blasst_prefill_last_error().decode())
        return self.o

    def screen(self, lam, margin, z=6.0, counters=None, max_first=True):
        """The SPEC §2b FP8 screen at lambda: margin 1 strict, 2 tight(z), + 4 ahead. counters: (visited,
        skipped, screened, screen_wrong or None) device int64 [H]; screen_wrong runs the checking
        instance."""
        c = [None] * 4 if counters is None else [x.data_ptr() if x is not None else None for x in counters]
        B, Lq, Lk, H, Hk, d = self.dims
        rc = self.lib.blasst_prefill_screen(self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(),
                                            self.o.data_ptr(), self.lse.data_ptr(), B, Lq, Lk, H, Hk, d,
                                            self.dtype, int(self.causal), float(lam), int(max_first),
                                            int(margin), float(z), torch.cuda.current_stream().cuda_stream,
                                            *c)
        if rc != 0:
            raise RuntimeError(self.lib.blasst_prefill_last_error().decode())
        return self.o

    def counters(self, hist):
        H = self.dims[3]
        z = lambda n: torch.zeros(n, device=self.q.device, dtype=torch.int64)
        return (z(H), z(H), z(H * HIST_SLOTS) if hist else None)


def sdpa(q, k, v, causal, backend):
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, L, d] views
    g = q.shape[2] // k.shape[2]
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=g > 1)


# ---- workloads ------------------------------------------------------------------------------
def rope(x, base=10000.0):
    B, L, H, d = x.shape
    half = d // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = torch.arange(L, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def gen(kind, B, L, H, Hk, d, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float32)
    if kind == "random":
        q, k, v = rn(B, L, H, d), rn(B, L, Hk, d), rn(B, L, Hk, d)
    elif kind == "llm":
        a = math.sqrt(9.0 / math.sqrt(d))        # recency peak ~9 nats at distance 0
        c = rn(1, 1, Hk, d)
        cq = c.repeat_interleave(H // Hk, dim=2)
        q = rope(0.6 * rn(B, L, H, d) + a * cq)
        k = rope(0.6 * rn(B, L, Hk, d) + a * c)
        s = math.sqrt(7.0 / math.sqrt(d))        # sink score ~7 nats
        u = rn(1, 1, 1, d)
        q = q + s * u
        k[:, 0] += s * u[0, 0]
        hh = torch.randint(1, L, (8,), generator=g, device="cuda")
        k[:, hh] += 0.8 * s * u[0]
        v = rn(B, L, Hk, d)
    elif kind == "dit":
        # T x Hg x Wg grid with T * Hg * Wg = L (L = 32760 = 21 x 30 x 52).
        T, Hg, Wg = (21, 30, 52) if L == 32760 else (L // 1024, 32, 32)
        assert T * Hg * Wg == L
        t, hgr, w = torch.meshgrid(torch.arange(T), torch.arange(Hg), torch.arange(Wg), indexing="ij")
        coords = [x.reshape(-1).float().cuda() for x in (t, hgr, w)]
        nf = d // 6
        feats = []
        for p, n in zip(coords, (T, Hg, Wg)):
            om = (math.pi / n) * (2.0 ** (torch.arange(nf, device="cuda") * 4.0 / nf))
            feats += [torch.cos(p[:, None] * om), torch.sin(p[:, None] * om)]
        e = torch.cat(feats, -1)
        e = torch.nn.functional.pad(e, (0, d - e.shape[1]))[None, :, None, :]
        a = math.sqrt(10.0 * math.sqrt(d) / (3 * nf))  # peak ~10 nats
        q = a * e + 0.5 * rn(B, L, H, d)
        k = a * e + 0.5 * rn(B, L, Hk, d)
        v = rn(B, L, Hk, d)
    return tuple(x.to(dtype).contiguous() for x in (q, k, v))


def flops(B, H, Lq, Lk, d, causal):
    if not causal:
        return 4.0 * B * H * Lq * Lk * d
    pairs = sum(max(0, min(Lk, i + 1 + Lk - Lq)) for i in range(Lq)) if Lq != Lk else Lq * (Lq + 1) / 2
    return 4.0 * B * H * pairs * d


def lambda_for(hist, s):
    """Smallest bin edge e with #{delta < e} / total >= s; lambda = exp(e) (< 1), or None."""
    total = hist.sum().item()
    cum = torch.cumsum(hist, 0)
    for i in range(0, 1025):  # edge kLo + i * kW has #{delta < edge} = cum[i]
        if cum[i].item() >= s * total:
            e = KLO + i * KW
            return (math.exp(e) if e < 0 else None), cum[i].item() / total
    return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="reduced suite for the skip-variant overhead (quick_main)")
    ap.add_argument("--only", nargs="*", default=None, metavar="WORKLOAD:L:MASK:D",
                    help="full suite: only these rows (e.g. random:32768:full:128)")
    ap.add_argument("--screen", action="store_true",
                    help="the FP8 screen (SPEC §2b) at the DiT shape beside dense and skip (screen_main)")
    ap.add_argument("--screen-L", type=int, default=32760, help="--screen: sequence length")
    args = ap.parse_args()
    lib = load_lib(args.lib)
    if args.quick:
        return quick_main(args, lib)
    if args.screen:
        return screen_main(args, lib)
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    torch.backends.cuda.matmul.allow_tf32 = False
    bf = torch.bfloat16
    # (workload, B, L, H, Hk, d, causal)
    configs = []
    for L in (4096, 16384, 32768):
        for causal in (True, False):
            configs.append(("random", 1, L, 32, 32, 128, causal))
            configs.append(("llm", 1, L, 32, 32, 128, causal))
    for causal in (True, False):
        configs.append(("random", 1, 16384, 32, 32, 64, causal))
        configs.append(("llm", 1, 16384, 32, 32, 64, causal))
    configs.append(("dit", 1, 32760, 40, 40, 128, False))
    if args.only is not None:
        key = lambda c: f"{c[0]}:{c[2]}:{'causal' if c[6] else 'full'}:{c[5]}"
        unknown = set(args.only) - {key(c) for c in configs}
        if unknown:
            raise SystemExit(f"--only: no such rows {sorted(unknown)}")
        configs = [c for c in configs if key(c) in args.only]
    rows = []
    warm_up(lib)
    for (kind, B, L, H, Hk, d, causal) in configs:
        q, k, v = gen(kind, B, L, H, Hk, d, 1234 + L + d + int(causal), bf)
        ours = Ours(lib, q, k, v, causal)
        fl = flops(B, H, L, L, d, causal)
        r = dict(workload=kind, B=B, L=L, H=H, Hk=Hk, d=d, mask="causal" if causal else "full")
        tf = lambda ms: fl / (ms * 1e-3) / 1e12
        # Every figure of a row comes from one interleaved timing (interleaved_ms).
        names, fns = ["dense"], [lambda: ours()]
        ref = {}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                ref[name] = sdpa(q, k, v, causal, be)
                names.append(name)
                fns.append(lambda be=be: sdpa(q, k, v, causal, be))
            except Exception as ex:  # backend unavailable for this shape
                r[name + "_error"] = str(ex)[:200]
        ours()
        torch.cuda.synchronize()
        o_dense = ours.o.float().clone()
        if "cudnn" in ref:
            r["maxdiff_vs_cudnn"] = (o_dense - ref["cudnn"].transpose(1, 2).float()).abs().max().item()
        del ref
        rel = lambda: ((ours.o.float() - o_dense).norm() / o_dense.norm()).item()
        if kind == "random":
            # The skip kernel at 0 % sparsity (lambda off): plain, with statistics + histogram,
            # max-first.
            cnt = ours.counters(True)
            names += ["skip0", "skip0_stats", "skip0_maxfirst"]
            fns += [lambda: ours(0.0, 1), lambda: ours(0.0, 1, cnt), lambda: ours(0.0, 1, None, MAX_FIRST)]
        else:
            # One-pass curves (SPEC §5) of both visit orders: each order at its own lambda.
            curves = {}
            for order, kn in (("natural", 0), ("maxfirst", MAX_FIRST)):
                cnt = ours.counters(True)
                ours(0.0, 1, cnt, kn)
                torch.cuda.synchronize()
                curves[order] = cnt[2].view(H, HIST_SLOTS).sum(0).double()
            r["skip"] = []
            for s in (0.5, 0.7, 0.9):
                e = dict(target=s)
                for order, kn in (("natural", 0), ("maxfirst", MAX_FIRST)):
                    sfx = "" if order == "natural" else "_maxfirst"
                    lam, predicted = lambda_for(curves[order], s)
                    e["lambda" + sfx], e["curve_sparsity" + sfx] = lam, predicted
                    if lam is None:
                        e["note" + sfx] = "unreachable with lambda < 1"
                        continue
                    c2 = ours.counters(False)
                    ours(lam, 0, c2, kn)
                    torch.cuda.synchronize()
                    e["achieved" + sfx] = c2[1].sum().item() / max(1, c2[0].sum().item())
                    e["err" + sfx] = rel()
                    names.append(f"skip{sfx}_{s}")
                    fns.append(lambda lam=lam, kn=kn: ours(lam, 0, None, kn))
                r["skip"].append(e)
        res = dict(zip(names, interleaved_ms(fns, args.iters, args.warmup)))
        ms = res["dense"][0]
        r["ours_dense_ms"], r["ours_dense_tflops"], r["ours_dense_spread"] = ms, tf(ms), res["dense"][1]
        for name in ("cudnn", "flash"):
            if name in res:
                r[name + "_ms"], r[name + "_tflops"] = res[name][0], tf(res[name][0])
        if "cudnn_ms" in r:
            r["ratio_vs_cudnn"] = r["cudnn_ms"] / ms
        if kind == "random":
            r["skip0_ms"], r["skip0_overhead"] = res["skip0"][0], res["skip0"][0] / ms - 1
            r["stats_ms"], r["stats_overhead_vs_skip0"] = res["skip0_stats"][0], res["skip0_stats"][0] / res["skip0"][0] - 1
            r["skip0_maxfirst_overhead_vs_natural"] = res["skip0_maxfirst"][0] / res["skip0"][0] - 1
        else:
            for e in r["skip"]:
                s = e["target"]
                if f"skip_{s}" in res:
                    e["ms"], e["dense_equiv_tflops"] = res[f"skip_{s}"][0], tf(res[f"skip_{s}"][0])
                    e["speedup_vs_dense"] = ms / e["ms"]
                if f"skip_maxfirst_{s}" in res:
                    e["speedup_vs_dense_maxfirst"] = ms / res[f"skip_maxfirst_{s}"][0]
        rows.append(r)
        print(json.dumps(r), flush=True)
        del q, k, v, ours, o_dense
        torch.cuda.empty_cache()

    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=commit, gpu=dev,
                torch=torch.__version__, iters=args.iters, warmup=args.warmup,
                timing="interleaved rounds per row after a 2 s warm-up")
    lines = [f"# prefill benchmark  {meta['date']}  commit {commit}  {dev}  torch {torch.__version__}",
             "", "| workload | d | L | mask | ours TF/s | cuDNN TF/s | flash TF/s | ours/cuDNN | skip0 ovh | stats ovh | "
             "skip s=0.5 (achieved, speedup, dense-eq TF/s) | s=0.7 | s=0.9 |", "|" + "---|" * 13]
    f = lambda x, p=0: "-" if x is None else f"{x:.{p}f}"
    for r in rows:
        sk = []
        for e in r.get("skip", []):
            sk.append("n/a" if "ms" not in e else
                      f"{e['achieved']:.2f}, {e['speedup_vs_dense']:.2f}x, {e['dense_equiv_tflops']:.0f}")
        while len(sk) < 3:
            sk.append("-")
        lines.append(f"| {r['workload']} | {r['d']} | {r['L']} | {r['mask']} | {f(r.get('ours_dense_tflops'))} | "
                     f"{f(r.get('cudnn_tflops'))} | {f(r.get('flash_tflops'))} | {f(r.get('ratio_vs_cudnn'), 3)} | "
                     f"{f(100 * r['skip0_overhead'], 1) + '%' if 'skip0_overhead' in r else '-'} | "
                     f"{f(100 * r['stats_overhead_vs_skip0'], 1) + '%' if 'stats_overhead_vs_skip0' in r else '-'} | "
                     + " | ".join(sk) + " |")
    lines += ["", "Visit order (SPEC §2a): natural vs max-first, each at the lambda of its own one-pass curve "
              "(equal sparsity): achieved sparsity, speedup over our dense, rel. L2 error vs our dense. "
              "Skip kernel at 0 %: max-first over natural (random rows).", "",
              "| workload | d | L | mask | s | natural: lambda, ach, x, err | max-first: lambda, ach, x, err |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] == "random":
            lines.append(f"| random | {r['d']} | {r['L']} | {r['mask']} | 0 | skip0 | max-first "
                         f"{100 * r['skip0_maxfirst_overhead_vs_natural']:+.1f}% |")
            continue
        for e in r["skip"]:
            cell = lambda sfx, xs: (f"{e['lambda' + sfx]:.3g}, {e['achieved' + sfx]:.2f}, {e[xs]:.3f}x, {e['err' + sfx]:.4f}"
                                    if xs in e else "unreachable")
            lines.append(f"| {r['workload']} | {r['d']} | {r['L']} | {r['mask']} | {e['target']} | "
                         f"{cell('', 'speedup_vs_dense')} | {cell('_maxfirst', 'speedup_vs_dense_maxfirst')} |")
    write_results(args.out, "bench_prefill.json", meta, rows, lines)


MAX_FIRST = 1 << 30  # prefill_bench_lib.cpp: SkipConfig.vote.order = max_first
RECORD = 1 << 29  # prefill_bench_lib.cpp: the call records its skip set (SPEC 9, skip_record instance)


def interleaved_ms(fns, iters, warmup):
    """Median ms of each callable, timed in rounds (fn0, fn1, ... then again) so that clock drift
    (a cold GPU boosts higher at first) hits every variant alike. Also the spread of each."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    evs = [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            evs[i].append((s, e))
    torch.cuda.synchronize()
    out = []
    for ev in evs:
        ts = [s.elapsed_time(e) for s, e in ev]
        m = statistics.median(ts)
        out.append((m, (max(ts) - min(ts)) / m))
    return out


def write_results(out, json_name, meta, rows, lines):
    """The JSON (meta + rows) and the markdown table (bench_prefill.md) under `out`; the table is printed."""
    table = "\n".join(lines)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, json_name), "w") as fh:
        json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    with open(os.path.join(out, "bench_prefill.md"), "w") as fh:
        fh.write(table + "\n")
    print(table)


def warm_up(lib):
    """~2 s of dense work, so that the first configuration is not measured on a cold,
    higher-clocked card (run 3's 16k causal row was)."""
    q, k, v = gen("random", 1, 16384, 32, 32, 128, 7, torch.bfloat16)
    w = Ours(lib, q, k, v, False)
    t_end = time.time() + 2.0
    while time.time() < t_end:
        w()
        torch.cuda.synchronize()
    del q, k, v, w


def screen_main(args, lib):
    """The FP8 screen (SPEC §2b, issue 19 part 2) at the DiT shape: B = 1, H = 40, L = 32760 (the
    21 x 30 x 52 grid), d = 128, bf16, full mask, max-first order, at 70 and 90 % sparsity (lambda
    from the max-first one-pass curve). Timed interleaved: our dense kernel, the skip kernel, the
    screen strict and tight(z = 6), in the loop and ahead (the quantisation pre-kernel and, ahead,
    the screen-ahead kernel inside each call). Counted in
    separate runs of the checking instance: achieved sparsity, screened share of visited pairs,
    wrong screens; rel. L2 error of each output vs dense."""
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    warm_up(lib)
    L, H, d = args.screen_L, 40, 128
    q, k, v = gen("dit", 1, L, H, H, d, 4321, torch.bfloat16)
    ours = Ours(lib, q, k, v, False)
    cnt = ours.counters(True)
    ours(0.0, 1, cnt, MAX_FIRST)
    torch.cuda.synchronize()
    hist = cnt[2].view(H, HIST_SLOTS).sum(0).double()
    ours()
    torch.cuda.synchronize()
    o_dense = ours.o.float().clone()
    err = lambda: ((ours.o.float() - o_dense).norm() / o_dense.norm()).item()
    z = lambda: torch.zeros(H, device="cuda", dtype=torch.int64)
    rows = []
    for s in (0.7, 0.9):
        lam, _ = lambda_for(hist, s)
        r = dict(workload="dit", L=L, H=H, d=d, mask="full", order="max_first", target=s, **{"lambda": lam})
        if lam is None:
            rows.append(r)
            continue
        c2 = ours.counters(False)
        ours(lam, 0, c2, MAX_FIRST)
        torch.cuda.synchronize()
        r["achieved"] = c2[1].sum().item() / max(1, c2[0].sum().item())
        r["err_skip"] = err()
        names, fns = ["dense", "skip"], [lambda: ours(), lambda: ours(lam, 0, None, MAX_FIRST)]
        for label, margin in (("strict", 1), ("tight6", 2), ("strict_ahead", 5), ("tight6_ahead", 6)):
            ahead = margin & 4
            cs = (z(), z(), z(), None if ahead else z())  # the pass ahead counts no wrong screens
            ours.screen(lam, margin, 6.0, cs)
            torch.cuda.synchronize()
            vis = max(1, cs[0].sum().item())
            r[label] = dict(sparsity=cs[1].sum().item() / vis, screened=cs[2].sum().item() / vis,
                            wrong="n/a" if ahead else cs[3].sum().item(), err=err())
            names.append(label)
            fns.append(lambda margin=margin: ours.screen(lam, margin, 6.0))
        res = dict(zip(names, interleaved_ms(fns, args.iters, args.warmup)))
        r["ms"] = {n: res[n][0] for n in names}
        r["spread"] = {n: res[n][1] for n in names}
        for n in names[1:]:
            r["speedup_" + n] = res["dense"][0] / res[n][0]
        rows.append(r)
        print(json.dumps(r), flush=True)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=commit, gpu=dev,
                torch=torch.__version__, iters=args.iters, warmup=args.warmup, suite="screen",
                timing="interleaved rounds after a 2 s warm-up")
    lines = [f"# prefill FP8 screen benchmark  {meta['date']}  commit {commit}  {dev}", "",
             f"dit, B = 1, H = {H}, L = {L}, d = {d}, bf16, full mask, max-first; speedup over our dense kernel; "
             "screened = share of visited pairs the screen skipped; wrong = wrong screens (checking instance)", "",
             "| target | lambda | achieved | skip | strict (screened, wrong) | tight z=6 (screened, wrong) | "
             "strict ahead (screened, sparsity) | tight z=6 ahead (screened, sparsity) | "
             "err skip / strict / tight / strict ahead / tight ahead |", "|" + "---|" * 9]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['target']:.2f} | n/a | | | | | | | |")
            continue
        st, ti, sa, ta = r["strict"], r["tight6"], r["strict_ahead"], r["tight6_ahead"]
        lines.append(f"| {r['target']:.2f} | {r['lambda']:.3g} | {r['achieved']:.3f} | {r['speedup_skip']:.3f}x | "
                     f"{r['speedup_strict']:.3f}x ({st['screened']:.3f}, {st['wrong']}) | "
                     f"{r['speedup_tight6']:.3f}x ({ti['screened']:.3f}, {ti['wrong']}) | "
                     f"{r['speedup_strict_ahead']:.3f}x ({sa['screened']:.3f}, {sa['sparsity']:.3f}) | "
                     f"{r['speedup_tight6_ahead']:.3f}x ({ta['screened']:.3f}, {ta['sparsity']:.3f}) | "
                     f"{r['err_skip']:.2e} / {st['err']:.2e} / {ti['err']:.2e} / {sa['err']:.2e} / {ta['err']:.2e} |")
    write_results(args.out, "bench_prefill_screen.json", meta, rows, lines)


def quick_main(args, lib):
    """Reduced suite for the skip variant (bf16): d128 at 16k and 32k, causal and full, and d64
    16k causal (random only). GPU warmed up first; every comparison timed interleaved.
    random: dense, cuDNN, the skip kernel at 0 % (lambda off) as the library builds it, with
    statistics + histogram on, and max-first. llm: dense, skip at 50/70/90 % in both visit
    orders, each at the lambda of its own one-pass curve."""
    dev = torch.cuda.get_device_name()
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    rows = []
    warm_up(lib)
    configs = [(L, causal, 128) for L in (16384, 32768) for causal in (True, False)]
    configs.append((16384, True, 64))
    for (L, causal, d) in configs:
        for kind in ("random", "llm"):
            if d == 64 and kind == "llm":
                continue
            q, k, v = gen(kind, 1, L, 32, 32, d, 1234 + L + d + int(causal), torch.bfloat16)
            ours = Ours(lib, q, k, v, causal)
            fl = flops(1, 32, L, L, d, causal)
            tf = lambda ms: fl / (ms * 1e-3) / 1e12
            r = dict(workload=kind, L=L, d=d, mask="causal" if causal else "full")
            names, fns = ["dense"], [lambda: ours()]
            if kind == "random":
                cnt = ours.counters(True)
                names += ["skip0", "skip0_stats", "skip0_maxfirst"]
                fns += [lambda: ours(0.0, 1), lambda: ours(0.0, 1, cnt),
                        lambda: ours(0.0, 1, None, MAX_FIRST)]
                try:
                    sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)
                    names.append("cudnn")
                    fns.append(lambda: sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
                except Exception as ex:  # backend unavailable: keep going
                    r["cudnn_error"] = str(ex)[:200]
            else:
                cnt = ours.counters(True)
                ours(0.0, 1, cnt)
                torch.cuda.synchronize()
                hist = cnt[2].view(32, HIST_SLOTS).sum(0).double()
                # Max-first order: its own one-pass curve, so the orders compare at equal sparsity.
                cmf = ours.counters(True)
                ours(0.0, 1, cmf, MAX_FIRST)
                torch.cuda.synchronize()
                hist_mf = cmf[2].view(32, HIST_SLOTS).sum(0).double()
                o_dense = None
                ours()
                torch.cuda.synchronize()
                o_dense = ours.o.float().clone()
                r["skip"] = []
                for s in (0.5, 0.7, 0.9):
                    lam, _ = lambda_for(hist, s)
                    lam_mf, _ = lambda_for(hist_mf, s)
                    e = dict(target=s, **{"lambda": lam, "lambda_maxfirst": lam_mf})
                    if lam_mf is not None:
                        c3 = ours.counters(False)
                        ours(lam_mf, 0, c3, MAX_FIRST)
                        torch.cuda.synchronize()
                        e["achieved_maxfirst"] = c3[1].sum().item() / max(1, c3[0].sum().item())
                        e["err_maxfirst"] = ((ours.o.float() - o_dense).norm() / o_dense.norm()).item()
                        names.append(f"mf{lam_mf}")
                        fns.append(lambda lam_mf=lam_mf: ours(lam_mf, 0, None, MAX_FIRST))
                    if lam is not None:
                        c2 = ours.counters(False)
                        ours(lam, 0, c2)
                        torch.cuda.synchronize()
                        e["achieved"] = c2[1].sum().item() / max(1, c2[0].sum().item())
                        e["err"] = ((ours.o.float() - o_dense).norm() / o_dense.norm()).item()
                        names.append(f"lib{lam}")
                        fns.append(lambda lam=lam: ours(lam))
                        # The same call recording its skip set for a backward (issue 14: <= 1 %).
                        names.append(f"rec{lam}")
                        fns.append(lambda lam=lam: ours(lam, 0, None, RECORD))
                    r["skip"].append(e)
            res = dict(zip(names, interleaved_ms(fns, args.iters, args.warmup)))
            r["dense_ms"], r["dense_spread"] = res["dense"]
            r["dense_tflops"] = tf(r["dense_ms"])
            if kind == "random":
                for n in names:
                    if n.startswith("skip0"):
                        r[n + "_ovh"] = res[n][0] / r["dense_ms"] - 1
                if "cudnn" in res:
                    r["cudnn_ms"] = res["cudnn"][0]
                    r["ratio_vs_cudnn"] = res["cudnn"][0] / r["dense_ms"]
            else:
                for e in r["skip"]:
                    lam = e["lambda"]
                    if lam is None:
                        continue
                    e["speedup"] = r["dense_ms"] / res[f"lib{lam}"][0]
                    e["record_cost"] = res[f"rec{lam}"][0] / res[f"lib{lam}"][0] - 1
                    if e.get("lambda_maxfirst") is not None:
                        e["speedup_maxfirst"] = r["dense_ms"] / res[f"mf{e['lambda_maxfirst']}"][0]
            rows.append(r)
            print(json.dumps(r), flush=True)
            del q, k, v, ours
            torch.cuda.empty_cache()
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=commit, gpu=dev,
                torch=torch.__version__, iters=args.iters, warmup=args.warmup, suite="quick",
                timing="interleaved rounds after a 2 s warm-up")
    pc = lambda x: "-" if x is None else f"{100 * x:+.1f}%"
    lines = [f"# prefill quick benchmark  {meta['date']}  commit {commit}  {dev}", "",
             "Interleaved timing after a 2 s warm-up.", "",
             "random inputs: skip kernels at 0 % sparsity, time over dense; lib = library skip kernel, "
             "stats = library with statistics + histogram", "",
             "| L | d | mask | dense TF/s | ours/cuDNN | lib | stats |",
             "|" + "---|" * 7]
    for r in rows:
        if r["workload"] == "random":
            cells = [pc(r.get("skip0_ovh")), pc(r.get("skip0_stats_ovh"))]
            lines.append(f"| {r['L']} | {r['d']} | {r['mask']} | {r['dense_tflops']:.0f} | "
                         f"{r.get('ratio_vs_cudnn', float('nan')):.3f} | " + " | ".join(cells) + " |")
    lines += ["", "llm inputs, d128: speedup over dense at the achieved sparsity s (library, natural order)", "",
              "| L | mask | dense TF/s | s | lib | recording the skip set (time over lib) |",
              "|" + "---|" * 6]
    for r in rows:
        if r["workload"] == "llm":
            for e in r["skip"]:
                if "speedup" not in e:
                    continue
                lines.append(f"| {r['L']} | {r['mask']} | {r['dense_tflops']:.0f} | {e['achieved']:.2f} | "
                             f"{e['speedup']:.3f}x | {pc(e.get('record_cost'))} |")
    lines += ["", "Visit order (SPEC §2a): natural vs max-first, each at the lambda of its own one-pass curve "
              "(equal sparsity); speedup over dense, rel. L2 error vs dense; skip kernel at 0 % with max-first "
              "vs natural (random inputs)", "",
              "| L | d | mask | skip0 natural | skip0 max-first |", "|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] == "random":
            lines.append(f"| {r['L']} | {r['d']} | {r['mask']} | {pc(r.get('skip0_ovh'))} | "
                         f"{pc(r.get('skip0_maxfirst_ovh'))} |")
    lines += ["", "| L | mask | s | natural: ach, x, err | max-first: ach, x, err |", "|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] == "llm":
            for e in r["skip"]:
                nat = (f"{e['achieved']:.2f}, {e['speedup']:.3f}x, {e['err']:.3f}" if "speedup" in e else "n/a")
                mf = (f"{e['achieved_maxfirst']:.2f}, {e['speedup_maxfirst']:.3f}x, {e['err_maxfirst']:.3f}"
                      if "speedup_maxfirst" in e else "n/a")
                lines.append(f"| {r['L']} | {r['mask']} | {e['target']} | {nat} | {mf} |")
    write_results(args.out, "bench_prefill_quick.json", meta, rows, lines)


if __name__ == "__main__":
    main()
