#!/usr/bin/env python3
"""Eager calls through the Python API (issue 18): host overhead per call, and decode eager vs
CUDA graph against torch SDPA (cuDNN, flash) on the same tensors.

Usage: bench_eager.py OUTDIR [--quick]

1. Host overhead: tiny inputs (B 1, q_len 1, Hq 32 / Hk 8, d 128, 256 keys, bf16; attention with
   Lq 1) so that the GPU keeps up and the time per call is the host's. Each method is called N
   times back to back, then the stream is synchronised; the figure is wall time / N (median of 5
   such runs). Also the pieces of a call's Python side, each timed alone.
2. Decode at B = 1, 8, 64 and kv 8k, 32k, 128k (bf16, 32/8 heads, d 128, contiguous [B, L, Hk, d]
   caches): each method timed eagerly (N calls between two CUDA events) and as a CUDA graph of one
   call per rotating buffer (cold L2), median of the repetitions; blasst.DecodePlan.run eagerly
   (one plan per buffer). TB/s counts the K+V bytes.
Writes OUTDIR/eager_<date>_<commit>.{json,md}; the commit comes from BLASST_COMMIT or `git`.
"""
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import blasst

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
QUICK = "--quick" in sys.argv
DEV = torch.device("cuda")
BF16 = torch.bfloat16


def commit():
    c = os.environ.get("BLASST_COMMIT")
    if c:
        return c
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001 - a tree without git
        return "unknown"


def host_us(fn, n=2000, runs=5):
    """Median over `runs` of wall time / n for n back-to-back calls (then a synchronisation)."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(per)


def host_rows():
    B, L, hq, hk, d = 1, 256, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(B, 1, hq, d, device=DEV, dtype=BF16, generator=g)
    k = torch.randn(B, L, hk, d, device=DEV, dtype=BF16, generator=g)
    v = torch.randn(B, L, hk, d, device=DEV, dtype=BF16, generator=g)
    skip = blasst.SkipSoftmax(threshold=1e-3)
    rows = []

    def add(name, fn, **kw):
        try:
            us = host_us(fn, **kw)
            rows.append({"call": name, "us": us})
        except Exception as e:  # noqa: BLE001 - a peer unavailable here
            rows.append({"call": name, "us": None, "err": str(e).splitlines()[0][:160]})
        print(json.dumps(rows[-1]), flush=True)

    add("blasst.decode dense", lambda: blasst.decode(q, k, v))
    add("blasst.decode skip (one SkipSoftmax reused)", lambda: blasst.decode(q, k, v, skip=skip))
    add("blasst.decode skip (new SkipSoftmax per call)",
        lambda: blasst.decode(q, k, v, skip=blasst.SkipSoftmax(threshold=1e-3)))
    add("blasst.decode dense, return_lse", lambda: blasst.decode(q, k, v, return_lse=True))
    # blasst.DecodePlan (issue 18's plan / run): planned once, run per call; out new or given.
    plan = blasst.DecodePlan(q, k, v)
    plan_skip = blasst.DecodePlan(q, k, v, skip=skip)
    plan_out = torch.empty_like(q)
    add("blasst.DecodePlan.run dense", lambda: plan.run(q))
    add("blasst.DecodePlan.run dense, out given", lambda: plan.run(q, out=plan_out))
    add("blasst.DecodePlan.run skip", lambda: plan_skip.run(q))
    add("blasst.attention dense (Lq 1)", lambda: blasst.attention(q, k, v))
    add("blasst.attention skip (Lq 1)", lambda: blasst.attention(q, k, v, skip=skip))
    add("blasst.attention causal (Lq 1)", lambda: blasst.attention(q, k, v, causal=True))
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        with sdpa_kernel(be):
            add(f"torch SDPA {name}", lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
    # CUDA graph replay of one blasst.decode call (the kernel path without any host work per call).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        blasst.decode(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        blasst.decode(q, k, v)
    add("CUDA graph replay of blasst.decode", graph.replay)
    # Pieces of the Python side, each alone.
    import torch.utils.dlpack as tdl
    add("piece: torch.empty (cuda, out)", lambda: torch.empty((B, 1, hq, d), dtype=BF16, device=DEV))
    add("piece: q.new_empty(shape)", lambda: q.new_empty((B, 1, hq, d)))
    add("piece: torch.empty_like(q)", lambda: torch.empty_like(q))
    add("piece: q.new_empty(lse shape, dtype=float32)", lambda: q.new_empty((B, hq, 1), dtype=torch.float32))
    add("piece: to_dlpack(x.detach())", lambda: tdl.to_dlpack(q.detach()))
    add("piece: torch._C._to_dlpack(x)", lambda: torch._C._to_dlpack(q))
    add("piece: torch._C._cuda_getCurrentRawStream(i)", lambda: torch._C._cuda_getCurrentRawStream(0))
    add("piece: torch.cuda.current_stream(dev).cuda_stream",
        lambda: torch.cuda.current_stream(q.device).cuda_stream)
    add("piece: torch.cuda.current_device()", torch.cuda.current_device)
    add("piece: torch.compiler.is_compiling()", torch.compiler.is_compiling)
    core = blasst._calls._core
    out = torch.empty((B, 1, hq, d), dtype=BF16, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    add("piece: _core.decode, its 4 to_dlpack exports, no wrapper",
        lambda: core.decode(tdl.to_dlpack(q), tdl.to_dlpack(k), tdl.to_dlpack(v), tdl.to_dlpack(out),
                            None, None, None, 0, True, None, None, stream, None, False, False, 0))
    cfg = skip._cfg
    add("piece: _core.decode skip, 4 exports, no wrapper",
        lambda: core.decode(tdl.to_dlpack(q), tdl.to_dlpack(k), tdl.to_dlpack(v), tdl.to_dlpack(out),
                            None, None, None, 0, True, None, cfg, stream, None, False, False, 0))
    add("piece: torch.is_grad_enabled() + requires_grad x3",
        lambda: torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    return rows


def eager_and_graph(fn_per_buf, nbuf, reps, graph=True):
    """(eager s/call, graph s/call): eager = nbuf * reps calls between two events; graph = replays
    of a graph holding one call per buffer (None when graph is False); medians over repetitions."""
    for i in range(nbuf):
        fn_per_buf(i)
    torch.cuda.synchronize()
    eager = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(nbuf):
            fn_per_buf(i)
        b.record()
        b.synchronize()
        eager.append(a.elapsed_time(b) / 1e3 / nbuf)
    if not graph:
        return statistics.median(eager), None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(nbuf):
            fn_per_buf(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(nbuf):
            fn_per_buf(i)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    gr = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        gr.append(a.elapsed_time(b) / 1e3 / nbuf)
    del graph
    return statistics.median(eager), statistics.median(gr)


def decode_rows():
    hq, hk, d = 32, 8, 128
    shapes = [(1, 32768), (8, 32768), (64, 32768)] if QUICK else [
        (B, L) for B in (1, 8, 64) for L in (8192, 32768, 131072)]
    rows = []
    for B, L in shapes:
        kv_bytes = 2 * B * L * hk * d * 2
        nbuf = max(1, min(8, -(-4 * 64 * 2**20 // kv_bytes)))  # >= 4x the 60 MB L2 over the buffers
        reps = 30 if kv_bytes < 2**30 else 10
        g = torch.Generator(device="cuda").manual_seed(B * 131 + L)
        try:
            bufs = [(torch.randn(B, 1, hq, d, device=DEV, dtype=BF16, generator=g),
                     torch.empty(B, L, hk, d, device=DEV, dtype=BF16).normal_(generator=g),
                     torch.empty(B, L, hk, d, device=DEV, dtype=BF16).normal_(generator=g))
                    for _ in range(nbuf)]
        except torch.OutOfMemoryError:
            rows.append({"B": B, "kv": L, "err": "out of memory"})
            continue
        row = {"B": B, "kv": L, "nbuf": nbuf}
        e, gr = eager_and_graph(lambda i: blasst.decode(*bufs[i]), nbuf, reps)
        row.update(blasst_eager_us=e * 1e6, blasst_graph_us=gr * 1e6,
                   blasst_eager_tbs=kv_bytes / e / 1e12, blasst_graph_tbs=kv_bytes / gr / 1e12)
        # blasst.DecodePlan (issue 18's plan / run): one plan per buffer, made before the timing;
        # eager only (its graph would replay the same kernel as blasst.decode's)
        plans = [blasst.DecodePlan(*b) for b in bufs]
        e, _ = eager_and_graph(lambda i: plans[i].run(bufs[i][0]), nbuf, reps, graph=False)
        row.update(plan_eager_us=e * 1e6, plan_eager_tbs=kv_bytes / e / 1e12)
        plans.clear()  # before the buffers go: a plan holds its caches
        views = [(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) for q, k, v in bufs]
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    e, gr = eager_and_graph(
                        lambda i: F.scaled_dot_product_attention(*views[i], enable_gqa=True), nbuf, reps)
                row.update({f"{name}_eager_us": e * 1e6, f"{name}_graph_us": gr * 1e6,
                            f"{name}_eager_tbs": kv_bytes / e / 1e12, f"{name}_graph_tbs": kv_bytes / gr / 1e12})
            except Exception as ex:  # noqa: BLE001 - backend unavailable for this shape
                row[f"{name}_err"] = str(ex).splitlines()[0][:160]
        rows.append(row)
        print(json.dumps(row), flush=True)
        bufs = views = None  # freed before empty_cache
        torch.cuda.empty_cache()
    return rows


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def main():
    os.makedirs(OUT, exist_ok=True)
    c = commit()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    host = host_rows()
    dec = decode_rows()
    base = os.path.join(OUT, f"eager_{date}_{c}{'_quick' if QUICK else ''}")
    meta = {"commit": c, "date": date, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "host": host, "decode": dec}
    with open(base + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    lines = [f"# Eager calls, {meta['gpu']}, torch {meta['torch']}, commit {c}, {date}", "",
             "## Host overhead per call (tiny inputs; us)", "", "| call | us |", "|---|---|"]
    lines += [f"| {r['call']} | {fmt(r['us'])} |" for r in host]
    lines += ["", "## Decode, bf16, 32/8 heads, d 128: eager and CUDA graph (us, TB/s of K+V)", "",
              "| B | kv | blasst eager | DecodePlan.run eager | blasst graph | cuDNN eager | cuDNN graph | flash eager |"
              " flash graph | blasst/cuDNN (graph) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in dec:
        if "err" in r:
            lines.append(f"| {r['B']} | {r['kv']} | {r['err']} | | | | | | | |")
            continue

        def cell(n):
            us, tbs = r.get(f"{n}_us"), r.get(f"{n}_tbs")
            return "-" if us is None else f"{us:.1f} ({tbs:.2f})"
        ratio = (r["cudnn_graph_us"] / r["blasst_graph_us"]) if r.get("cudnn_graph_us") else None
        lines.append(f"| {r['B']} | {r['kv']} | {cell('blasst_eager')} | {cell('plan_eager')} | {cell('blasst_graph')} | "
                     f"{cell('cudnn_eager')} | {cell('cudnn_graph')} | {cell('flash_eager')} | "
                     f"{cell('flash_graph')} | {fmt(ratio, '.3f')} |")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
