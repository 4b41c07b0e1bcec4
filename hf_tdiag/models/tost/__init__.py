"""ToST (Token Statistics Transformer, Wu et al. 2025) as a native Transformers model family.

Classes are imported on first access; ``import hf_tdiag`` registers them with the Auto classes
(``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.tost"
_LAZY = {
    **FAMILIES["tost"].exports(),
    "TOST_PRESETS": f"{_HERE}.configuration_tost:TOST_PRESETS",
    "TostPreTrainedModel": f"{_HERE}.modeling_tost:TostPreTrainedModel",
    "token_statistics_attention": f"{_HERE}.modeling_tost:token_statistics_attention",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
