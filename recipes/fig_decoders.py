"""README figure for decoder LLMs: SRR per layer by source on a Llama-style GQA decoder, and streaming memory.

Left: ``Rᶜ`` per subspace (``Rᶜ / K``) per layer of a small Llama-style decoder (8 query heads, 2 K/V heads, random
weights, built from a config and saved sharded) on right-padded random token ids, for ``source`` = query (K = 8
subspaces) and key / value (K = 2 shared subspaces). Right: peak resident memory of
``schatten_bounds(path, streaming=True)`` against the in-memory path, from the benchmark's JSON
(``benchmarks/bench_schatten.py --streaming``), with the largest layer's weights and the fixed overhead.

    python recipes/fig_decoders.py [--output-dir docs/figures] [--overwrite-output-dir]

-> decoders.png, decoders.json. A folder already holding them is refused before any work (exit status 1) unless
``--overwrite-output-dir`` is given, which replaces them (:func:`hf_tdiag._outputs.claim_output_dir`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_tdiag
from hf_tdiag._outputs import OutputExistsError, add_overwrite_flag, claim_output_dir

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "benchmarks", "results", "bench_schatten_streaming_cpu.json")


def srr_by_source(folder: str) -> dict:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=344,
        max_position_embeddings=128,
    )
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # weights of std 0.3 instead of the 0.02 init: projections well away from zero
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                p.normal_(0, 0.3)
    model.save_pretrained(folder, max_shard_size="500KB")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, 256, (16, 48))
    mask = torch.ones_like(ids)
    for b in range(16):
        mask[b, 24 + b :] = 0  # right padding: 24 … 39 real tokens
    out = {}
    for source in ("query", "key", "value"):
        rep = hf_tdiag.layer_srr(model, {"input_ids": ids, "attention_mask": mask}, source=source, progress=False)
        K = rep.settings["num_subspaces"]
        out[source] = {"K": K, "Rc_per_subspace": [v / K for v in rep.per_layer("Rc")], "R": rep.per_layer("R")}
    return out


def figure(srr: dict, bench: dict | None) -> Figure:
    fig = Figure(figsize=(10, 3.6))
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    layers = range(1, len(srr["query"]["R"]) + 1)
    for source, style in (("query", "o-"), ("key", "s--"), ("value", "^:")):
        ax.plot(layers, srr[source]["Rc_per_subspace"], style, label=f"Rᶜ / K, {source} (K = {srr[source]['K']})")
    ax.set_xlabel("layer ℓ (output Z^ℓ of block ℓ)")
    ax.set_ylabel("nats")
    ax.set_title("Llama-style, 8 Q / 2 KV heads (random weights)", fontsize=9)
    ax.legend(fontsize=7)
    if bench is None:
        bx.text(0.5, 0.5, "run benchmarks/bench_schatten.py --streaming", ha="center", va="center")
        bx.set_axis_off()
        return fig
    mib = 2**20
    default, tuned = bench["allocators"]["glibc_default"], bench["allocators"]["mmap_threshold_128k"]
    names = [
        "fixed\noverhead",
        "streaming\n(glibc default)",
        "streaming\n(mmap thr. 128k)",
        "in memory\n(glibc default)",
    ]
    values = [
        default["peak_rss_bytes"]["baseline"] / mib,
        default["peak_rss_bytes"]["streaming"] / mib,
        tuned["peak_rss_bytes"]["streaming"] / mib,
        default["peak_rss_bytes"]["memory"] / mib,
    ]
    bx.bar(names, values, color=["0.6", "tab:olive", "tab:green", "tab:red"])
    target = (default["peak_rss_bytes"]["baseline"] + 1.5 * bench["largest_layer_bytes"]) / mib
    bx.axhline(target, color="tab:green", ls="--", lw=1, label="overhead + 1.5 × largest layer")
    for i, v in enumerate(values):
        bx.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    bx.tick_params(axis="x", labelsize=7)
    ckpt = bench["checkpoint"]
    t = default["seconds_best"]
    bx.set_title(
        f"schatten_bounds, {ckpt['num_parameters'] / 1e9:.2f} B bf16, {ckpt['shards']} shards; "
        f"{t['streaming']:.0f} s streaming, {t['memory']:.0f} s in memory",
        fontsize=8,
    )
    bx.set_ylabel("peak resident memory (MiB)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig


OUTPUTS = ("decoders.png", "decoders.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", "--output_dir", default=os.path.join(HERE, "..", "docs", "figures"))
    add_overwrite_flag(ap)
    args = ap.parse_args(argv)
    try:  # before any work: never an earlier run's figure without --overwrite-output-dir
        claim_output_dir(args.output_dir, OUTPUTS, overwrite=args.overwrite_output_dir, inputs=[BENCH])
    except OutputExistsError as err:  # one line, nothing written or removed
        print(f"fig_decoders: {err}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        srr = srr_by_source(tmp)
    bench = None
    if os.path.isfile(BENCH):
        with open(BENCH, encoding="utf-8") as fh:
            bench = json.load(fh)
    png = os.path.join(args.output_dir, OUTPUTS[0])
    figure(srr, bench).savefig(png, dpi=90)
    with open(os.path.join(args.output_dir, OUTPUTS[1]), "w", encoding="utf-8") as fh:
        json.dump({"srr": srr, "benchmark": BENCH if bench else None}, fh, indent=2)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
