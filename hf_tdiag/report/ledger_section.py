"""The report's ``ledger`` section: the objective ledger of a white-box model (CRATE, CRATE-α, CRATE-MAE, ToST) on
the report's inputs — per block, each step's objective before and after the step, and the steps that increase the
objective they were derived to decrease (:func:`hf_tdiag.diagnostics.objective_ledger.objective_ledger`). Models
without white-box blocks get the section skipped, with the ledger's own reason."""

from __future__ import annotations

import torch

from hf_tdiag.loading import LoadedModel

from .html import Section, Table
from .options import ReportInputs, ReportOptions
from .section_tools import _TITLES, _add_figures, _skip

#: images (or texts) per forward pass of the ledger
LEDGER_BATCH = 64


def _has_whitebox_blocks(model: torch.nn.Module) -> bool:
    from hf_tdiag.diagnostics.objective_ledger import FAMILY_BLOCKS

    return any(type(m).__name__ in FAMILY_BLOCKS for m in model.modules())


def ledger_tables(report) -> list[Table]:
    """The headline counts and one row per (block, step) of an :class:`ObjectiveLedgerReport`."""
    s = report.summary()
    head = Table(
        "Objective ledger: summary",
        ["quantity", "value"],
        [
            ["steps measured", int(s["num_steps"])],
            ["steps that increase their objective", int(s["num_increasing_steps"])],
            ["fraction of steps that decrease it", s["fraction_decreasing"]],
            ["mean relative change (after − before) / |before|", s["mean_relative_change"]],
        ],
    )
    rows = [
        [st.layer, st.step, st.objective, st.before, st.after, st.relative_change, "yes" if st.increased else "no"]
        for st in report.steps
    ]
    columns = ["block", "step", "objective", "before", "after", "relative change", "increases"]
    return [head, Table("Objective ledger per block and step", columns, rows)]


def section_objective_ledger(loaded: LoadedModel, inputs: ReportInputs | None, options: ReportOptions) -> Section:
    from hf_tdiag.diagnostics.objective_ledger import objective_ledger

    title = _TITLES["objective_ledger"]
    if inputs is None:
        return _skip(
            "objective_ledger", title, "needs inputs: each step's objective is measured on the inputs' token states"
        )
    try:
        report = objective_ledger(loaded.model, inputs.batch, eps=options.srr_eps, batch_size=LEDGER_BATCH)
    except ValueError as err:
        if _has_whitebox_blocks(loaded.model):
            raise
        return _skip("objective_ledger", title, f"not a white-box model: {err}")
    increasing = report.increasing_steps()
    flagged = ", ".join(f"block {layer} {step}" for layer, step in increasing) or "none"
    section = Section(
        "objective_ledger",
        title,
        summary=(
            f"For every block of this {report.family} model, the objective each step was derived to decrease, "
            f"averaged over {report.num_samples} inputs before and after the step (MSSA: Rᶜ(Z; U) with ε = "
            f"{report.eps:g}; ISTA: the LASSO objective ½‖x − D a‖² + λ‖a‖₁; TSSA: the variational Rᶜ_var at the "
            f"block's own membership Π). A step increases its objective when after − before > "
            f"{report.tolerance:g}·|before|. Steps that increase it: {flagged}."
        ),
        tables=ledger_tables(report),
        numbers={"objective_ledger": report.to_dict()},
    )
    _add_figures(
        section,
        lambda: [
            ("Relative change of each step's objective per block (hatched: the step increased it)", report.plot())
        ],
    )
    return section


__all__ = ["LEDGER_BATCH", "ledger_tables", "section_objective_ledger"]
