"""The markdown tables of a results.json (bench/model/recipe.py); no torch needed."""
import io
import math


TRAIN_CK = "train_s (checkpoint's run)"


def markdown(R):
    o = io.StringIO()
    p = R["phases"]
    o.write(f"# Model accuracy run ({'tiny, CPU' if R['tiny'] else R.get('gpu', R['device'])})\n\n")
    m = R["model"]
    o.write(f"Model: {m.get('n_params', 0) / 1e6:.2f} M params, d {m['d_model']}, {m['n_layers']} "
            f"layers, {m['n_heads']}/{m['n_kv_heads']} heads of {m['head_dim']}, vocab {m['vocab']}."
            f"\n\nCorpus: {R['corpus']['train_files']} train / {R['corpus']['heldout_files']} "
            f"held-out files; tokens {R['tokens']['train']} / {R['tokens']['heldout']} "
            f"({R['tokens']['bytes_per_token']:.2f} bytes/token).\n\n")
    tr = R.get("train", {})
    o.write(f"Training: {tr.get('steps')} steps, {tr.get('tokens')} tokens, "
            f"{p.get('train_s', p.get(TRAIN_CK, 0)):.0f} s, final train loss {tr.get('final_loss')}. Baselines on "
            f"held-out: unigram {R['baselines']['unigram_loss']:.3f}, bigram "
            f"{R['baselines']['bigram_loss']:.3f} nats/token.\n\n")
    o.write("Phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in p.items()) + "\n\n")
    o.write("| ctx | attention | order | lambda from | target | lambda | reachable | sparsity | loss "
            "| d loss | copy loss | copy sparsity |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    dense = {}
    for r in R["rows"]:
        if r["kind"] == "sdpa" and "loss" in r:
            dense[r["ctx"]] = r["loss"]
    if R.get("eval_only"):
        o.write(f"Eval-only run of the checkpoint in `{R.get('ckpt_dir')}` (token counts "
                f"{'match' if R.get('tokens_match_ckpt_run') else 'DO NOT match'} its run).\n\n")
    for r in R["rows"]:
        if r["mode"].startswith(("cal_", "dec_")):
            continue  # own sections below
        d = dense.get(r["ctx"])
        loss = r.get("loss")
        dl = f"{loss - d:+.4f}" if (loss is not None and d is not None) else ""
        ctxs = f"{r['ctx']}{' (beyond training)' if r.get('beyond_training') else ''}"
        err = f" ERROR {r['error']}" if "error" in r else ""
        if "lambdas" in r:
            lam = "geo-mean " + f"{math.exp(sum(math.log(x) for x in r['lambdas']) / len(r['lambdas'])):.2e}"
            reach = f"{sum(r['reachable'])}/{len(r['reachable'])} layers"
        elif "lambda" in r:
            lam, reach = f"{r['lambda']:.2e}", "yes" if r["reachable"] else "no"
        else:
            lam, reach = "-", "-"
        o.write(f"| {ctxs} | {r['kind']} | {r['order'] or '-'} | {r['mode']} | {r['target']} | "
                f"{lam} | {reach} | "
                f"{r.get('sparsity', 0):.3f} | {loss if loss is None else f'{loss:.4f}'} | {dl} | "
                f"{r.get('copy_loss', float('nan')):.4f} | {r.get('copy_sparsity', 0):.3f}{err} |\n")
    calibrated(o, R, dense)
    decode_section(o, R)
    a = R.get("attention_analysis")
    if a:
        o.write(f"\nSink mass (mean probability on key 0, held-out, L = {a['length']}): " +
                ", ".join(f"L{i} {l['sink_mass']:.3f}" for i, l in enumerate(a["layers"])) + "\n")
        if a["layers"] and a["layers"][0].get("bos_mass") is not None:
            o.write(f"\nMass on document starts (BOS keys, key 0 included; "
                    f"{a.get('bos_keys_per_seq', float('nan')):.1f} per sequence): " +
                    ", ".join(f"L{i} {l['bos_mass']:.3f}" for i, l in enumerate(a["layers"])) + "\n")
    if R["errors"]:
        o.write("\nErrors:\n" + "".join(f"- {e}\n" for e in R["errors"]))
    if R.get("notes"):
        o.write("\nNotes:\n" + "".join(f"- {e}\n" for e in R["notes"]))
    return o.getvalue()


def _flag_summary(flags):
    n = {}
    for fl in flags:
        for f in fl:
            k = f.split(" (")[0].split(":")[0]
            n[k] = n.get(k, 0) + 1
    return ", ".join(f"{k}: {v} layers" for k, v in n.items()) or "-"


def calibrated(o, R, dense):
    C = R.get("calibration")
    rows = [r for r in R["rows"] if r["mode"].startswith("cal_")]
    if not C and not rows:
        return
    if C:
        o.write(f"\n## Calibrated config (SPEC §6 per layer, phase {C['phase']}, {C['order']} order, "
                f"fitted over L = {C['lengths']} on training-split text, targets {C['targets']}; "
                f"one file `{C.get('config_file')}`, groups {C.get('config_groups')})\n\n"
                f"Fit: {C['fit']}. Forms: `cal_piecewise` = the file as blasst's loader resolves it "
                f"(the piecewise blasst extension wins), `cal_exp` = the interop a * exp(b * s) alone "
                f"(same order and vote). Tolerance: 0.03 below 8k, 0.02 from 8k on (SPEC §6).\n\n"
                "| layer | a | b | R^2 (log) | in-range targets | max sparsity at lambda<1 per L | "
                "inverse-law p per target |\n|---|---|---|---|---|---|---|\n")
        for i, f in enumerate(C["layers"] + [C.get("pooled") or {"error": "no pooled fit"}]):
            name = str(i) if i < len(C["layers"]) else "pooled"
            if "error" in f:
                o.write(f"| {name} | - | - | - | NOT FITTED: {f['error']} | | |\n")
                continue
            ms = ", ".join(f"{L}: {v:.3f}" for L, v in f["max_sparsity"].items())
            ps = ", ".join(f"{x['target']}: {x['p']:.2f}" for x in f["inverse_law"]
                           if x.get("p") is not None)
            o.write(f"| {name} | {f['a']:.4g} | {f['b']:.3f} | {f['r2']:.3f} | "
                    f"{f['range'][0]}-{f['range'][1]} | {ms} | {ps} |\n")
    if not rows:
        return
    o.write("\n| ctx | form | target | achieved | abs err | within | layers within | loss | d loss "
            "| copy loss | flags (layers) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        ctxs = f"{r['ctx']}{' (beyond training)' if r.get('beyond_training') else ''}"
        if "error" in r:
            o.write(f"| {ctxs} | {r['mode'][4:]} | {r['target']} | ERROR {r['error']} ||||||||\n")
            continue
        d = dense.get(r["ctx"])
        dl = f"{r['loss'] - d:+.4f}" if d is not None else ""
        o.write(f"| {ctxs} | {r['mode'][4:]} | {r['target']} | {r['sparsity']:.3f} | "
                f"{r['abs_error']:.3f} | {'yes' if r['within_tolerance'] else 'NO'} | "
                f"{r['layers_within_tolerance']}/{len(r['sparsity_per_layer'])} | {r['loss']:.4f} | "
                f"{dl} | {r['copy_loss']:.4f} | {_flag_summary(r.get('layer_flags', []))} |\n")
    pw = [r for r in rows if r["mode"] == "cal_piecewise" and "error" not in r]
    if pw:
        nl = len(pw[0]["sparsity_per_layer"])
        o.write("\nPer layer, achieved on held-out (calibration text in brackets), `cal_piecewise`; "
                "`*` = flagged (extrapolated target, lambda >= 1, or pooled fit):\n\n"
                "| ctx | target | " + " | ".join(f"L{i}" for i in range(nl)) + " |\n"
                + "|---" * (nl + 2) + "|\n")
        for r in pw:
            cs = r.get("calib_sparsity")
            cells = []
            for i, x in enumerate(r["sparsity_per_layer"]):
                c = f"{x:.3f}" + (f" ({cs[i]:.3f})" if cs else "")
                if r.get("layer_flags") and r["layer_flags"][i]:
                    c += "*"
                cells.append(c)
            o.write(f"| {r['ctx']} | {r['target']} | " + " | ".join(cells) + " |\n")
    # the issue-15 criterion, plainly
    o.write("\nWithin tolerance at every length (criterion of issue 15 / SPEC §6):\n\n")
    for form in ("cal_piecewise", "cal_exp"):
        fr = [r for r in rows if r["mode"] == form and "error" not in r]
        if not fr:
            continue
        for t in sorted({r["target"] for r in fr}):
            tr = [r for r in fr if r["target"] == t]
            bad = [f"{r['ctx']}: {r['sparsity']:.3f}" for r in tr if not r["within_tolerance"]]
            fl = any(any(x) for r in tr for x in r.get("layer_flags", []))
            o.write(f"- {form[4:]} target {t}: " + ("holds at every length" if not bad else
                    "does NOT hold at " + ", ".join(bad)) + (" (some layers flagged)" if fl else "")
                    + "\n")


def decode_section(o, R):
    rows = [r for r in R["rows"] if r["mode"].startswith("dec_")]
    if not rows:
        return
    ds = R.get("decode_setup", {})
    D = R.get("calibration_decode") or {}
    o.write(f"\n## Decode (teacher-forced: the last {ds.get('last_tokens')} tokens of each held-out "
            f"sequence attend through blasst.decode over the KV cache of their prefix, q_len "
            f"{ds.get('q_len')} per step; vote {D.get('vote')}, order {ds.get('order')}; loss over "
            "those tokens only; the calibrated config's decode phase, fitted over L = "
            f"{D.get('lengths')})\n\n")
    if D:
        o.write("| layer | a | b | R^2 (log) | in-range targets | max sparsity at lambda<1 per L |\n"
                "|---|---|---|---|---|---|\n")
        for i, f in enumerate(D["layers"] + [D.get("pooled") or {"error": "no pooled fit"}]):
            name = str(i) if i < len(D["layers"]) else "pooled"
            if "error" in f:
                o.write(f"| {name} | - | - | - | NOT FITTED: {f['error']} | |\n")
                continue
            ms = ", ".join(f"{L}: {v:.3f}" for L, v in f["max_sparsity"].items())
            o.write(f"| {name} | {f['a']:.4g} | {f['b']:.3f} | {f['r2']:.3f} | "
                    f"{f['range'][0]}-{f['range'][1]} | {ms} |\n")
        o.write("\n")
    o.write("| ctx | mode | target | achieved | abs err | within | layers within | loss | d loss "
            "(vs decode dense) | flags (layers) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    dd = {r["ctx"]: r["loss"] for r in rows if r["mode"] == "dec_dense" and "loss" in r}
    for r in rows:
        ctxs = f"{r['ctx']}{' (beyond training)' if r.get('beyond_training') else ''}"
        if "error" in r:
            o.write(f"| {ctxs} | {r['mode']} | {r['target']} | ERROR {r['error']} |||||||\n")
            continue
        if r["mode"] == "dec_dense":
            o.write(f"| {ctxs} | dense | - | 0.000 | | | | {r['loss']:.4f} | (torch SDPA on the same "
                    f"tokens: {r.get('sdpa_loss_same_tokens', float('nan')):.4f}) | |\n")
            continue
        d = dd.get(r["ctx"])
        dl = f"{r['loss'] - d:+.4f}" if d is not None else ""
        o.write(f"| {ctxs} | {r['mode'][4:]} | {r['target']} | {r['sparsity']:.3f} | "
                f"{r['abs_error']:.3f} | {'yes' if r['within_tolerance'] else 'NO'} | "
                f"{r['layers_within_tolerance']}/{len(r['sparsity_per_layer'])} | {r['loss']:.4f} | "
                f"{dl} | {_flag_summary(r.get('layer_flags', []))} |\n")
