"""hf-tdiag: white-box transformers (CRATE) and transformer diagnostics for the Hugging Face ecosystem.

Importing this package registers every model family of ``hf_tdiag.models.families`` (CRATE, CRATE-α, ToST,
CRATE-MAE, text CRATE) with transformers' Auto classes, so ``AutoModel.from_pretrained(<folder>)`` loads them.
Heavier capabilities (measures, metrics, training) are imported lazily.
"""

from __future__ import annotations

import os
import sys

__version__ = "0.1.0"

from ._lazy import lazy_exports as _lazy_exports  # noqa: E402
from .models.families import register_all as _register_all  # noqa: E402

# public name -> "module:attribute", resolved on first access
_LAZY = {
    "CrateConfig": "hf_tdiag.models.crate:CrateConfig",
    "CrateModel": "hf_tdiag.models.crate:CrateModel",
    "CrateForImageClassification": "hf_tdiag.models.crate:CrateForImageClassification",
    "CrateImageProcessor": "hf_tdiag.models.crate:CrateImageProcessor",
    "convert_official_crate": "hf_tdiag.models.crate.convert_official:convert_official_crate",
    "CrateAlphaConfig": "hf_tdiag.models.crate_alpha:CrateAlphaConfig",
    "CrateAlphaModel": "hf_tdiag.models.crate_alpha:CrateAlphaModel",
    "CrateAlphaForImageClassification": "hf_tdiag.models.crate_alpha:CrateAlphaForImageClassification",
    "CrateAlphaImageProcessor": "hf_tdiag.models.crate_alpha:CrateAlphaImageProcessor",
    "convert_official_crate_alpha": "hf_tdiag.models.crate_alpha.convert_official:convert_official_crate_alpha",
    "TostConfig": "hf_tdiag.models.tost:TostConfig",
    "TostModel": "hf_tdiag.models.tost:TostModel",
    "TostForImageClassification": "hf_tdiag.models.tost:TostForImageClassification",
    "TostImageProcessor": "hf_tdiag.models.tost:TostImageProcessor",
    "CrateMAEConfig": "hf_tdiag.models.crate_mae:CrateMAEConfig",
    "CrateMAEModel": "hf_tdiag.models.crate_mae:CrateMAEModel",
    "CrateMAEForPreTraining": "hf_tdiag.models.crate_mae:CrateMAEForPreTraining",
    "CrateMAEForImageClassification": "hf_tdiag.models.crate_mae:CrateMAEForImageClassification",
    "convert_official_crate_mae": "hf_tdiag.models.crate_mae.convert_official:convert_official_crate_mae",
    "CrateTextConfig": "hf_tdiag.models.crate_text:CrateTextConfig",
    "CrateTextModel": "hf_tdiag.models.crate_text:CrateTextModel",
    "CrateTextForMaskedLM": "hf_tdiag.models.crate_text:CrateTextForMaskedLM",
    "CrateTextForCausalLM": "hf_tdiag.models.crate_text:CrateTextForCausalLM",
    "CrateTextForSequenceClassification": "hf_tdiag.models.crate_text:CrateTextForSequenceClassification",
    "CrateTextForTokenClassification": "hf_tdiag.models.crate_text:CrateTextForTokenClassification",
    "CrateTextForQuestionAnswering": "hf_tdiag.models.crate_text:CrateTextForQuestionAnswering",
    "CrateTextForMultipleChoice": "hf_tdiag.models.crate_text:CrateTextForMultipleChoice",
    "convert_pr_crate": "hf_tdiag.models.crate_text:convert_pr_crate",
    "convert_crate_lm": "hf_tdiag.models.crate_text:convert_crate_lm",
    "objective_ledger": "hf_tdiag.diagnostics.objective_ledger:objective_ledger",
    "ObjectiveLedgerReport": "hf_tdiag.diagnostics.objective_ledger:ObjectiveLedgerReport",
    "layer_srr": "hf_tdiag.diagnostics.srr:layer_srr",
    "schatten_bounds": "hf_tdiag.diagnostics.schatten:schatten_bounds",
    "concept_fidelity": "hf_tdiag.diagnostics.concept_fidelity.fidelity:concept_fidelity",
    "attention_svm_diagnostic": "hf_tdiag.diagnostics.attention_svm:attention_svm_diagnostic",
    "SRRReport": "hf_tdiag.diagnostics.srr_report:SRRReport",
    "SchattenReport": "hf_tdiag.diagnostics.schatten_report:SchattenReport",
    "ConceptFidelityReport": "hf_tdiag.diagnostics.concept_fidelity.report:ConceptFidelityReport",
    "AttentionSVMReport": "hf_tdiag.diagnostics.attention_svm_report:AttentionSVMReport",
    "SRRSettings": "hf_tdiag.diagnostics.settings:SRRSettings",
    "SchattenSettings": "hf_tdiag.diagnostics.settings:SchattenSettings",
    "ConceptFidelitySettings": "hf_tdiag.diagnostics.settings:ConceptFidelitySettings",
    "AttentionSVMSettings": "hf_tdiag.diagnostics.settings:AttentionSVMSettings",
    "ObjectiveLedgerSettings": "hf_tdiag.diagnostics.settings:ObjectiveLedgerSettings",
    "token_snr": "hf_tdiag.diagnostics.token_snr:token_snr",
    "TokenSNRReport": "hf_tdiag.diagnostics.token_snr_report:TokenSNRReport",
    "TokenSNRSettings": "hf_tdiag.diagnostics.settings:TokenSNRSettings",
    "scan": "hf_tdiag.zoo:scan",
}


def metric_path(name: str) -> str:
    """Local path of a bundled ``evaluate`` module, for ``evaluate.load(metric_path(name))``.

    Examples:
        >>> import os, hf_tdiag
        >>> path = hf_tdiag.metric_path("srr")
        >>> os.path.basename(path), os.path.isfile(os.path.join(path, "srr.py"))
        ('srr', True)
        >>> hf_tdiag.metric_path("accuracy")
        Traceback (most recent call last):
            ...
        ValueError: metric_path: unknown metric 'accuracy'; available: [...]
    """
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics", name)
    script = os.path.join(here, f"{name}.py")
    if not os.path.isfile(script):
        available = sorted(
            d
            for d in os.listdir(os.path.dirname(here))
            if os.path.isfile(os.path.join(os.path.dirname(here), d, f"{d}.py"))
        )
        raise ValueError(f"metric_path: unknown metric {name!r}; available: {available}")
    return here


__getattr__ = _lazy_exports(__name__, _LAZY, globals())


__all__ = ["__version__", "metric_path", *_LAZY]

# last: the model modules the registration imports may import from a complete hf_tdiag (their card mixin)
if "hf_tdiag_cli" not in sys.modules:  # the console script registers once it has parsed (--help stays torch-free)
    _register_all()
