"""The markdown tables of a results.json (bench/model/recipe.py); no torch needed."""
import io
import math


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
            f"{p.get('train_s', 0):.0f} s, final train loss {tr.get('final_loss')}. Baselines on "
            f"held-out: unigram {R['baselines']['unigram_loss']:.3f}, bigram "
            f"{R['baselines']['bigram_loss']:.3f} nats/token.\n\n")
    o.write("Phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in p.items()) + "\n\n")
    o.write("| ctx | attention | order | lambda from | target | lambda | reachable | sparsity | loss "
            "| d loss | copy loss | copy sparsity |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    dense = {}
    for r in R["rows"]:
        if r["kind"] == "sdpa" and "loss" in r:
            dense[r["ctx"]] = r["loss"]
    for r in R["rows"]:
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
    a = R.get("attention_analysis")
    if a:
        o.write(f"\nSink mass (mean probability on key 0, held-out, L = {a['length']}): " +
                ", ".join(f"L{i} {l['sink_mass']:.3f}" for i, l in enumerate(a["layers"])) + "\n")
    if R["errors"]:
        o.write("\nErrors:\n" + "".join(f"- {e}\n" for e in R["errors"]))
    return o.getvalue()
