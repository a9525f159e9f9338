#!/usr/bin/env python3
"""Turn a results.json of bench/model/recipe.py into bench/results/model_<name>.md and PNG plots
(run locally; matplotlib is optional: without it only the markdown is written).

    python bench/model/report.py RESULTS.json --name 2026-12-02_<commit> [--outdir bench/results]

Plots: loss increase vs achieved sparsity (per context, order and lambda mode), achieved vs
target sparsity per context for the calibrated config (both forms, per layer), the training loss
curve, sink mass per layer, attention mass by distance per layer."""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--name", required=True)
    ap.add_argument("--outdir", default=os.path.join(os.path.dirname(__file__), "..", "results"))
    a = ap.parse_args(argv)
    with open(a.results) as f:
        R = json.load(f)
    from tables import markdown
    os.makedirs(a.outdir, exist_ok=True)
    base = os.path.join(a.outdir, f"model_{a.name}")
    md = markdown(R)
    pngs = []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
        md += "\n(matplotlib not installed: no plots)\n"
    if plt is not None:
        ctxs = sorted({r["ctx"] for r in R["rows"]})
        fig, axes = plt.subplots(2, len(ctxs), figsize=(4.5 * len(ctxs), 7), squeeze=False)
        for j, L in enumerate(ctxs):
            for i, key in enumerate(("loss", "copy_loss")):
                ax = axes[i][j]
                ref = next((r[key] for r in R["rows"] if r["ctx"] == L and r["kind"] == "sdpa"
                            and key in r), None)
                for order, mk in (("natural", "o"), ("max_first", "s")):
                    for mode, ls in (("per_layer", "-"), ("fixed", "--"), ("cal_piecewise", ":")):
                        pts = sorted((r.get("sparsity" if key == "loss" else "copy_sparsity", 0),
                                      r[key] - ref) for r in R["rows"]
                                     if r["ctx"] == L and r["order"] == order and r["mode"] == mode
                                     and key in r and ref is not None)
                        if pts:
                            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker=mk,
                                    label=f"{order}, {mode}")
                ax.axhline(0, color="k", lw=0.5)
                ax.set_xlabel("achieved sparsity")
                ax.set_ylabel(f"{key} - dense (nats/token)")
                ax.set_title(f"L = {L}{' (beyond training)' if L > R['params']['ctx'] else ''}")
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        p = base + "_loss_vs_sparsity.png"
        fig.savefig(p, dpi=110)
        pngs.append(p)
        plt.close(fig)

        cal = [r for r in R["rows"] if r["mode"].startswith("cal_") and "sparsity" in r]
        if cal:  # achieved vs target per context for the one calibrated config
            cctx = sorted({r["ctx"] for r in cal})
            fig, axes = plt.subplots(1, len(cctx), figsize=(4 * len(cctx), 4), squeeze=False)
            for j, L in enumerate(cctx):
                ax = axes[0][j]
                tol = 0.02 if L >= 8192 else 0.03
                ax.plot([0, 1], [0, 1], "k-", lw=0.6)
                ax.fill_between([0, 1], [-tol, 1 - tol], [tol, 1 + tol], color="g", alpha=0.15,
                                label=f"+-{tol}")
                for form, ls, mk in (("cal_piecewise", "-", "o"), ("cal_exp", "--", "s")):
                    pts = sorted((r["target"], r["sparsity"], r.get("sparsity_per_layer", []),
                                  r.get("layer_flags", [])) for r in cal
                                 if r["ctx"] == L and r["mode"] == form)
                    if not pts:
                        continue
                    ax.plot([p_[0] for p_ in pts], [p_[1] for p_ in pts], ls, marker=mk,
                            label=f"{form[4:]} (all layers)")
                    if form == "cal_piecewise":
                        for t, _, pl, fl in pts:
                            for i, x in enumerate(pl):
                                bad = bool(fl and fl[i])
                                ax.plot(t + 0.008 * (i - len(pl) / 2), x, "x" if bad else ".",
                                        color="r" if bad else "0.4", ms=4)
                beyond = any(r.get("beyond_training") for r in cal if r["ctx"] == L)
                ax.set_title(f"L = {L}{' (beyond training)' if beyond else ''}")
                ax.set_xlabel("target sparsity")
                ax.set_ylabel("achieved (held-out; dots: layers, x: flagged)")
                ax.set_xlim(0, 1)
                ax.set_ylim(0, 1)
                ax.grid(alpha=0.3)
            axes[0][0].legend(fontsize=7)
            fig.tight_layout()
            p = base + "_calibrated_achieved_vs_target.png"
            fig.savefig(p, dpi=110)
            pngs.append(p)
            plt.close(fig)

        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        c = R.get("train", {}).get("curve", [])
        if c:
            axes[0].plot([x["tokens"] / 1e6 for x in c], [x["loss"] for x in c])
            for k, v in R["baselines"].items():
                axes[0].axhline(v, ls=":", label=k)
            axes[0].set_xlabel("training tokens (M)")
            axes[0].set_ylabel("train loss")
            axes[0].legend()
        an = R.get("attention_analysis")
        if an:
            ls_ = an["layers"]
            axes[1].bar(range(len(ls_)), [l["sink_mass"] for l in ls_])
            axes[1].set_xlabel("layer")
            axes[1].set_ylabel("mean attention on key 0")
            for i, l in enumerate(ls_):
                m = l["mass_by_tile_distance"]
                axes[2].semilogy(range(len(m)), [max(x, 1e-9) for x in m], label=f"L{i}")
            axes[2].set_xlabel(f"query tile - key tile (tiles of {R['params']['tile']} keys), "
                               f"L = {an['length']}")
            axes[2].set_ylabel("attention mass")
            axes[2].legend(fontsize=7)
        fig.tight_layout()
        p = base + "_training_attention.png"
        fig.savefig(p, dpi=110)
        pngs.append(p)
        plt.close(fig)
        md += "\n" + "".join(f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in pngs)
    an = R.get("attention_analysis")
    if an:
        md += "\nAttention mass by log2 distance bucket (0: the diagonal, k: distance in " \
              "[2^(k-1), 2^k)):\n\n| layer | " + " | ".join(
                  str(k) for k in range(len(an["layers"][0]["mass_by_log2_distance"]))) + " |\n"
        md += "|---" * (1 + len(an["layers"][0]["mass_by_log2_distance"])) + "|\n"
        for i, l in enumerate(an["layers"]):
            md += f"| {i} | " + " | ".join(f"{x:.3f}" for x in l["mass_by_log2_distance"]) + " |\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    print(base + ".md", *pngs)


if __name__ == "__main__":
    sys.exit(main())
