"""Figures of the paper's synthetic experiments, one function per figure, each drawing the dict its
``hf_tdiag.experiments.attention_gd.paper.run_*`` returns (``Figure`` objects, no pyplot state)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .. import new_figure
from ._common import as_array

__all__ = [
    "plot_trajectories",
    "plot_local",
    "plot_convergence",
    "plot_margins",
    "plot_rank_m",
    "plot_svm_rank",
    "plot_nonlinear",
    "plot_gamma",
    "plot_multitoken_lambda",
    "plot_multitoken_tau",
]

_COLORS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown")


def plot_trajectories(res: dict) -> Figure:
    """Fig. 2: tokens (stars: optimal), ``W_mm z_i`` (solid) / ``W⋆_mm z_i`` (dashed), GD paths ``W_t z_i``."""
    fig = new_figure(5.6, 4.8)
    ax = fig.add_subplot()
    X = as_array(res["tokens"])
    for i in range(X.shape[0]):
        c = _COLORS[i]
        for t in range(X.shape[1]):
            star = t == res["optimal"][i]
            ax.scatter(
                X[i, t, 0],
                X[i, t, 1],
                marker="*" if star else "o",
                s=160 if star else 50,
                color=c,
                edgecolors="k",
                zorder=3,
            )
        for norm, ls in (("fro", "-"), ("nuc", "--")):
            u = as_array(res["svm_directions"][norm][i])
            u = u / np.linalg.norm(u)
            ax.plot([0, 3 * u[0]], [0, 3 * u[1]], color=c, ls=ls, lw=2, alpha=0.5)
        for param, ls in (("W", "-"), ("KQ", "--")):
            p = as_array(res["paths"][param][i])
            scale = max(np.linalg.norm(p[-1]), 1e-12) / 2.5
            ax.plot(p[:, 0] / scale, p[:, 1] / scale, color=c, ls=ls, lw=1)
    ax.set_aspect("equal", adjustable="datalim")  # equal scales, the axes fill the figure
    ax.grid(alpha=0.3)
    fc = res["final_correlation"]
    ax.set_title(
        f"GD paths (W solid, KQ dashed; scaled) vs SVM directions\ncorr(W, W_mm) = {fc['W_vs_fro']:.4f}, "
        f"corr(KQᵀ, W⋆_mm) = {fc['KQ_vs_nuc']:.4f}",
        fontsize=9,
    )
    return fig


def plot_local(res: dict) -> Figure:
    """Local convergence: mean largest softmax probability, and correlation with ``W^mm_α`` / ``W^mm_{⋆,α}`` per iteration."""
    fig = new_figure(12.0, 3.8)
    axes = fig.subplots(1, 3)
    for param, c in (("W", "tab:blue"), ("KQ", "tab:red")):
        e = res["params"][param]
        s = np.asarray(e["steps"])
        m, sd = as_array(e["max_prob"]["mean"]), as_array(e["max_prob"]["std"])
        axes[0].plot(s, m, color=c, label=param)
        axes[0].fill_between(s, m - sd, m + sd, color=c, alpha=0.15)
        ax = axes[1] if param == "W" else axes[2]
        for norm, cc in (("fro", "tab:blue"), ("nuc", "tab:red")):
            if e.get(f"corr_{norm}"):
                m, sd = as_array(e[f"corr_{norm}"]["mean"]), as_array(e[f"corr_{norm}"]["std"])
                ax.plot(
                    s,
                    m,
                    color=cc,
                    label=r"$W^{mm}_{\alpha}$ (Frobenius)" if norm == "fro" else r"$W^{mm}_{\star,\alpha}$ (nuclear)",
                )
                ax.fill_between(s, m - sd, m + sd, color=cc, alpha=0.15)
        ax.set_title(f"{param}-parameterization", fontsize=9)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("softmax probability")
    axes[1].set_ylabel("correlation coefficient")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def plot_convergence(res: dict, param: str = "W") -> Figure:
    """Figs 5/6: shares of global / local / undetermined convergence vs d, and P(Assumption B.1)."""
    rows = res["rows"]
    d = np.arange(len(rows))
    fig = new_figure(6.8, 4.0)
    ax = fig.add_subplot()
    w = 0.2
    for k, (kind, c) in enumerate((("global", "tab:red"), ("local", "tab:blue"), ("undetermined", "tab:gray"))):
        ax.bar(d + (k - 1.5) * w, [r[param][kind] for r in rows], w, color=c, label=kind)
    ax.bar(d + 1.5 * w, [r["assumption_B1"] for r in rows], w, color="tab:green", label="Assumption B.1")
    ax.plot(d, [r[param]["selects_optimal"] for r in rows], "k^--", ms=4, lw=0.8, label="selects the optimal tokens")
    ax.set_xticks(d, [str(r["d"]) for r in rows])
    ax.set_xlabel("d")
    ax.set_ylabel("share of runs")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    s = res["settings"]
    ax.set_title(
        f"{param}-parameterization: convergence vs d (n={s['n']}, T={s['T']}, {s['runs']} runs per d)", fontsize=9
    )
    return fig


def plot_margins(res: dict) -> Figure:
    """Fig. 8: margin of the optimal tokens' SVM vs that of the tokens GD selected, per run (W), by outcome."""
    fig = new_figure(6.4, 4.4)
    ax = fig.add_subplot()
    for kind, c, mk in (("global", "tab:red", "o"), ("local", "tab:blue", "s"), ("undetermined", "tab:gray", "x")):
        runs = [r for r in res["runs"] if r["kind"] == kind]
        if runs:
            ax.scatter(
                [r["global_margin"] for r in runs],
                [r["selected_margin"] for r in runs],
                s=12,
                color=c,
                marker=mk,
                label=f"{kind} ({len(runs)})",
                alpha=0.7,
            )
    lim = max([r["selected_margin"] for r in res["runs"]] + [r["global_margin"] for r in res["runs"]] + [1e-3])
    ax.plot([0, lim], [0, lim], color="k", lw=0.8, ls="--")
    ax.set_xlabel("margin 1/‖W_mm‖ of the optimal tokens (0 = infeasible)")
    ax.set_ylabel("margin of the tokens GD selected")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("Global vs local margins (W-parameterization, all d)", fontsize=9)
    return fig


def plot_rank_m(res: dict) -> Figure:
    """Appendix: correlation of ``KQᵀ`` with ``W⋆_mm`` and its rank vs the width m."""
    rows = res["rows"]
    m = [r["m"] for r in rows]
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    ax.errorbar(
        m,
        [r["correlation_mean"] for r in rows],
        yerr=[r["correlation_std"] or 0 for r in rows],
        marker="o",
        label="corr(KQᵀ, W⋆_mm)",
    )
    ax.set_xlabel("m")
    ax.set_ylabel("correlation")
    ax.set_ylim(0, 1.05)
    ax2 = ax.twinx()
    ax2.plot(m, [r["rank_mean"] for r in rows], "s--", color="tab:green", label="rank KQᵀ")
    ax2.plot(m, [r["svm_rank_mean"] for r in rows], "d:", color="tab:purple", label="rank W⋆_mm")
    ax2.set_ylabel("rank")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    s = res["settings"]
    ax.set_title(f"(K, Q) with width m: n={s['n']}, T={s['T']}, d={s['d']}", fontsize=9)
    return fig


def plot_svm_rank(res: dict) -> Figure:
    """Rank of ``W_mm`` (solid) and ``W⋆_mm`` (dashed) vs d, one colour per (n, T)."""
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    configs = sorted({(r["n"], r["T"]) for r in res["rows"]})
    for k, (n, T) in enumerate(configs):
        rows = [r for r in res["rows"] if (r["n"], r["T"]) == (n, T) and r["feasible"]]
        d = [r["d"] for r in rows]
        ax.plot(d, [r["rank_fro"] for r in rows], "o-", color=_COLORS[k], label=f"n={n}, T={T}")
        ax.plot(d, [r["rank_nuc"] for r in rows], "o--", color=_COLORS[k])
    ax.set_xlabel("d")
    ax.set_ylabel("rank of the SVM solution")
    ax.legend(fontsize=7, title="solid W_mm, dashed W⋆_mm", title_fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def plot_nonlinear(res: dict) -> Figure:
    """Fig. 9: ``1 − corr`` of GD's iterates with ``W^SVMeq``, ``W_dir`` (Gen-SVM) and ``W^1token``, one panel per d."""
    rows = [r for r in res["rows"] if r["kept"]]
    fig = new_figure(3.2 * max(len(rows), 1), 3.6)
    axes = np.atleast_1d(fig.subplots(1, max(len(rows), 1), sharey=True))
    labels = {"svm_eq": r"$W^{SVMeq}$", "gen_svm": r"$W^{mm}$ (Gen-SVM)", "one_token": r"$W^{1token}$"}
    for ax, r in zip(axes, rows):
        for key, ls in (("svm_eq", "-"), ("gen_svm", ":"), ("one_token", "--")):
            ax.plot(
                r["steps"],
                np.maximum(1 - as_array(r["mean_correlation"][key]), 1e-16),
                ls=ls,
                marker="o",
                ms=3,
                label=labels[key],
            )
        ax.set_yscale("log")
        ax.set_title(f"d = {r['d']} ({r['kept']} runs)", fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("1 − correlation (mean over runs)")
    axes[0].legend(fontsize=7)
    return fig


def plot_gamma(res: dict) -> Figure:
    """Fig. 12: ``1 − corr(W, W^SVMeq)`` at the end against the largest masked probability Γ, per run."""
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for k, r in enumerate(x for x in res["rows"] if x["kept"]):
        g = as_array(r["Gamma"])
        y = np.maximum(1 - as_array(r["final_correlation"]["svm_eq"]), 1e-16)
        ax.scatter(np.maximum(g, 1e-300), y, s=10, color=_COLORS[k], label=f"d = {r['d']}", alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(0.01, color="k", lw=0.8, ls="--")
    ax.set_xlabel("Γ = largest masked softmax probability")
    ax.set_ylabel("1 − corr(W, W^SVMeq)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def plot_multitoken_lambda(res: dict) -> Figure:
    """Fig. 10: selected tokens per input vs λ (GD and the water-filling prediction), and the SVM-equivalence correlation."""
    rows = res["rows"]
    lam = [r["lam"] for r in rows]
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    ax.plot(lam, [r["mean_selected"] for r in rows], "o-", label="GD: mean selected (s ≥ 1e-3)")
    ax.plot(lam, [r["predicted_mean_selected"] for r in rows], "s--", label="water-filling optimum")
    ax.set_xlabel("λ")
    ax.set_ylabel("selected tokens per input")
    ax2 = ax.twinx()
    ax2.plot(
        lam,
        [r["correlation_mean"] if r["correlation_mean"] is not None else np.nan for r in rows],
        "d:",
        color="tab:red",
        label="corr(W, SVM equivalence)",
    )
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("correlation")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.grid(alpha=0.3)
    return fig


def plot_multitoken_tau(res: dict) -> Figure:
    """Fig. 13: mean (solid) and largest (dotted) selected-set size vs λ, one colour per τ (dashed: τ)."""
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    taus = sorted({r["tau"] for r in res["rows"]})
    for k, tau in enumerate(taus):
        rows = [r for r in res["rows"] if r["tau"] == tau]
        lam = [r["lam"] for r in rows]
        ax.plot(lam, [r["mean_selected"] for r in rows], "o-", color=_COLORS[k], label=f"τ = {tau}")
        ax.plot(lam, [r["max_selected"] for r in rows], "^:", color=_COLORS[k])
        ax.axhline(tau, color=_COLORS[k], ls="--", lw=0.8)
    ax.set_xscale("log")
    lams = sorted({r["lam"] for r in res["rows"]})
    ax.set_xticks(lams, [f"{lam:g}" for lam in lams])
    ax.minorticks_off()
    ax.set_xlabel("λ")
    ax.set_ylabel("selected tokens per input")
    ax.set_title("selected tokens: mean (solid), largest (dotted); τ planted leaders (dashed)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig
