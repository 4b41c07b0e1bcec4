#!/usr/bin/env python
"""Compile and export of one head class of each white-box family on CPU, as ratios to eager in the same run.

For each family (CRATE, CRATE-α, CRATE-MAE, ToST: image classification; text CRATE: causal LM) on a small config:

* ``eager``: the median wall time of one eval forward (``torch.no_grad``) after one warm-up call;
* ``compile_first``: the first call of ``torch.compile(model, fullgraph=True)`` (tracing + inductor's code
  generation and C++ compile), from a fresh inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder per
  child process, ``torch._dynamo.reset()`` before each family), and ``compiled``: its steady forward (median);
* ``export``: ``torch.export.export(model, (), inputs)``, and ``exported``: ``program.module()``'s forward (median).

Every output is compared with eager's (``torch.testing.assert_close``, ``rtol = atol = 1e-5``): the row records
``max_abs_diff`` and ``equal_1e-5`` for the compiled and the exported model. Before the families each child compiles
one small function (``inductor_warmup_s``: inductor's one-time imports and C++ toolchain start), so the first
family's compile time is not charged with them.

Conditions (each in a fresh child process): ``idle`` (nothing started by the benchmark: other users' work is what it
is) and ``busy`` (one spinner process, ``while True: pass``, keeping one core busy), each at ``threads=1``
(``torch.set_num_threads(1)``) and at torch's default. Every timing carries the 1-minute load average before and
after it; on a machine shared with other work only the ratios within one child mean something.

    python benchmarks/bench_compile_export.py            # results/bench_compile_export_cpu.json
    python benchmarks/bench_compile_export.py --quick    # idle, threads=1 only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("crate", "crate-alpha", "crate-mae", "tost", "crate-text")
CONDITIONS = ("idle", "busy")
THREADS = ("1", "default")
BATCH, IMAGE, PATCH, WIDTH, LAYERS, HEADS, TOKENS, VOCAB = 4, 32, 4, 64, 2, 4, 32, 128


# ---------------------------------------------------------------------------------------------- child side


def _load() -> float:
    return os.getloadavg()[0]


def _model_and_inputs(family: str):
    """The family's head class on the small config (seeded weights), in eval mode, and its inputs."""
    import torch

    torch.manual_seed(0)
    vision = dict(image_size=IMAGE, patch_size=PATCH, num_channels=3, hidden_size=WIDTH, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_labels=10)  # fmt: skip
    if family == "crate":
        from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

        model = CrateForImageClassification(CrateConfig(**vision))
    elif family == "crate-alpha":
        from hf_tdiag.models.crate_alpha import CrateAlphaConfig, CrateAlphaForImageClassification

        model = CrateAlphaForImageClassification(CrateAlphaConfig(**vision))
    elif family == "crate-mae":
        from hf_tdiag.models.crate_mae import CrateMAEConfig, CrateMAEForImageClassification

        model = CrateMAEForImageClassification(
            CrateMAEConfig(**vision, decoder_num_hidden_layers=1, decoder_num_attention_heads=HEADS)
        )
    elif family == "tost":
        from hf_tdiag.models.tost import TostConfig, TostForImageClassification

        model = TostForImageClassification(TostConfig(**vision, num_class_attention_layers=1))
    elif family == "crate-text":
        from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM

        config = CrateTextConfig.from_preset("crate-lm-12l", vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS,
                                             num_attention_heads=HEADS, max_position_embeddings=2 * TOKENS,
                                             ista_dictionary_size=2 * WIDTH, pad_token_id=0)  # fmt: skip
        model = CrateTextForCausalLM(config)
    else:
        raise ValueError(f"unknown family {family!r}: one of {FAMILIES}")
    g = torch.Generator().manual_seed(1)
    if family == "crate-text":
        ids = torch.randint(1, VOCAB, (BATCH, TOKENS), generator=g)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    else:
        inputs = {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)}
    return model.eval(), inputs


def _timed(fn, repeats: int) -> dict:
    """Median wall seconds of ``repeats`` calls after one warm-up call, with the load around them."""
    load0 = _load()
    out = fn()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return {
        "wall_s": statistics.median(walls),
        "walls_s": walls,
        "load_before": load0,
        "load_after": _load(),
        "_out": out,
    }


def _once(fn) -> dict:
    load0 = _load()
    t0 = time.perf_counter()
    out = fn()
    return {"wall_s": time.perf_counter() - t0, "load_before": load0, "load_after": _load(), "_out": out}


def _agreement(got, expected) -> dict:
    import torch

    a, b = got["logits"], expected["logits"]
    diff = float((a - b).abs().max())
    try:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        equal = True
    except AssertionError:
        equal = False
    return {"max_abs_diff": diff, "equal_1e-5": equal}


def _family_row(family: str, repeats: int) -> dict:
    import torch

    model, inputs = _model_and_inputs(family)

    def forward(m):
        def call():
            with torch.no_grad():
                return m(**inputs)

        return call

    row = {"family": family, "class": type(model).__name__}
    eager = _timed(forward(model), repeats)
    expected = eager.pop("_out")

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    first = _once(forward(compiled))
    first.pop("_out")
    steady = _timed(forward(compiled), repeats)
    row["compiled_check"] = _agreement(steady.pop("_out"), expected)

    def export():
        with torch.no_grad():
            return torch.export.export(model, (), inputs)

    exported = _once(export)
    program = exported.pop("_out").module()
    run_exported = _timed(forward(program), repeats)
    row["exported_check"] = _agreement(run_exported.pop("_out"), expected)

    base = eager["wall_s"]
    row.update(eager=eager, compile_first=first, compiled=steady, export=exported, exported=run_exported)
    row["ratios_to_eager"] = {
        "compile_first": first["wall_s"] / base,
        "compiled": steady["wall_s"] / base,
        "export": exported["wall_s"] / base,
        "exported": run_exported["wall_s"] / base,
    }
    return row


def _child(args) -> None:
    import torch

    if args.threads == "1":
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    torch._dynamo.reset()
    torch.compile(lambda x: (x.sin() + 1).sum(), fullgraph=True)(torch.randn(8))
    warmup = time.perf_counter() - t0
    with open(args.child_out, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"inductor_warmup_s": warmup, "torch_threads": torch.get_num_threads()}) + "\n")
        for family in args.families.split(","):
            fh.write(json.dumps(_family_row(family, args.repeats)) + "\n")
            fh.flush()


# ---------------------------------------------------------------------------------------------- parent side


def _spin() -> None:
    while True:
        pass


def _run_child(condition: str, threads: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.jsonl")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor")}
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--threads", threads, "--child-out", out]
        cmd += ["--families", ",".join(args.families), "--repeats", str(args.repeats)]
        print(f"[{condition}, threads={threads}] load {_load():.2f}", flush=True)
        status = "ok"
        try:
            subprocess.run(cmd, timeout=args.timeout, check=True, env=env)
        except subprocess.TimeoutExpired:
            status = "timeout"
        except subprocess.CalledProcessError as err:
            status = f"failed (exit {err.returncode})"
        lines = [json.loads(line) for line in open(out, encoding="utf-8")] if os.path.exists(out) else []
    head = lines[0] if lines and "inductor_warmup_s" in lines[0] else {}
    rows = [r for r in lines if "family" in r]
    return {"condition": condition, "threads": threads, "status": status, **head, "families": rows}


def _machine() -> dict:
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_default_threads": torch.get_num_threads(),
    }


def _print(runs: list[dict]) -> None:
    print(f"{'condition':>9} {'thr':>7} {'family':>11} {'eager ms':>9} {'compile x':>10} {'compiled x':>10} "
          f"{'export x':>9} {'exported x':>10} {'equal':>6}  load")  # fmt: skip
    for run in runs:
        for r in run["families"]:
            x = r["ratios_to_eager"]
            equal = r["compiled_check"]["equal_1e-5"] and r["exported_check"]["equal_1e-5"]
            print(f"{run['condition']:>9} {run['threads']:>7} {r['family']:>11} {1e3 * r['eager']['wall_s']:9.2f} "
                  f"{x['compile_first']:10.0f} {x['compiled']:10.2f} {x['export']:9.0f} {x['exported']:10.2f} "
                  f"{str(equal):>6}  {r['eager']['load_before']:.1f}-{r['exported']['load_after']:.1f}")  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", type=lambda s: s.split(","), default=list(FAMILIES))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    ap.add_argument("--quick", action="store_true", help="idle at threads=1 only")
    ap.add_argument("--output", default=os.path.join(HERE, "results", "bench_compile_export_cpu.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", default="1", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.families = ",".join(args.families)
        _child(args)
        return 0
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        ap.error(f"--families {','.join(unknown)}: unknown; choose from {','.join(FAMILIES)}")
    result = {
        "benchmark": "benchmarks/bench_compile_export.py",
        "machine": _machine(),
        "config": dict(
            batch=BATCH,
            image=IMAGE,
            patch=PATCH,
            hidden=WIDTH,
            layers=LAYERS,
            heads=HEADS,
            text_tokens=TOKENS,
            vocab=VOCAB,
            repeats=args.repeats,
        ),  # fmt: skip
        "load_average_start": os.getloadavg(),
        "runs": [],
    }
    for condition in CONDITIONS[:1] if args.quick else CONDITIONS:
        spinners = [mp.Process(target=_spin, daemon=True)] if condition == "busy" else []
        for s in spinners:
            s.start()
        time.sleep(1.0 if spinners else 0.0)
        try:
            for threads in THREADS[:1] if args.quick else THREADS:
                result["runs"].append(_run_child(condition, threads, args))
        finally:
            for s in spinners:
                s.terminate()
                s.join()
    result["load_average_end"] = os.getloadavg()
    result["all_outputs_equal_eager_1e-5"] = all(
        r["compiled_check"]["equal_1e-5"] and r["exported_check"]["equal_1e-5"]
        for run in result["runs"]
        for r in run["families"]
    )
    _print(result["runs"])
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(f"outputs equal eager (1e-5): {result['all_outputs_equal_eager_1e-5']}; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
