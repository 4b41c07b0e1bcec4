#!/usr/bin/env python
"""Per-layer SRR and the objective ledger of a trained CRATE language model against its random initialisation.

    python recipes/train_crate_lm.py --output-dir runs/crate_lm ...              # first: the training run
    python recipes/fig_crate_lm_diagnostics.py --run-dir runs/crate_lm --output-dir docs/figures

Reads ``<run-dir>/crate-clm`` (trained) and ``<run-dir>/crate-clm-init`` (the same model before its first step),
both written by ``recipes/train_crate_lm.py``, and measures both on the first ``--samples`` validation blocks of that
run (the held-out documentation topics, cut as the run cut them): :func:`hf_tdiag.layer_srr` (per block, CRATE's own
``U``, causal model, every token real) and :func:`hf_tdiag.objective_ledger` (MSSA's ``Rᶜ``, the LASSO objective of
each of CRATE-LM's two ISTA steps), and the density of each block's sparse code. Writes ``crate_lm_srr.png``, ``crate_lm_ledger.png`` and
``crate_lm_diagnostics.json`` into ``--output-dir``; an earlier run's files there are kept unless
``--overwrite-output-dir`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

OUTPUTS = ["crate_lm_srr.png", "crate_lm_ledger.png", "crate_lm_diagnostics.json"]


def validation_batch(run_dir: str, tokenizer, samples: int) -> dict:
    """``{"input_ids", "attention_mask"}``: the first ``samples`` validation blocks of the run in ``run_dir``."""
    import torch

    from hf_tdiag.text_corpus import corpus, token_blocks

    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as fh:
        settings = json.load(fh)["settings"]
    _, val = corpus(settings["val_every"], settings["max_train_topics"])
    ids = token_blocks(tokenizer, list(val.values()), settings["block_size"])[:samples]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def code_density(model, batch: dict) -> list[float]:
    """Per block, the fraction of nonzero entries of the sparse code the block's ISTA computes (the last iterate;
    CRATE-LM's block outputs the decoded, dense ``D z``, so the SRR's sparsity term of ``Z^l`` does not see it)."""
    import torch

    with torch.no_grad():
        mids = model.crate(**batch, output_mid_hidden_states=True).mid_hidden_states
        out = []
        for layer, mid in zip(model.crate.layer, mids):
            code = layer.ista.sparse_code(layer.layernorm_after(mid))
            out.append(float((code != 0).double().mean()))
    return out


def plot_ledgers(reports: dict, title: str):
    """One panel per report: each step's relative change of its objective per block (hatched: it increased)."""
    from hf_tdiag.diagnostics.objective_ledger import OBJECTIVES
    from hf_tdiag.viz import new_figure

    fig = new_figure(5.2 * len(reports), 3.8)
    axes = [fig.subplots(1, len(reports), sharey=True, squeeze=False)[0]]
    for ax, (name, report) in zip(axes[0], reports.items()):
        names = list(dict.fromkeys(s.step for s in report.steps))
        width = 0.8 / len(names)
        for j, step in enumerate(names):
            rows = [s for s in report.steps if s.step == step]
            xs = [s.layer + (j - (len(names) - 1) / 2) * width for s in rows]
            bars = ax.bar(xs, [s.relative_change for s in rows], width, label=f"{step} ({OBJECTIVES[step]})",
                          color=f"C{j}")  # fmt: skip
            for bar, s in zip(bars, rows):
                if s.increased:
                    bar.set_hatch("//")
                    bar.set_edgecolor("black")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(1, report.num_layers + 1))
        ax.set_xlabel("block")
        ax.set_title(name)
    axes[0][0].set_ylabel("(after − before) / before")
    axes[0][0].legend(fontsize="small")
    fig.suptitle(title)
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", "--run_dir", dest="run_dir", required=True, help="a train_crate_lm.py run")
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default="figures_out")
    parser.add_argument("--model", default="crate-clm", help="model folder of the run (its -init folder beside it)")
    parser.add_argument("--samples", type=int, default=64, help="validation blocks measured")
    from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir

    add_overwrite_flag(parser)
    args = parser.parse_args(argv)
    if args.samples <= 0:
        raise SystemExit(f"--samples must be positive, got {args.samples}")
    folders = {"trained": os.path.join(args.run_dir, args.model), "random init": os.path.join(args.run_dir,
               f"{args.model}-init")}  # fmt: skip
    try:
        claim_output_dir(args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir, inputs=[args.run_dir])
    except OutputExistsError as err:
        print(f"fig_crate_lm_diagnostics: {err}", file=sys.stderr)
        return 1

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_tdiag
    from hf_tdiag._atomic import write_json
    from hf_tdiag.viz import save_figure

    tokenizer = AutoTokenizer.from_pretrained(folders["trained"])
    batch = validation_batch(args.run_dir, tokenizer, args.samples)
    srr, ledgers, density = {}, {}, {}
    for name, folder in folders.items():
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        srr[name] = hf_tdiag.layer_srr(model, batch, progress=False)
        ledgers[name] = hf_tdiag.objective_ledger(model, batch)
        density[name] = code_density(model, batch)
    n, length = batch["input_ids"].shape
    what = f"{args.model}, {n} held-out blocks of {length} tokens"
    save_figure(hf_tdiag.viz.plot_layer_srr(srr, title=f"Per-layer SRR terms: {what}"),
                os.path.join(args.output_dir, OUTPUTS[0]), dpi=100)  # fmt: skip
    save_figure(plot_ledgers(ledgers, f"Objective ledger: {what} (hatched: the step increased its objective)"),
                os.path.join(args.output_dir, OUTPUTS[1]), dpi=100)  # fmt: skip
    data = {
        "command": " ".join(
            ["python", "recipes/fig_crate_lm_diagnostics.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "inputs": what,
        "srr": {name: r.to_dict() for name, r in srr.items()},
        "ledger": {name: r.to_dict() for name, r in ledgers.items()},
        "code_density": density,
    }
    write_json(os.path.join(args.output_dir, OUTPUTS[2]), data)
    for name in folders:
        out = srr[name].mean["output"]
        print(f"{name:12s} SRR per block {[round(v, 3) for v in out['srr']]}  Rc {[round(v, 3) for v in out['Rc']]}"
              f"  code density {[round(v, 3) for v in density[name]]}")  # fmt: skip
        for s in ledgers[name].steps:
            print(
                f"  block {s.layer} {s.step:7s} {s.before:10.4g} -> {s.after:10.4g}{'  INCREASES' if s.increased else ''}"
            )
    print("wrote " + ", ".join(os.path.join(args.output_dir, o) for o in OUTPUTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
