#!/usr/bin/env python3
"""Decode benchmark: blasst decode (dense and Skip-Softmax) vs torch SDPA (cuDNN, flash).

Usage: bench_decode.py LIB.so OUTDIR [--quick | --variants [--budget SECONDS]]

--quick: 3 shapes (B=1 32k 32/8, B=8 32k 32/8, B=64 32k 64/8), dense and skip 50/70 % in both
visit orders, cuDNN beside, no probes (~1 minute).
--variants: the two decode instance families side by side (issue 18): the 8-warp kernels (one CTA
per SM at d = 128) and the 4-warp ones (two CTAs per SM), forced through bdb_set_warps, beside
torch SDPA cuDNN and flash, at B = 1, 8, 64 and L = 8k..128k (GQA 32/8, d = 128): dense as CUDA-graph
replays and eagerly (one enqueue per call, host cost included), skip at 50 / 70 % (natural order,
each family at the lambda of its own one-pass curve: the split layouts differ), and which family
the library's rule picks. Writes decode_variants.json / .md; stops starting rows after --budget
seconds (default 200).

Skip rows are measured for both visit orders (SPEC §2a): natural, and max-first (= seeded splits in
decode). Each order gets its own lambda from its own one-pass curve, so the orders are compared at
equal achieved sparsity; "err" is the relative L2 difference of the skip output from our dense one.

Inputs: q [B, 1, Hq, d], K/V caches [B, L, Hk, d] bf16, contiguous. K is llm-like (an attention
sink, a recency window, a few heavy-hitter keys, and a per-tile "topic" alignment that varies
smoothly) so that skipping is real; lambda for each target sparsity comes from the one-pass curve
(SPEC §5) of a dense run on the same inputs, and the achieved sparsity is measured (stats run).
Timing: each method is captured in a CUDA graph that calls it once per rotating KV buffer (cold
L2: the buffers together exceed the 60 MB L2 several times); replays are timed with CUDA events
after warm-up, median of >= 20. TB/s counts the K+V bytes of the dense kernel.
"""
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

LIB = ctypes.CDLL(sys.argv[1])
OUT = sys.argv[2]
QUICK = "--quick" in sys.argv
VARIANTS = "--variants" in sys.argv
BUDGET_S = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 200.0
LIB.bdb_last_error.restype = ctypes.c_char_p
LIB.bdb_set_load_path.argtypes = [ctypes.c_int]
LIB.bdb_set_warps.argtypes = [ctypes.c_int]
vp = ctypes.c_void_p


def check(rc):
    if rc != 0:
        raise RuntimeError(LIB.bdb_last_error().decode())


def ours(q, k, v, o, lam, stats=None, head_major=0, order=0):
    if head_major:
        B, hk, L, d = k.shape
    else:
        B, L, hk, d = k.shape
    hq = q.shape[2]
    st = (ctypes.c_int64 * 3)() if stats is not None else None
    check(LIB.bdb_decode(vp(q.data_ptr()), vp(k.data_ptr()), vp(v.data_ptr()), vp(o.data_ptr()), B, L, hq, hk, d, 0,
                         ctypes.c_double(lam), vp(torch.cuda.current_stream().cuda_stream), st, head_major, order))
    if stats is not None:
        stats.extend([st[0], st[1], st[2]])


def lambdas_for(q, k, v, o, targets, order=0):
    B, L, hk, d = k.shape
    hq = q.shape[2]
    t = (ctypes.c_double * len(targets))(*targets)
    res = (ctypes.c_double * len(targets))()
    check(LIB.bdb_lambdas(vp(q.data_ptr()), vp(k.data_ptr()), vp(v.data_ptr()), vp(o.data_ptr()), B, L, hq, hk, d, 0,
                          vp(torch.cuda.current_stream().cuda_stream), t, len(targets), res, order))
    return list(res)


def make_kv(B, L, hk, d, g, gen):
    """llm-like K: per KV head a direction u the queries share; key j = noise + a_j u.
    Generated one sequence at a time (float32 temporaries of the whole cache would not fit)."""
    u = torch.randn(B, 1, hk, d, device="cuda", generator=gen)
    u = u / u.norm(dim=-1, keepdim=True) * math.sqrt(d)
    k = torch.empty(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.empty(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
    ntiles = (L + 127) // 128
    for b in range(B):
        topic = torch.rand(ntiles, hk, 1, device="cuda", generator=gen) ** 3 * 0.55  # per-tile level
        a = topic.repeat_interleave(128, dim=0)[:L]
        a = a + 0.05 * torch.randn(L, hk, 1, device="cuda", generator=gen)
        heavy = torch.rand(L, hk, 1, device="cuda", generator=gen) < 5e-4  # heavy hitters
        a = torch.where(heavy, torch.full_like(a, 0.9), a)
        a[0] = 1.0                                   # attention sink
        a[max(0, L - 256):] = a[max(0, L - 256):].clamp(min=0.7)  # recency window
        k[b] = (0.5 * torch.randn(L, hk, d, device="cuda", generator=gen) + a * u[b]).to(torch.bfloat16)
        v[b] = torch.randn(L, hk, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    return k, v, u


def make_q(B, hq, hk, d, u, gen):
    g = hq // hk
    uq = u.repeat_interleave(g, dim=2)  # [B, 1, hq, d]
    return (0.5 * uq + 0.5 * torch.randn(B, 1, hq, d, device="cuda", generator=gen)).to(torch.bfloat16)


def time_graph(fn_per_buf, nbuf, reps=25, warm=3, warm_s=0.05):
    """Median per-call time (s) of fn over nbuf rotating buffers, CUDA-graph replays, after at
    least `warm` replays and `warm_s` seconds of them: the first configuration timed in a row ran
    4-6 % slower than the same loads timed later in four H200 runs (B = 8, 32k, after the fp32
    correctness check), so each timing first runs its own graph for a while."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(nbuf):  # warm-up outside the graph (handles, plans, pools)
            fn_per_buf(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(nbuf):
                fn_per_buf(i)
        run = graph.replay
        mode = "graph"
    except Exception:  # fall back to eager enqueue (host overhead may show at small sizes)
        torch.cuda.synchronize()
        graph = None

        def run():
            for i in range(nbuf):
                fn_per_buf(i)
        mode = "eager"
    t_end = time.perf_counter() + warm_s
    n_warm = 0
    while n_warm < warm or time.perf_counter() < t_end:
        run()
        torch.cuda.synchronize()
        n_warm += 1
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / nbuf)
    del graph
    return statistics.median(times), mode


def time_eager(fn_per_buf, nbuf, reps=25, warm=3):
    """Median per-call time (s) of fn over nbuf rotating buffers enqueued eagerly (no graph): each
    call's host cost is in it when the host, not the GPU, is the bottleneck (small problems)."""
    for _ in range(warm):
        for i in range(nbuf):
            fn_per_buf(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(nbuf):
            fn_per_buf(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / nbuf)
    return statistics.median(times)


def time_peer(row, name, be, bufs, nbuf, kv_bytes, eager=False):
    """torch SDPA with backend `be` on the same rotating buffers: <name>_us and _tbs (CUDA-graph
    replays) and, with eager, <name>_eager_us; a backend that refuses the shape leaves
    <name>_us None and its message in <name>_err."""
    try:
        views = [(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2)) for qq, kk, vv, _ in bufs]

        def sdpa(i):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(*views[i], enable_gqa=True)
        t_p, _ = time_graph(sdpa, nbuf)
        row[name + "_us"] = t_p * 1e6
        row[name + "_tbs"] = kv_bytes / t_p / 1e12
        if eager:
            row[name + "_eager_us"] = time_eager(sdpa, nbuf) * 1e6
    except Exception as e:  # backend unavailable for this shape
        row[name + "_us"] = None
        row[name + "_err"] = str(e).splitlines()[0][:160]


def set_warps(w):
    LIB.bdb_set_warps(w)


def planned_warps(q, k, v, o, lam):
    B, L, hk, d = k.shape
    return LIB.bdb_planned_warps(vp(q.data_ptr()), vp(k.data_ptr()), vp(v.data_ptr()), vp(o.data_ptr()), B, L,
                                 q.shape[2], hk, d, 0, ctypes.c_double(lam))


def variants_main():
    """Both instance families beside cuDNN and flash (see the module docstring, --variants)."""
    t_start = time.perf_counter()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"device {dev}; copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    hq, hk, d = 32, 8, 128
    targets = [0.5, 0.7]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    # The target rows first (B >= 8, L >= 16k), so that the budget still leaves them.
    grid = [(8, 32768), (8, 16384), (64, 16384), (8, 131072), (64, 32768), (1, 131072), (1, 32768), (8, 8192),
            (64, 8192), (8, 65536), (64, 65536), (1, 8192), (1, 16384), (1, 65536), (64, 131072)]
    rows = []
    for (B, L) in grid:
        if time.perf_counter() - t_start > BUDGET_S:
            print(f"budget of {BUDGET_S:.0f} s spent: rows from B={B} L={L} on not run", flush=True)
            break
        kv_bytes = 2 * B * L * hk * d * 2
        nbuf = max(2, min(8, math.ceil(4 * 60e6 / kv_bytes)))
        if kv_bytes * nbuf > 90e9:
            nbuf = 1 if kv_bytes > 60e6 else 2
        bufs = []
        for _ in range(nbuf):
            k, v, u = make_kv(B, L, hk, d, hq // hk, gen)
            q = make_q(B, hq, hk, d, u, gen)
            bufs.append((q, k, v, torch.empty_like(q)))
        q, k, v, o = bufs[0]
        row = {"B": B, "L": L, "hq": hq, "hk": hk, "d": d, "kv_bytes": kv_bytes, "nbuf": nbuf}
        set_warps(0)
        row["library_warps_dense"] = planned_warps(q, k, v, o, 0.0)
        outs = {}
        for w in (8, 4):
            set_warps(w)
            try:
                row[f"w{w}_planned"] = planned_warps(q, k, v, o, 0.0)
                ours(q, k, v, o, 0.0)
                outs[w] = o.float().clone()
                time_graph(lambda i: ours(*bufs[i], 0.0), nbuf)  # the first timing of a row runs slow
                t, mode = time_graph(lambda i: ours(*bufs[i], 0.0), nbuf)
                row[f"w{w}_dense_us"] = t * 1e6
                row[f"w{w}_dense_tbs"] = kv_bytes / t / 1e12
                row[f"w{w}_timing"] = mode
                row[f"w{w}_eager_us"] = time_eager(lambda i: ours(*bufs[i], 0.0), nbuf) * 1e6
                lams = lambdas_for(q, k, v, o, targets, 0)
                for s_, lam in zip(targets, lams):
                    key = f"w{w}_skip{int(s_ * 100)}"
                    if not (0 < lam < 1):
                        row[key] = None
                        continue
                    st = []
                    ours(q, k, v, o, lam, st)
                    err = ((o.float() - outs[w]).norm() / outs[w].norm()).item()
                    t_s, _ = time_graph(lambda i: ours(*bufs[i], lam), nbuf)
                    ach = st[0] / max(st[1], 1)
                    row[key] = {"lambda": lam, "achieved": ach, "split_tiles": st[2], "us": t_s * 1e6,
                                "speedup": t / t_s, "bound": 1.0 / (1.0 - ach / 2), "err": err}
            except Exception as e:  # keep the row (and the other family) on a failure
                row[f"w{w}_error"] = str(e).splitlines()[0][:200]
                print(f"B={B} L={L} {w} warps: {row[f'w{w}_error']}", flush=True)
            finally:
                set_warps(0)
        if 8 in outs and 4 in outs:
            row["w4_vs_w8_max_diff"] = (outs[4] - outs[8]).abs().max().item()
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            time_peer(row, name, be, bufs, nbuf, kv_bytes, eager=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_variants_report(rows, dev, copy_bw)
        del bufs, q, k, v, o, outs
        torch.cuda.empty_cache()
    print(write_variants_report(rows, dev, copy_bw))


def write_variants_report(rows, dev, copy_bw):
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(os.path.join(OUT, "decode_variants.json"), "w") as f:
        json.dump({"date": date, "commit": commit, "gpu": dev, "copy_tbs": copy_bw / 1e12, "rows": rows}, f, indent=1)

    def f1(x):
        return "n/a" if x is None else f"{x:.1f}"

    def f2(x):
        return "n/a" if x is None else f"{x:.2f}"

    def sk(x):
        return "n/a" if not x else f"{x['achieved']:.2f}, {x['speedup']:.2f}x, {100 * x['speedup'] / x['bound']:.0f}%"
    lines = [f"# decode instance families {date} commit {commit} on {dev}; copy {copy_bw / 1e12:.2f} TB/s; "
             "GQA 32/8, d = 128, bf16, cold L2", "",
             "Dense, CUDA-graph replays (TB/s = K+V bytes / time); lib = the family the library's rule picks; "
             "x cuDNN = TB/s over cuDNN's", "",
             "| B | L | lib | 8w us | 8w TB/s | 4w us | 4w TB/s | 4w/8w | cuDNN TB/s | flash TB/s | 8w x cuDNN | "
             "4w x cuDNN | 4w-8w max diff |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t8, t4, cu = r.get("w8_dense_tbs"), r.get("w4_dense_tbs"), r.get("cudnn_tbs")
        lines.append(f"| {r['B']} | {r['L'] // 1024}k | {r.get('library_warps_dense')}w | {f1(r.get('w8_dense_us'))} | "
                     f"{f2(t8)} | {f1(r.get('w4_dense_us'))} | {f2(t4)} | {f2(t4 / t8 if t4 and t8 else None)} | "
                     f"{f2(cu)} | {f2(r.get('flash_tbs'))} | {f2(t8 / cu if t8 and cu else None)} | "
                     f"{f2(t4 / cu if t4 and cu else None)} | {r.get('w4_vs_w8_max_diff', float('nan')):.1e} |")
    lines += ["", "Eager (one enqueue per call, us per call)", "", "| B | L | 8w | 4w | cuDNN | flash |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['B']} | {r['L'] // 1024}k | {f1(r.get('w8_eager_us'))} | {f1(r.get('w4_eager_us'))} | "
                     f"{f1(r.get('cudnn_eager_us'))} | {f1(r.get('flash_eager_us'))} |")
    lines += ["", "Skip, natural order, each family at the lambda of its own one-pass curve: (achieved sparsity, "
              "speedup over the same family's dense, % of the V-skip bound 1 / (1 - s/2))", "",
              "| B | L | 8w skip50 | 4w skip50 | 8w skip70 | 4w skip70 | 4w skip70 us vs cuDNN dense us |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        s70 = r.get("w4_skip70")
        vs = f"{s70['us']:.1f} / {r['cudnn_us']:.1f}" if s70 and r.get("cudnn_us") else "n/a"
        lines.append(f"| {r['B']} | {r['L'] // 1024}k | {sk(r.get('w8_skip50'))} | {sk(r.get('w4_skip50'))} | "
                     f"{sk(r.get('w8_skip70'))} | {sk(r.get('w4_skip70'))} | {vs} |")
    errs = [f"B={r['B']} L={r['L']}: " + "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error") or k.endswith("_err"))
            for r in rows if any(k.endswith("_error") or k.endswith("_err") for k in r)]
    if errs:
        lines += ["", "Errors:", ""] + ["- " + e for e in errs]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "decode_variants.md"), "w") as f:
        f.write(table)
    return table


def copy_bandwidth():
    n = 1 << 31  # 2^31 bf16 elements = 4 GiB per buffer
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(20):  # let the clocks ramp up
        dst.copy_(src)
    # Timed eagerly: a copy captured in a CUDA graph ran at ~2.7 TB/s on H200 (2026-11-29, a
    # copy-engine memcpy node, it seems), far below the SM copy kernel that eager copy_ uses.
    times = []
    for _ in range(20):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    t = statistics.median(times)
    bw = 2 * src.numel() * 2 / t
    del src, dst
    torch.cuda.empty_cache()
    return bw


def write_report(rows, dev, copy_bw):
    commit = os.environ.get("BLASST_COMMIT", "unknown")
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, "gpu": dev,
              "copy_tbs": copy_bw / 1e12, "rows": rows}
    with open(os.path.join(OUT, "decode_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"# decode benchmark {result['date']} commit {commit} on {dev}; copy {copy_bw / 1e12:.2f} TB/s",
             "", "| B | L | Hq/Hk | dense us | dense TB/s | %copy | cuDNN TB/s | flash TB/s | dense/cuDNN | "
             "skip50 (ach, x) | skip70 (ach, x) | skip90 (ach, x) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def sk(r, key):
        x = r.get(key)
        return "n/a" if not x else f"{x['achieved']:.2f}, {x['speedup']:.2f}x ({100 * x['speedup'] / x['bound']:.0f}% of bound)"

    def f2(x):
        return "n/a" if x is None else f"{x:.2f}"
    for r in rows:
        cud = r.get("cudnn_tbs")
        lines.append(f"| {r['B']} | {r['L'] // 1024}k | {r['hq']}/{r['hk']} | {r['dense_us']:.1f} | {r['dense_tbs']:.2f} | "
                     f"{100 * r['dense_tbs'] / (copy_bw / 1e12):.0f}% | {f2(cud)} | {f2(r.get('flash_tbs'))} | "
                     f"{f2(r['dense_tbs'] / cud if cud else None)} | {sk(r, 'skip50')} | {sk(r, 'skip70')} | {sk(r, 'skip90')} |")
    if any("mf50" in r for r in rows):
        def sx(x):
            return "n/a" if not x else f"{x['achieved']:.2f}, {x['speedup']:.2f}x, err {x['err']:.3f}"
        lines += ["", "Visit order (SPEC §2a): natural vs max-first (seeded splits), each at the lambda of its own "
                  "one-pass curve; (achieved sparsity, speedup over our dense, rel. L2 error vs our dense output)", "",
                  "| B | L | Hq/Hk | split tiles | natural 50 | max-first 50 | natural 70 | max-first 70 | "
                  "natural 90 | max-first 90 |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "mf50" not in r:
                continue
            lines.append(f"| {r['B']} | {r['L'] // 1024}k | {r['hq']}/{r['hk']} | {r.get('split_tiles', '?')} | "
                         f"{sx(r.get('skip50'))} | {sx(r.get('mf50'))} | {sx(r.get('skip70'))} | {sx(r.get('mf70'))} | "
                         f"{sx(r.get('skip90'))} | {sx(r.get('mf90'))} |")
    probes = [r for r in rows if "dense_cpasync_tbs" in r]
    if probes:
        lines += ["", "Probes (dense TB/s): default (tensor-map boxes), per-thread 16-byte cp.async, and a "
                  "head-major [B, Hk, L, d] cache (tensor-map boxes, each tile one contiguous 32 KB block)", "",
                  "| B | L | Hq/Hk | tma (default) | cp.async | head-major | max diff | "
                  "skip kernel, nothing skipped: us / vs dense | + seed prologue: us / vs natural |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in probes:
            lines.append(f"| {r['B']} | {r['L'] // 1024}k | {r['hq']}/{r['hk']} | {r['dense_tbs']:.2f} | "
                         f"{r['dense_cpasync_tbs']:.2f} | "
                         f"{r['dense_headmajor_tbs']:.2f} | {r['headmajor_max_diff']:.1e} | "
                         f"{r['skipkernel_noskip_us']:.1f} / {r['skipkernel_noskip_us'] / r['dense_us']:.3f} | "
                         f"{r['seeded_noskip_us']:.1f} / {r['seeded_noskip_us'] / r['skipkernel_noskip_us']:.3f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "decode_bench.md"), "w") as f:
        f.write(table)
    return table


def skip_rows(row, bufs, kv_bytes, nbuf, q, k, v, o, targets, t_dense, both_orders=True):
    """Skip timings per target sparsity (row["skip50"], ...), and with both_orders also for the
    max-first order (row["mf50"], ...)."""
    ours(q, k, v, o, 0.0)
    o_dense = o.float().clone()
    for order, prefix in ((0, "skip"), (1, "mf"))[:2 if both_orders else 1]:
        lams = lambdas_for(q, k, v, o, targets, order)
        for s, lam in zip(targets, lams):
            key = f"{prefix}{int(s * 100)}"
            if not (0 < lam < 1):
                row[key] = None
                continue
            st = []
            ours(q, k, v, o, lam, st, order=order)
            err = ((o.float() - o_dense).norm() / o_dense.norm()).item()
            t_s, _ = time_graph(lambda i: ours(*bufs[i], lam, order=order), nbuf)
            ach = st[0] / max(st[1], 1)
            row["split_tiles"] = st[2]
            row[key] = {"lambda": lam, "achieved": ach, "split_tiles": st[2], "us": t_s * 1e6,
                        "speedup": t_dense / t_s, "bound": 1.0 / (1.0 - ach / 2), "err": err}


def main():
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"device {dev}; copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    batches = [1, 8, 32, 64]
    lens = [8192, 32768, 131072]
    gqas = [(32, 8), (64, 8), (64, 4)]
    if QUICK:
        batches, lens, gqas = [1, 8, 64], [32768], [(32, 8), (64, 8)]
    d = 128
    targets = [0.5, 0.7] if QUICK else [0.5, 0.7, 0.9]
    rows = []
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    grid = [(hq, hk, L, B) for (hq, hk) in gqas for L in lens for B in batches]
    # The target configurations first, so that a time limit still leaves the important rows.
    first = [(32, 8, 32768, 1), (32, 8, 32768, 8), (32, 8, 8192, 64), (32, 8, 32768, 32), (64, 8, 32768, 8),
             (64, 4, 32768, 8), (32, 8, 131072, 1), (32, 8, 8192, 1)]
    grid = [c for c in first if c in grid] + [c for c in grid if c not in first]
    if QUICK:
        grid = [(32, 8, 32768, 1), (32, 8, 32768, 8), (64, 8, 32768, 64)]
    for (hq, hk, L, B) in grid:
        if True:
            if True:
                kv_bytes = 2 * B * L * hk * d * 2
                if kv_bytes > 40e9:
                    print(f"skip B={B} L={L} {hq}/{hk}: {kv_bytes / 1e9:.0f} GB per KV set", flush=True)
                    continue
                nbuf = max(2, min(8, math.ceil(4 * 60e6 / kv_bytes)))
                if kv_bytes * nbuf > 90e9:
                    nbuf = 1 if kv_bytes > 60e6 else 2
                bufs = []
                for _ in range(nbuf):
                    k, v, u = make_kv(B, L, hk, d, hq // hk, gen)
                    q = make_q(B, hq, hk, d, u, gen)
                    bufs.append((q, k, v, torch.empty_like(q)))
                row = {"B": B, "L": L, "hq": hq, "hk": hk, "d": d, "kv_bytes": kv_bytes, "nbuf": nbuf}
                # Correctness spot check against torch (math on float32) on buffer 0.
                q, k, v, o = bufs[0]
                ours(q, k, v, o, 0.0)
                if B * L <= 8 * 32768:
                    ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                                         v.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
                    row["rel_err_vs_torch_f32"] = ((o.float() - ref).norm() / ref.norm()).item()
                    del ref
                # The first timing of a row ran 4-6 % slower than later ones of the same kernel in
                # session 2's runs (probes timed after it were faster whatever they were): time the
                # dense kernel twice and keep the second; the first is kept for the record.
                t_first, _ = time_graph(lambda i: ours(*bufs[i], 0.0), nbuf)
                t, mode = time_graph(lambda i: ours(*bufs[i], 0.0), nbuf)
                row["dense_first_us"] = t_first * 1e6
                row["dense_us"] = t * 1e6
                row["dense_tbs"] = kv_bytes / t / 1e12
                row["timing"] = mode
                if ((hq, hk, L, B) in first[:3] and not QUICK) or QUICK:
                    # Probes: the per-thread cp.async load path, and a head-major cache layout.
                    LIB.bdb_set_load_path(1)
                    try:
                        t_c, _ = time_graph(lambda i: ours(*bufs[i], 0.0), nbuf)
                    finally:
                        LIB.bdb_set_load_path(0)
                    row["dense_cpasync_tbs"] = kv_bytes / t_c / 1e12
                    # Cost of the seed prologue (max-first = seeded splits) with nothing skipped:
                    # the skip kernel at lambda 1e-30, seeded vs natural.
                    t_nat, _ = time_graph(lambda i: ours(*bufs[i], 1e-30), nbuf)
                    t_seed, _ = time_graph(lambda i: ours(*bufs[i], 1e-30, order=1), nbuf)
                    row["skipkernel_noskip_us"] = t_nat * 1e6
                    row["seeded_noskip_us"] = t_seed * 1e6
                    # Natural again after them: a drift over the sequence shows as a gap between the two.
                    t_nat2, _ = time_graph(lambda i: ours(*bufs[i], 1e-30), nbuf)
                    row["skipkernel_noskip2_us"] = t_nat2 * 1e6
                    hm = [(qq, kk.permute(0, 2, 1, 3).contiguous(), vv.permute(0, 2, 1, 3).contiguous(), oo)
                          for qq, kk, vv, oo in bufs]
                    t_h, _ = time_graph(lambda i: ours(*hm[i], 0.0, head_major=1), nbuf)
                    ours(*hm[0], 0.0, head_major=1)
                    ours(q, k, v, o, 0.0)
                    row["headmajor_max_diff"] = (hm[0][3].float() - o.float()).abs().max().item()
                    row["dense_headmajor_tbs"] = kv_bytes / t_h / 1e12
                    del hm
                # Full runs: both orders on the target configurations, natural elsewhere (time).
                skip_rows(row, bufs, kv_bytes, nbuf, q, k, v, o, targets, t,
                          both_orders=QUICK or (hq, hk, L, B) in first[:5])
                peers = (("cudnn", SDPBackend.CUDNN_ATTENTION),) if QUICK else (
                    ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
                for name, be in peers:
                    time_peer(row, name, be, bufs, nbuf, kv_bytes)
                rows.append(row)
                print(json.dumps(row), flush=True)
                write_report(rows, dev, copy_bw)
                del bufs, q, k, v, o
                torch.cuda.empty_cache()
    copy_end = copy_bandwidth()
    print(f"copy bandwidth at the end {copy_end / 1e12:.2f} TB/s", flush=True)
    copy_bw = max(copy_bw, copy_end)
    print(write_report(rows, dev, copy_bw))


if __name__ == "__main__":
    variants_main() if VARIANTS else main()
