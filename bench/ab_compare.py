#!/usr/bin/env python3
"""Before/after benchmark of two builds of the library in one process, on the same tensors.

Usage: ab_compare.py OLD_PREFILL_LIB NEW_PREFILL_LIB OLD_DECODE_LIB NEW_DECODE_LIB OUTDIR [--rounds N]

A restructuring that must leave speed unchanged (issue 13) is judged here: both builds' bench
libraries (bench/prefill/prefill_bench_lib.cpp, bench/decode/bench_capi.cpp, same C ABI) are
loaded side by side; every configuration is timed old, new, old, new, ... in the same rounds on the
same inputs (prefill: interleaved CUDA events, bench_prefill.interleaved_ms; decode: CUDA-graph
replays over rotating KV buffers, bench_decode.time_graph), and the table gives new / old time.
Each figure is repeated --rounds times (default 4; odd rounds time new before old) so the spread of
old against old shows the noise.
Workloads and lambdas come from the benchmark drivers themselves (one-pass curves of the NEW build:
the same lambda is then given to both builds, so both skip the same tiles if both are right; the
achieved sparsity of each build is reported beside the times).
"""
import ctypes
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "prefill"))
import bench_prefill as bp  # noqa: E402


def load_decode(path):
    lib = ctypes.CDLL(path)
    lib.bdb_last_error.restype = ctypes.c_char_p
    return lib


def decode_call(lib, q, k, v, o, lam, order=0, stats=None):
    vp = ctypes.c_void_p
    B, L, hk, d = k.shape
    st = (ctypes.c_int64 * 3)() if stats is not None else None
    rc = lib.bdb_decode(vp(q.data_ptr()), vp(k.data_ptr()), vp(v.data_ptr()), vp(o.data_ptr()), B, L, q.shape[2], hk,
                        d, 0, ctypes.c_double(lam), vp(torch.cuda.current_stream().cuda_stream), st, 0, order)
    if rc != 0:
        raise RuntimeError(lib.bdb_last_error().decode())
    if stats is not None:
        stats.extend([st[0], st[1]])


def prefill_rows(old, new, rounds, iters):
    rows = []
    bp.warm_up(new)
    # (workload, B, L, H, Hk, d, causal): the reference shapes (llm causal 32k, DiT full 32k)
    # and the d = 64 kernel.
    for kind, B, L, H, Hk, d, causal in (("llm", 1, 32768, 32, 32, 128, True),
                                         ("dit", 1, 32760, 40, 40, 128, False),
                                         ("llm", 1, 16384, 32, 32, 64, True)):
        q, k, v = bp.gen(kind, B, L, H, Hk, d, 1234 + L + d + int(causal), torch.bfloat16)
        o_old, o_new = bp.Ours(old, q, k, v, causal), bp.Ours(new, q, k, v, causal)
        cnt = o_new.counters(True)
        o_new(0.0, 1, cnt)
        torch.cuda.synchronize()
        curve = cnt[2].view(H, bp.HIST_SLOTS).sum(0).double()
        lams = {s: bp.lambda_for(curve, s)[0] for s in (0.5, 0.7)}
        names, pairs = [], []
        names.append("dense"); pairs.append((lambda o=o_old: o(), lambda o=o_new: o()))
        names.append("skip0"); pairs.append((lambda o=o_old: o(0.0, 1), lambda o=o_new: o(0.0, 1)))
        c_old, c_new = o_old.counters(True), o_new.counters(True)
        names.append("skip0_stats"); pairs.append((lambda o=o_old: o(0.0, 1, c_old), lambda o=o_new: o(0.0, 1, c_new)))
        achieved = {}
        for s, lam in lams.items():
            if lam is None:
                continue
            names.append(f"skip{int(s * 100)}")
            pairs.append((lambda o=o_old, lam=lam: o(lam), lambda o=o_new, lam=lam: o(lam)))
            for tag, o in (("old", o_old), ("new", o_new)):
                c2 = o.counters(False)
                o(lam, 0, c2)
                torch.cuda.synchronize()
                achieved[f"{tag}_{int(s * 100)}"] = c2[1].sum().item() / max(1, c2[0].sum().item())
        # outputs of both builds on the same inputs: dense must agree to the bit pattern's rounding
        o_old(); o_new(); torch.cuda.synchronize()
        dense_diff = (o_old.o.float() - o_new.o.float()).abs().max().item()
        # Odd rounds time each pair new-before-old: a figure's place in the interleaved sequence
        # moved it by up to 4 % with identical code (A/A run, bench/results/ab_AA_2026-12-01_cffbe2c.md).
        per_round = []
        for rd in range(rounds):
            fns = [f for pr in pairs for f in (pr if rd % 2 == 0 else pr[::-1])]
            t = bp.interleaved_ms(fns, iters, 3)
            per_round.append(t if rd % 2 == 0 else [x for i in range(0, len(t), 2) for x in (t[i + 1], t[i])])
        r = dict(workload=kind, L=L, H=H, d=d, mask="causal" if causal else "full", achieved=achieved,
                 dense_maxdiff_old_new=dense_diff, lambdas=lams, times={})
        for i, name in enumerate(names):
            olds = [pr[2 * i][0] for pr in per_round]
            news = [pr[2 * i + 1][0] for pr in per_round]
            r["times"][name] = dict(old_ms=olds, new_ms=news, ratio=statistics.median(news) / statistics.median(olds))
        rows.append(r)
        del q, k, v, o_old, o_new
        torch.cuda.empty_cache()
    return rows


def decode_rows(old, new, new_path, rounds):
    sys.argv = [sys.argv[0], new_path, "/tmp"]
    sys.path.insert(0, os.path.join(HERE, "decode"))
    import bench_decode as bd  # loads the NEW library as its LIB (bdb_lambdas comes from it)
    rows = []
    for B, L, hq, hk in ((1, 32768, 32, 8), (8, 32768, 32, 8), (64, 32768, 64, 8)):
        gen = torch.Generator(device="cuda").manual_seed(4321 + B)
        d = 128
        kv_bytes = 2 * B * L * hk * d * 2
        nbuf = max(2, min(8, int(6 * 60e6 // kv_bytes) + 1))
        bufs = []
        for _ in range(nbuf):
            k, v, u = bd.make_kv(B, L, hk, d, hq // hk, gen)
            q = bd.make_q(B, hq, hk, d, u, gen)
            bufs.append((q, k, v, torch.empty_like(q)))
        q, k, v, o = bufs[0]
        lams = dict(zip((0.5, 0.7), bd.lambdas_for(q, k, v, o, [0.5, 0.7])))
        r = dict(B=B, L=L, hq=hq, hk=hk, nbuf=nbuf, lambdas=lams, times={}, achieved={})
        for s, lam in lams.items():
            for tag, lib in (("old", old), ("new", new)):
                st = []
                decode_call(lib, q, k, v, o, lam, stats=st)
                r["achieved"][f"{tag}_{int(s * 100)}"] = st[0] / max(1, st[1])
        decode_call(old, q, k, v, o, 0.0); torch.cuda.synchronize(); o_old = o.float().clone()
        decode_call(new, q, k, v, o, 0.0); torch.cuda.synchronize()
        r["dense_maxdiff_old_new"] = (o.float() - o_old).abs().max().item()
        variants = [("dense", 0.0, 0)] + [(f"skip{int(s * 100)}", lam, 0) for s, lam in lams.items()] + \
                   [(f"maxfirst{int(s * 100)}", lam, 1) for s, lam in lams.items()]
        for name, lam, order in variants:
            olds, news = [], []
            for rd in range(rounds):
                order_ = ((old, olds), (new, news))
                for lib, acc in (order_ if rd % 2 == 0 else order_[::-1]):
                    t, _ = bd.time_graph(lambda i, lib=lib: decode_call(lib, *bufs[i], lam, order), nbuf)
                    acc.append(t * 1e6)
            r["times"][name] = dict(old_us=olds, new_us=news, ratio=statistics.median(news) / statistics.median(olds))
        rows.append(r)
        del bufs, q, k, v, o
        torch.cuda.empty_cache()
    return rows


def main():
    old_p, new_p, old_d, new_d, out = sys.argv[1:6]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 4
    os.makedirs(out, exist_ok=True)
    res = dict(gpu=torch.cuda.get_device_name(), commit_old=os.environ.get("AB_OLD", "?"),
               commit_new=os.environ.get("AB_NEW", "?"))
    res["prefill"] = prefill_rows(bp.load_lib(old_p), bp.load_lib(new_p), rounds, 20)
    res["decode"] = decode_rows(load_decode(old_d), load_decode(new_d), new_d, rounds)
    with open(os.path.join(out, "ab_compare.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    lines = [f"# before/after ({res['commit_old']} -> {res['commit_new']}) on {res['gpu']}: new/old time "
             "(<1 = new faster); old and new ms/us per round", ""]
    for r in res["prefill"]:
        lines.append(f"prefill {r['workload']} L={r['L']} H={r['H']} d={r['d']} {r['mask']}: "
                     f"dense maxdiff {r['dense_maxdiff_old_new']:.2e}, achieved {r['achieved']}")
        for name, t in r["times"].items():
            lines.append(f"  {name:12s} ratio {t['ratio']:.4f}  old {['%.3f' % x for x in t['old_ms']]} "
                         f"new {['%.3f' % x for x in t['new_ms']]}")
    for r in res["decode"]:
        lines.append(f"decode B={r['B']} L={r['L']} {r['hq']}/{r['hk']}: dense maxdiff "
                     f"{r['dense_maxdiff_old_new']:.2e}, achieved {r['achieved']}")
        for name, t in r["times"].items():
            lines.append(f"  {name:12s} ratio {t['ratio']:.4f}  old {['%.1f' % x for x in t['old_us']]} "
                         f"new {['%.1f' % x for x in t['new_us']]}")
    with open(os.path.join(out, "ab_compare.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
