"""The attention-only transformer (AoT, Wang et al., ICML 2025) as native Transformers model families: the vision
model (``aot``) and the causal language model (``aot_text``).

The classes are imported on first access; ``import hf_tdiag`` registers them with the Auto classes
(``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.aot"
_LAZY = {
    **FAMILIES["aot"].exports(),
    **FAMILIES["aot_text"].exports(),
    "AOT_PRESETS": f"{_HERE}.configuration_aot:AOT_PRESETS",
    "AOT_TEXT_PRESETS": f"{_HERE}.configuration_aot:AOT_TEXT_PRESETS",
    "AotPreTrainedModel": f"{_HERE}.modeling_aot:AotPreTrainedModel",
    "AotTextPreTrainedModel": f"{_HERE}.modeling_aot_text:AotTextPreTrainedModel",
    "AotModelOutput": f"{_HERE}.modeling_aot:AotModelOutput",
    "AotTextModelOutput": f"{_HERE}.modeling_aot_text:AotTextModelOutput",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
