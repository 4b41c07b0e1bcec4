"""Text CRATE (model type ``crate_text``): masked and causal CRATE language models and the Transformers task heads.

The classes are imported on first access; ``import hf_tdiag`` registers them with the Auto classes
(``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.crate_text"
_LAZY = {
    **FAMILIES["crate_text"].exports(),
    "CRATE_TEXT_PRESETS": f"{_HERE}.configuration_crate_text:CRATE_TEXT_PRESETS",
    "CRATE_TEXT_BLOCKS": f"{_HERE}.configuration_crate_text:CRATE_TEXT_BLOCKS",
    "CrateTextModelOutput": f"{_HERE}.modeling_crate_text_blocks:CrateTextModelOutput",
    "CrateTextPreTrainedModel": f"{_HERE}.modeling_crate_text_blocks:CrateTextPreTrainedModel",
    "convert_pr_crate": f"{_HERE}.convert_official:convert_pr_crate",
    "convert_crate_lm": f"{_HERE}.convert_official:convert_crate_lm",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
