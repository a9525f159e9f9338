#!/usr/bin/env python3
"""Per-CTA timeline of the decode kernel: where the seed prologue's time goes.

Usage: trace_decode.py LIB.so OUTDIR   (LIB.so from a build with the CMake option BLASST_DECODE_TRACE=ON,
which compiles the probes in; the trace file is named by the BLASST_DECODE_TRACE environment variable)

For B = 1 and 8 (L = 32k, 32/8, bf16, random inputs) and each variant - the skip kernel with
nothing skipped (lambda 1e-30) in natural order and seeded (max-first) - a few single calls are
traced after warm-up calls. (The seed-prologue probes of session 4 were retired with issue 13.) Each
CTA's thread 0 stamps the global timer at: 0 start, 1 Q requested and the first K tiles issued,
2 Q staged, 3 prologue done, 4 first vote, 5 loop done, 6 partials written. The table gives, in
microseconds, means over CTAs and calls (and the latest CTA for the end), measured from the
earliest start of each call.
Single synchronised calls: absolute times are longer than in the graph-timed benchmark.
"""
import ctypes
import os
import statistics
import sys

import torch

LIB = ctypes.CDLL(sys.argv[1])
OUT = sys.argv[2]
LIB.bdb_last_error.restype = ctypes.c_char_p
vp = ctypes.c_void_p
TRACE = os.path.join(OUT, "decode_trace.csv")


def call(q, k, v, o, lam, order):
    B, L, hk, d = k.shape
    rc = LIB.bdb_decode(vp(q.data_ptr()), vp(k.data_ptr()), vp(v.data_ptr()), vp(o.data_ptr()), B, L, q.shape[2], hk,
                        d, 0, ctypes.c_double(lam), vp(torch.cuda.current_stream().cuda_stream), None, 0, order)
    if rc != 0:
        raise RuntimeError(LIB.bdb_last_error().decode())


def main():
    if os.path.exists(TRACE):
        os.remove(TRACE)
    variants = [("natural", 0), ("seeded", 1)]
    calls = 6
    for B in (1, 8):
        L, hq, hk, d = 32768, 32, 8, 128
        q = torch.randn(B, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, hk, d, device="cuda", dtype=torch.bfloat16)
        o = torch.empty(B, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        for rnd in range(calls):  # variants interleaved call by call
            for name, order in variants:
                for _ in range(3):  # warm-up (clocks, L2 state of a running workload)
                    call(q, k, v, o, 1e-30, order)
                os.environ["BLASST_DECODE_TRACE"] = TRACE
                os.environ["BLASST_DECODE_TRACE_TAG"] = f"{name}:{B}:{rnd}"
                call(q, k, v, o, 1e-30, order)
                del os.environ["BLASST_DECODE_TRACE"], os.environ["BLASST_DECODE_TRACE_TAG"]
        torch.cuda.synchronize()

    rows = {}
    with open(TRACE) as f:
        for line in f:
            parts = line.strip().split(",")
            tag, g = parts[0], [int(x) for x in parts[5:]]
            if g[6] == 0:  # an empty split (past its sequence's end)
                continue
            rows.setdefault(tag, []).append(g)
    lines = ["# decode kernel timeline (us from the call's earliest CTA start; means over CTAs, then over calls)", "",
             "| variant | B | start | first loads | Q staged | prologue done | first vote | loop done | end (mean) | "
             "end (last CTA) | prologue | calls |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for tag, ctas in rows.items():
        name, B, _ = tag.split(":")
        t0 = min(c[0] for c in ctas)
        pts = [statistics.mean((c[i] - t0) / 1e3 for c in ctas) for i in range(7)]
        last = max(c[6] - t0 for c in ctas) / 1e3
        pro = statistics.mean((c[3] - c[2]) / 1e3 for c in ctas)
        summary.setdefault((name, int(B)), []).append(pts + [last, pro])
    for (name, B), runs in sorted(summary.items(), key=lambda x: (x[0][1], x[0][0])):
        m = [statistics.median(r[i] for r in runs) for i in range(9)]
        lines.append(f"| {name} | {B} | " + " | ".join(f"{x:.2f}" for x in m) + f" | {len(runs)} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "decode_trace.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
