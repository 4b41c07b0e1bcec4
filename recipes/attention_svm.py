#!/usr/bin/env python
"""Transformers as SVMs (Tarzanagh et al. 2023): every synthetic figure of the paper, at its settings or a CI size.

Experiments (settings in ``hf_tdiag.experiments.attention_gd.paper.settings``; normalized GD with η = 0.1,
``K`` and ``Q`` normalized separately, the γ filter for Figs 2/5/6, the Gen-SVM exclusion rule for Fig. 9):

    trajectories        Fig. 2   2-D paths of GD on W and (K, Q) beside the Att-SVM / Att-SVM⋆ directions
    convergence         Figs 5, 6, 8  global / local convergence vs d (W and KQ), P(Assumption B.1), margins
    local               local convergence: to the SVM of the tokens GD selects (locally-optimal directions)
    svm_rank            rank of the Frobenius / nuclear SVM solutions vs d (the authors' svm_rank notebook)
    rank_m              appendix  rank of W = KQᵀ and its correlation with W⋆_mm vs the width m (n = T = 5)
    nonlinear           Figs 9, 12  nonlinear head 1ᵀReLU(Vᵀu): Gen-SVM equivalence vs one-token SVM, and Γ
    multitoken_lambda   Fig. 10  multi-token selection with vᵀu − λ‖u‖² (orthonormal tokens) vs λ
    multitoken_tau      Fig. 13  selected-set size against τ planted leaders

Writes one PNG and one JSON per figure (``fig2_trajectories.png`` / ``.json``, …) and ``summary.json``
(per experiment: the settings run, the time taken and the load average then) to ``--output-dir``; runs with
``--only`` at the same size add to the ``summary.json`` already there, so experiments can be run one at a time.
A run refuses (before any work, exit status 1) a folder holding the figures it would write, a ``summary.json`` of
the other size or another run's recognised results, unless ``--overwrite-output-dir`` is given, which replaces them
(:func:`hf_tdiag._outputs.claim_output_dir`); ``--replot`` redraws only the PNGs of the JSON files kept there.

    python recipes/attention_svm.py --paper --output-dir runs/attention_svm_paper     # ~40 min on 2 busy cores
    python recipes/attention_svm.py --quick --output-dir runs/attention_svm_quick     # about a minute (CI)
    python recipes/attention_svm.py --replot --dpi 72 --output-dir runs/attention_svm_paper   # redraw from the JSON
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

from hf_tdiag._cli_args import ArgumentParser, add_output_dir, plain, positive_int
from hf_tdiag._outputs import OutputExistsError, claim_output_dir

# figure name -> the experiment whose result it plots (each figure: <name>.png and <name>.json)
FIGURE_EXPERIMENTS = {
    "fig2_trajectories": "trajectories",
    "fig5_convergence_W": "convergence",
    "fig6_convergence_KQ": "convergence",
    "local_convergence": "local",
    "fig8_margins": "convergence",
    "svm_rank": "svm_rank",
    "rank_vs_m": "rank_m",
    "fig9_nonlinear": "nonlinear",
    "fig12_gamma": "nonlinear",
    "fig10_lambda": "multitoken_lambda",
    "fig13_tau": "multitoken_tau",
}


def _figures():
    """Figure name -> (experiment, plot function)."""
    from hf_tdiag.viz import attention_svm as V

    plots = {
        "fig2_trajectories": V.plot_trajectories,
        "fig5_convergence_W": functools.partial(V.plot_convergence, param="W"),
        "fig6_convergence_KQ": functools.partial(V.plot_convergence, param="KQ"),
        "local_convergence": V.plot_local,
        "fig8_margins": V.plot_margins,
        "svm_rank": V.plot_svm_rank,
        "rank_vs_m": V.plot_rank_m,
        "fig9_nonlinear": V.plot_nonlinear,
        "fig12_gamma": V.plot_gamma,
        "fig10_lambda": V.plot_multitoken_lambda,
        "fig13_tau": V.plot_multitoken_tau,
    }
    return {name: (experiment, plots[name]) for name, experiment in FIGURE_EXPERIMENTS.items()}


def parse_args(argv=None):
    from hf_tdiag.experiments.attention_gd.paper import EXPERIMENTS

    p = ArgumentParser(description=plain(__doc__))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--paper", action="store_true", help="the paper's settings (n, T, d, runs, steps; slow)")
    size.add_argument("--quick", action="store_true", help="a CI size (the default)")
    add_output_dir(
        p, "runs/attention_svm", "where the PNG/JSON per figure and summary.json go (default runs/attention_svm)"
    )
    p.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS), help="experiments to run")
    p.add_argument(
        "--threads", type=positive_int, default=1, metavar="N", help="torch threads (default 1: the tensors are small)"
    )
    p.add_argument("--progress", action="store_true", help="progress bars for the GD runs")
    p.add_argument("--dpi", type=int, default=120, help="PNG resolution (default 120)")
    p.add_argument(
        "--replot", action="store_true", help="redraw the PNGs from the JSON files in --output-dir (no runs)"
    )
    return p.parse_args(argv)


def replot(output_dir: str, dpi: int) -> int:
    """Redraw every figure whose JSON is in ``output_dir``."""
    from hf_tdiag.viz import save_figure

    done = 0
    for fig_name, (_, plot) in _figures().items():
        path = os.path.join(output_dir, f"{fig_name}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                save_figure(plot(json.load(fh)), os.path.join(output_dir, f"{fig_name}.png"), dpi=dpi)
            done += 1
    print(f"redrew {done} figures in {output_dir}")
    return 0 if done else 1


def _write_json(path: str, obj) -> None:
    from hf_tdiag._atomic import write_json

    write_json(path, obj, indent=1)


def _load_summary(path: str, size: str) -> dict:
    """The ``summary.json`` of earlier ``--only`` runs at the same size in this folder, or a fresh one."""
    fresh = {"size": size, "timings_s": {}, "settings": {}, "load_average_1_5_15": {}, "figures": []}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
        if old.get("size") == size:
            return {k: old.get(k, v) if isinstance(old.get(k, v), type(v)) else v for k, v in fresh.items()}
    return fresh


def _summary_size(path: str) -> str | None:
    """The ``size`` of the ``summary.json`` at ``path`` (None when there is none or it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh).get("size")
    except (OSError, ValueError, AttributeError):
        return None


def claim(args) -> list[str]:
    """Claim ``--output-dir`` before any run: the figures of the experiments in ``--only`` (PNG and JSON) clash;
    so does a ``summary.json`` this run would not add to (another size, unreadable), whose figures are then the
    previous run's and all go with ``--overwrite-output-dir``. Figures of other experiments at the same size are
    kept and stay in the summary (``--only`` runs add to it)."""
    figures = [name for name, experiment in FIGURE_EXPERIMENTS.items() if experiment in args.only]
    writes = [f"{name}{ext}" for name in figures for ext in (".png", ".json")]
    stale: list[str] = []
    summary_path = os.path.join(args.output_dir, "summary.json")
    if os.path.exists(summary_path) and _summary_size(summary_path) != ("paper" if args.paper else "quick"):
        writes.append("summary.json")
        stale = [f"{name}{ext}" for name in FIGURE_EXPERIMENTS for ext in (".png", ".json")]
    return claim_output_dir(args.output_dir, writes, overwrite=args.overwrite_output_dir, stale=stale)


def _load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args.output_dir, args.dpi)
    try:
        claim(args)  # before any run: never another run's figures without --overwrite-output-dir
    except OutputExistsError as err:  # one line, nothing written or removed
        print(f"attention_svm: {err}", file=sys.stderr)
        return 1
    import torch

    from hf_tdiag.experiments.attention_gd.paper import PAPER, QUICK, RUNNERS
    from hf_tdiag.viz import save_figure

    torch.set_num_threads(args.threads)
    settings = PAPER if args.paper else QUICK
    summary_path = os.path.join(args.output_dir, "summary.json")
    summary = _load_summary(summary_path, "paper" if args.paper else "quick")  # --only runs add to it
    figures = _figures()
    t_all = time.perf_counter()
    for name in args.only:
        t0 = time.perf_counter()
        print(f"{name}: running with {settings[name]}", flush=True)
        result = RUNNERS[name](settings[name], progress=args.progress)
        summary["timings_s"][name] = time.perf_counter() - t0
        summary["settings"][name] = dict(settings[name])
        summary["load_average_1_5_15"][name] = _load_average()  # what else ran while it was timed
        for fig_name, (experiment, plot) in figures.items():  # written as soon as the experiment is done
            if experiment == name:
                save_figure(plot(result), os.path.join(args.output_dir, f"{fig_name}.png"), dpi=args.dpi)
                _write_json(os.path.join(args.output_dir, f"{fig_name}.json"), result)
                summary["figures"] = [f for f in summary["figures"] if f != fig_name] + [fig_name]
        _write_json(summary_path, summary)
        print(f"{name}: {summary['timings_s'][name]:.1f} s", flush=True)
    print(
        f"done in {time.perf_counter() - t_all:.1f} s; {len(summary['figures'])} figures (PNG + JSON) in {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
