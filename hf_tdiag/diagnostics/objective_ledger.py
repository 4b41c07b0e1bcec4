"""The objective ledger: for every block of a white-box model, the objective each of its steps was derived to
decrease, measured before and after that step on real inputs, with a flag where the step increases it.

Steps and objectives (states are the residual stream ``Z`` of shape (N, d) of one sample; ``U`` the block's
subspaces from its ``qkv`` weight; every objective is a mean over the samples):

* ``mssa`` (CRATE, CRATE-α, CRATE-MAE's encoder): ``Rᶜ(Z; U)`` at the block input ``Z^{l-1}`` and after the
  attention step, ``Z^{l-1/2}`` (Yu et al. 2023: MSSA is a gradient step on ``Rᶜ``).
* ``ista`` (CRATE): the LASSO objective ``½‖x − D a‖² + λ‖a‖₁`` of ``x = LN2(Z^{l-1/2})`` at the step's input code
  ``a = x`` and at its output ``a = Z^l`` (one ISTA step from ``x``; ``D`` the square dictionary).
* ``ista_1``, ``ista_2`` (CRATE-α): the same objective on the overcomplete ``D`` from the code 0 to ``a₁``, and
  from ``a₁`` to ``a₂``. The decoding ``z½ + D₁a₂`` is not derived from an objective and is not a step here.
* ``mssa`` (AoT, the attention-only transformer with MSSA blocks): ``Rᶜ(Z; U)`` at the block input ``Z^{l-1}`` and
  at its output ``Z^l = Z^{l-1} + eta MSSA(LN(Z^{l-1}))`` (Wang et al. 2025: each block an unrolled step of subspace
  denoising, derived from the same compression term). An AoT with MHSA blocks has no subspaces ``U`` and no ledger.
* ``tssa`` (ToST): the variational compression objective ``Rᶜ_var(U_kᵀZ, Π)`` at ``Z^{l-1}`` and ``Z^{l-1/2}``
  with the block's own membership ``Π`` (from its forward on ``Z^{l-1}``) held fixed (Wu et al. 2025).

A step *increases* its objective when ``after − before > tolerance·|before|``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from .._caller_state import module_modes, restore_modes
from .._model_limits import check_finite_weights
from .._validation import check_block_outputs, check_model_inputs
from ..batching import iter_batches
from ..measures.coding_rate import compression_rate
from ..measures.sparse_coding import lasso_objective
from ..measures.token_statistics import variational_compression_rate
from .entry import diagnostic_entry
from .report import BOOL, FLOAT, INT, STR, ReportContract, typed_frame
from .settings import ObjectiveLedgerSettings

__all__ = ["FAMILY_BLOCKS", "LedgerStep", "ObjectiveLedgerReport", "objective_ledger"]

# block class name -> family; class names, so that models loaded with trust_remote_code are recognised too
FAMILY_BLOCKS = {
    "CrateLayer": "crate",
    "CrateAlphaLayer": "crate-alpha",
    "CrateMAEEncoderLayer": "crate-mae",
    "TostLayer": "tost",
    "AotLayer": "aot",
}
OBJECTIVES = {"mssa": "Rc", "ista": "lasso", "ista_1": "lasso", "ista_2": "lasso", "tssa": "Rc_var"}


@dataclass
class LedgerStep:
    """One step of one block: its objective's mean value before and after the step."""

    layer: int
    step: str
    objective: str
    before: float
    after: float
    tolerance: float = 1e-6

    @property
    def change(self) -> float:
        """``after − before`` (negative: the step decreased its objective)."""
        return self.after - self.before

    @property
    def relative_change(self) -> float:
        """``(after − before) / |before|`` (``nan`` where ``before`` is 0)."""
        return self.change / abs(self.before) if self.before else float("nan")

    @property
    def increased(self) -> bool:
        """The step increased what it was derived to decrease (beyond ``tolerance·|before|``)."""
        return self.change > self.tolerance * abs(self.before)


LEDGER_KIND = "ObjectiveLedgerReport"
#: the JSON format :meth:`ObjectiveLedgerReport.to_dict` writes (JSON without ``format_version`` is format 1 too)
LEDGER_FORMAT_VERSION = 1


def _ledger_schema():
    from .report_json import INT, NUM, STR, ListOf, Obj

    step = Obj({"layer": INT, "step": STR, "objective": STR, "before": NUM, "after": NUM})
    return Obj({"family": STR, "model_type": STR, "num_layers": INT, "num_samples": INT, "eps": NUM,
                "tolerance": NUM, "steps": ListOf(step)})  # fmt: skip


@dataclass
class ObjectiveLedgerReport(ReportContract):
    """Per-block objective ledger of a white-box model (see the module docstring for the steps).

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification, ObjectiveLedgerReport
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> ledger = hf_tdiag.objective_ledger(model, torch.randn(4, 1, 8, 8))
        >>> again = ObjectiveLedgerReport.from_json(ledger.to_json())
        >>> again.to_dict() == ledger.to_dict(), [s.step for s in again.steps if s.layer == 1]
        (True, ['mssa', 'ista'])
        >>> ledger.to_pandas().columns.tolist()
        ['layer', 'step', 'objective', 'before', 'after', 'change', 'relative_change', 'increased']
    """

    family: str
    model_type: str
    num_layers: int
    num_samples: int
    eps: float
    tolerance: float
    steps: list[LedgerStep] = field(default_factory=list)

    def increasing_steps(self) -> list[tuple[int, str]]:
        """``(layer, step)`` of every step that increased its objective."""
        return [(s.layer, s.step) for s in self.steps if s.increased]

    def summary(self) -> dict[str, float]:
        """Counts of steps and of steps that increased their objective, and the mean relative change."""
        changes = [s.relative_change for s in self.steps if s.before]
        increasing = len(self.increasing_steps())
        return {
            "num_steps": float(len(self.steps)),
            "num_increasing_steps": float(increasing),
            "fraction_decreasing": (len(self.steps) - increasing) / len(self.steps) if self.steps else float("nan"),
            "mean_relative_change": sum(changes) / len(changes) if changes else float("nan"),
        }

    def to_dict(self) -> dict:
        """Plain data: the fields, every step (with its change and flag) and the summary."""
        from .report_json import stamp

        return {
            **stamp(LEDGER_KIND, LEDGER_FORMAT_VERSION),
            "family": self.family,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "num_samples": self.num_samples,
            "eps": self.eps,
            "tolerance": self.tolerance,
            "steps": [
                {
                    "layer": s.layer,
                    "step": s.step,
                    "objective": s.objective,
                    "before": s.before,
                    "after": s.after,
                    "change": s.change,
                    "increased": s.increased,
                }  # fmt: skip
                for s in self.steps
            ],
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> ObjectiveLedgerReport:
        """The report :meth:`to_dict` wrote; a JSON of another report, a newer format, or a field missing or
        mistyped is one ValueError naming the field."""
        from .report_json import check_report

        check_report(data, LEDGER_KIND, _ledger_schema(), LEDGER_FORMAT_VERSION)
        try:
            tolerance = float(data["tolerance"])
            steps = [
                LedgerStep(
                    int(s["layer"]),
                    str(s["step"]),
                    str(s["objective"]),
                    float(s["before"]),
                    float(s["after"]),
                    tolerance,
                )  # fmt: skip
                for s in data["steps"]
            ]
            return cls(str(data["family"]), str(data["model_type"]), int(data["num_layers"]),
                       int(data["num_samples"]), float(data["eps"]), tolerance, steps)  # fmt: skip
        except (KeyError, TypeError) as err:
            raise ValueError(f"data: not an objective-ledger report ({type(err).__name__}: {err})") from None

    def to_pandas(self):
        """One row per (layer, step): before, after, change, relative change and the increase flag."""
        rows = [
            {
                "layer": s.layer,
                "step": s.step,
                "objective": s.objective,
                "before": s.before,
                "after": s.after,
                "change": s.change,
                "relative_change": s.relative_change,
                "increased": s.increased,
            }  # fmt: skip
            for s in self.steps
        ]
        columns = {"layer": INT, "step": STR, "objective": STR, "before": FLOAT, "after": FLOAT, "change": FLOAT,
                   "relative_change": FLOAT, "increased": BOOL}  # fmt: skip
        return typed_frame(rows, columns)

    def plot(self, title: str | None = None):
        """Relative change of each step's objective per layer; steps that increased theirs are drawn hatched."""
        from ..viz import new_figure

        fig = new_figure(6.4, 3.8)
        ax = fig.add_subplot(1, 1, 1)
        names = list(dict.fromkeys(s.step for s in self.steps))
        width = 0.8 / max(len(names), 1)
        for j, name in enumerate(names):
            rows = [s for s in self.steps if s.step == name]
            xs = [s.layer + (j - (len(names) - 1) / 2) * width for s in rows]
            bars = ax.bar(xs, [s.relative_change for s in rows], width, label=f"{name} ({OBJECTIVES[name]})")
            for bar, s in zip(bars, rows):
                if s.increased:
                    bar.set_hatch("//")
                    bar.set_edgecolor("black")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel("block")
        ax.set_ylabel("(after − before) / before")
        ax.set_xticks(range(1, self.num_layers + 1))
        ax.set_title(title or f"objective ledger: {self.model_type} (hatched: the step increased its objective)")
        ax.legend(fontsize="small")
        return fig


def _family_blocks(model: torch.nn.Module) -> tuple[str, list[torch.nn.Module]]:
    """``(family, blocks)`` of a white-box model; a ValueError saying why for any other model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a loaded white-box model), got {type(model).__name__}")
    found = [m for m in model.modules() if type(m).__name__ in FAMILY_BLOCKS]
    if not found:
        raise ValueError(
            f"model: {type(model).__name__} has no white-box blocks (CRATE, CRATE-α, CRATE-MAE, ToST or AoT); its layers "
            "are not derived as steps on an objective, so there is no objective ledger for it"
        )
    families = sorted({FAMILY_BLOCKS[type(m).__name__] for m in found})
    if len(families) > 1:
        raise ValueError(f"model: blocks of several white-box families {families}; pass one family's model")
    if families[0] == "aot":
        _check_aot(found)
    return families[0], found


def _check_aot(blocks: list[torch.nn.Module]) -> None:
    """An AoT whose blocks the ledger measures: vision blocks with MSSA (subspaces ``U``), else a ValueError why not."""
    attention = blocks[0].attention
    if attention.kind != "mssa":
        raise ValueError(
            "model: an AoT with MHSA blocks (attention='mhsa') has no subspaces U, so there is no Rᶜ(Z; U) to "
            "measure; the ledger reads AoT models with attention='mssa'"
        )
    if attention.is_causal:
        raise ValueError("model: the objective ledger reads AoT vision models (AotModel); the AoT language model is "
                         "not measured by it")  # fmt: skip


def _subspaces(attention: torch.nn.Module) -> torch.Tensor:
    """``U`` (K, d, p) of an attention module whose ``qkv`` rows ``k·p … (k+1)·p − 1`` are ``U_kᵀ``."""
    weight = attention.qkv.weight
    return weight.reshape(attention.num_heads, attention.head_dim, weight.shape[-1]).transpose(1, 2)


def _block_steps(family: str, block, states: tuple, eps: float) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``[(step, before, after)]`` per-sample objectives of one block, from its input, mid and output states."""
    z_in, z_mid, z_out, pi = states
    U = _subspaces(block.attention).to(z_in.dtype)
    if family == "tost":
        before = variational_compression_rate(z_in.unsqueeze(1) @ U, pi)  # (B, K, N, p): U_kᵀ z per token
        return [("tssa", before, variational_compression_rate(z_mid.unsqueeze(1) @ U, pi))]
    steps = [("mssa", compression_rate(z_in, U, eps), compression_rate(z_mid, U, eps))]
    if family == "aot":  # attention only: the block output is the state after MSSA
        return steps
    x = block.layernorm_after(z_mid)
    if family == "crate-alpha":
        coder = block.sparse_coding
        a1, a2 = coder.codes(x)
        lasso = [lasso_objective(x, coder.D, a, coder.lambd) for a in (torch.zeros_like(a1), a1, a2)]
        return steps + [("ista_1", lasso[0], lasso[1]), ("ista_2", lasso[1], lasso[2])]
    D, lam = block.ista.weight, block.ista.lambd
    return steps + [("ista", lasso_objective(x, D, x, lam), lasso_objective(x, D, z_out, lam))]


def _pixel_batches(inputs) -> Iterable[torch.Tensor]:
    """The pixel-value tensors of ``inputs``: a tensor, a mapping with ``pixel_values``, or an iterable of those."""
    if isinstance(inputs, torch.Tensor):
        yield check_model_inputs(inputs)
    elif isinstance(inputs, Mapping):
        if "pixel_values" not in inputs:
            raise ValueError(f"inputs: expected a mapping with 'pixel_values', got keys {sorted(inputs)}")
        yield check_model_inputs(inputs["pixel_values"])
    elif isinstance(inputs, Iterable) and not isinstance(inputs, (str, bytes)):
        for item in inputs:
            if not isinstance(item, (torch.Tensor, Mapping)):
                raise TypeError(f"inputs: expected batches of pixel_values tensors, got a {type(item).__name__}")
            yield from _pixel_batches(item)
    else:
        raise TypeError(
            f"inputs: expected pixel_values (B, C, H, W), a mapping or batches of them, got {type(inputs).__name__}"
        )


def _encoder(model: torch.nn.Module, family: str) -> torch.nn.Module:
    """The module whose forward returns the block states (CRATE-MAE: its encoder, without masking)."""
    if family == "crate-mae":
        for module in model.modules():
            if type(module).__name__ == "CrateMAEModel":
                return module
    return model


def _forward_states(model, family: str, pixels: torch.Tensor) -> list[tuple]:
    """Per block ``(Z^{l-1}, Z^{l-1/2}, Z^l, Π or None)`` from one forward with recorded states."""
    if family == "aot":  # one step per block: its input Z^{l-1} and output Z^l
        hidden = _encoder(model, family)(pixel_values=pixels, output_hidden_states=True).hidden_states
        check_block_outputs(hidden, pixels, start=0)
        return [(hidden[i], hidden[i + 1], hidden[i + 1], None) for i in range(len(hidden) - 1)]
    kwargs = dict(output_hidden_states=True, output_mid_hidden_states=True)
    if family == "tost":
        kwargs["output_memberships"] = True
    out = _encoder(model, family)(pixel_values=pixels, **kwargs)
    hidden, mid = out.hidden_states, out.mid_hidden_states
    check_block_outputs(hidden, pixels, start=0)  # NaN from finite inputs: the block that produced it, named
    pis = out.memberships if family == "tost" else [None] * len(mid)
    return [(hidden[i], mid[i], hidden[i + 1], pis[i]) for i in range(len(mid))]


@diagnostic_entry(ObjectiveLedgerSettings)
def objective_ledger(model, inputs, *, settings: ObjectiveLedgerSettings) -> ObjectiveLedgerReport:
    """The objective ledger of a white-box ``model`` (CRATE, CRATE-α, CRATE-MAE, ToST, AoT with MSSA, text CRATE) on
    ``inputs``.

    ``inputs``: pixel values ``(B, C, H, W)``, a mapping with ``pixel_values``, or an iterable of batches of those;
    for a text CRATE, token ids ``(B, N)``, a tokenizer's batch (``input_ids``, ``attention_mask``) or batches of those.
    A tensor is measured ``batch_size`` samples at a time. The model is run in eval mode without gradients and left as found.

    Examples:
        >>> import torch, hf_tdiag
        >>> from hf_tdiag import CrateConfig, CrateForImageClassification
        >>> _ = torch.manual_seed(0)
        >>> model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10))
        >>> ledger = hf_tdiag.objective_ledger(model, torch.randn(4, 1, 8, 8))
        >>> ledger.family, ledger.num_layers, [(s.layer, s.step, s.objective) for s in ledger.steps][:3]
        ('crate', 4, [(1, 'mssa', 'Rc'), (1, 'ista', 'lasso'), (2, 'mssa', 'Rc')])
        >>> ledger.summary()["num_steps"], len(ledger.increasing_steps()) == ledger.summary()["num_increasing_steps"]
        (8.0, True)
    """
    from .objective_ledger_text import is_crate_text, text_objective_ledger

    text = is_crate_text(model)  # text CRATE: token batches, padding excluded (objective_ledger_text)
    family, blocks = ("crate_text", []) if text else _family_blocks(model)
    eps, tolerance = settings.eps, settings.tolerance
    inputs = iter_batches(inputs, settings.batch_size)
    check_finite_weights(model)  # a NaN/inf weight named before any forward pass (not as the D of a LASSO step)
    if text:
        return text_objective_ledger(model, inputs, eps=eps, tolerance=tolerance)
    sums: dict[tuple[int, str], list[float]] = {}
    count, saved_modes = 0, module_modes(model)
    device = next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad():
            for pixels in _pixel_batches(inputs):
                states = _forward_states(model, family, pixels.to(device))
                for i, (block, block_states) in enumerate(zip(blocks, states)):
                    for step, before, after in _block_steps(family, block, block_states, eps):
                        acc = sums.setdefault((i + 1, step), [0.0, 0.0])
                        acc[0] += float(before.sum())
                        acc[1] += float(after.sum())
                count += int(pixels.shape[0])
    finally:
        restore_modes(saved_modes)
    if count == 0:
        raise ValueError("inputs: expected at least one image, got none")
    steps = [LedgerStep(layer, step, OBJECTIVES[step], b / count, a / count, tolerance)
             for (layer, step), (b, a) in sums.items()]  # fmt: skip
    config = getattr(model, "config", None)
    return ObjectiveLedgerReport(family, str(getattr(config, "model_type", family)), len(blocks), count, eps,
                                 tolerance, steps)  # fmt: skip
