"""The diagnostics, each declared once: name, settings class, function, report class, inputs and surfaces.

Every surface reads its diagnostic from :data:`DIAGNOSTICS`: the command line derives the flags of a command from
the settings class (:func:`hf_tdiag._cli_args.add_settings_flags`), the evaluate module accepts the settings'
fields as keywords (and documents them with :meth:`Diagnostic.keywords_doc`), ``evaluate.combine`` routes
``<metric>_<option>`` prefixes by :func:`module_options`, the Space shows the fields marked ``space=`` as controls,
and the docs' settings tables are :meth:`Diagnostic.settings_table`. Adding a field to a settings class is the only
edit a new option needs. Torch-free: the command line reads it to build ``--help``.

Examples:
    >>> from hf_tdiag.diagnostics.registry import DIAGNOSTICS, diagnostic, module_options
    >>> sorted(DIAGNOSTICS)
    ['attention_svm', 'concept_fidelity', 'objective_ledger', 'schatten', 'srr', 'token_snr']
    >>> spec = diagnostic("srr")
    >>> spec.command, spec.metric, spec.settings.__name__, spec.inputs
    ('srr', 'srr', 'SRRSettings', ('images', 'texts', 'pixel_values'))
    >>> "eps" in spec.keywords(), "return_report" in module_options("srr")
    (True, True)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .settings import (
    AttentionSVMSettings,
    ConceptFidelitySettings,
    ObjectiveLedgerSettings,
    SchattenSettings,
    SRRSettings,
    TokenSNRSettings,
    _Settings,
)


def _load(target: str):
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic's declaration.

    ``name`` is its one name: the registry key, the report section, the settings' ``diagnostic``, the bundled evaluate
    module (``metric``), the diagnostics module the function and report live in, and, hyphenated, the ``hf-tdiag``
    sub-command (``command``); the settings and report classes are named after it. ``function`` / ``report``:
    ``"module:attribute"`` of the Python entry point and its report class; ``inputs``: what it measures (``()``:
    the weights only); ``metric_options``: the evaluate module's keywords besides its inputs and its settings;
    ``threads``: the thread policy its call runs under (:func:`hf_tdiag._threads.measure_threads`: ``"dense"``,
    torch's count capped by the idle cores, or ``"small"``, one thread, for work made of small factorizations).
    """

    name: str
    title: str
    settings: type[_Settings]
    function: str
    report: str
    inputs: tuple[str, ...]
    metric_options: tuple[str, ...] = ()
    threads: str = "dense"

    @property
    def command(self) -> str:
        """The ``hf-tdiag`` sub-command."""
        return self.name.replace("_", "-")

    @property
    def metric(self) -> str:
        """The bundled evaluate module (``evaluate.load(hf_tdiag.metric_path(metric))``)."""
        return self.name

    def load_function(self):
        """The Python entry point (imports torch)."""
        return _load(self.function)

    def load_report(self):
        """The report class (imports torch)."""
        return _load(self.report)

    def keywords(self) -> tuple[str, ...]:
        """The settings' field names: the keywords the function and the evaluate module accept for them."""
        return tuple(f.name for f in self.settings.fields())

    def keywords_doc(self, indent: str = "    ") -> str:
        """One line per setting, evaluate's ``Args:`` style: ``eps (`float`, default 0.1): ε of ...``."""
        return "\n".join(
            f"{indent}{f.name} (`{f.type.__name__}`, default {f.default!r}): {f.help}; {f.constraint()}."
            for f in self.settings.fields()
        )

    def settings_table(self) -> str:
        """The docs' table of the settings: keyword, command-line flag, default, accepted values, meaning, and the
        Space control's label where the field is shown there."""
        from .._cli_args import flag_names

        lines = [
            f"Settings of `{self.function.partition(':')[2]}` (`{self.settings.__name__}`; as keywords, as "
            f"`settings=`, as `hf-tdiag {self.command}` flags and as `{self.metric}` evaluate keywords):",
            "",
            "| keyword | flag | default | accepted | meaning | in the Space |",
            "|---|---|---|---|---|---|",
        ]
        for f in self.settings.fields():
            flag = f"`{flag_names(f)[0]}`" if f.cli else "—"
            help_text = f.help.replace("|", "\\|")
            space = f.space.get("label", "yes") if f.space is not None else "—"
            lines.append(f"| `{f.name}` | {flag} | `{f.default!r}` | {f.constraint()} | {help_text} | {space} |")
        return "\n".join(lines)


DIAGNOSTICS: dict[str, Diagnostic] = {
    d.name: d
    for d in (
        Diagnostic(
            "srr",
            "Sparse rate reduction per layer",
            SRRSettings,
            "hf_tdiag.diagnostics.srr:layer_srr",
            "hf_tdiag.diagnostics.srr_report:SRRReport",
            ("images", "texts", "pixel_values"),
            ("max_length", "tokenizer", "accelerator", "return_report", "progress"),
        ),
        Diagnostic(
            "schatten",
            "Schatten bound proxies",
            SchattenSettings,
            "hf_tdiag.diagnostics.schatten:schatten_bounds",
            "hf_tdiag.diagnostics.schatten_report:SchattenReport",
            (),
            ("return_report",),
        ),
        Diagnostic(
            "concept_fidelity",
            "Concept fidelity",
            ConceptFidelitySettings,
            "hf_tdiag.diagnostics.concept_fidelity.fidelity:concept_fidelity",
            "hf_tdiag.diagnostics.concept_fidelity.report:ConceptFidelityReport",
            ("images", "texts", "pixel_values"),
            (
                "layer",
                "layers",
                "gram_weight",
                "concepts",
                "max_iter",
                "refine_iter",
                "labels",
                "tokenizer",
                "progress",
                "return_report",
                "return_per_image",
            ),  # fmt: skip
        ),
        Diagnostic(
            "attention_svm",
            "Attention as a max-margin SVM",
            AttentionSVMSettings,
            "hf_tdiag.diagnostics.attention_svm:attention_svm_diagnostic",
            "hf_tdiag.diagnostics.attention_svm_report:AttentionSVMReport",
            ("images", "texts", "pixel_values"),
            ("layer", "head", "queries", "max_length", "tokenizer", "return_report", "progress"),
            threads="small",  # active-set and Newton steps on small dense systems
        ),
        Diagnostic(
            "objective_ledger",
            "Objective ledger",
            ObjectiveLedgerSettings,
            "hf_tdiag.diagnostics.objective_ledger:objective_ledger",
            "hf_tdiag.diagnostics.objective_ledger:ObjectiveLedgerReport",
            ("images", "texts", "pixel_values"),
            ("return_report",),
        ),
        Diagnostic(
            "token_snr",
            "Token signal-to-noise ratio per layer",
            TokenSNRSettings,
            "hf_tdiag.diagnostics.token_snr:token_snr",
            "hf_tdiag.diagnostics.token_snr_report:TokenSNRReport",
            ("images", "texts", "pixel_values"),
            ("labels", "max_length", "tokenizer", "return_report"),
        ),
    )
}


def diagnostic(name: str) -> Diagnostic:
    """The declaration of diagnostic ``name`` (its name, command, metric or settings class name)."""
    for d in DIAGNOSTICS.values():
        if name in (d.name, d.command, d.metric, d.settings.__name__):
            return d
    raise ValueError(f"diagnostic: unknown diagnostic {name!r}; known: {sorted(DIAGNOSTICS)}")


def module_options(metric: str) -> tuple[str, ...]:
    """The keywords evaluate module ``metric`` takes besides its inputs: its settings' fields and its own options."""
    d = diagnostic(metric)
    return (*d.keywords(), *d.metric_options)


__all__ = ["DIAGNOSTICS", "Diagnostic", "diagnostic", "module_options"]
