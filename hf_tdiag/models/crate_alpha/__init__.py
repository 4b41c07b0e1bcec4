"""CRATE-α (Yang et al. 2024) as a native Transformers model family.

Classes are imported on first access; ``import hf_tdiag`` registers them with the Auto classes
(``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.crate_alpha"
_LAZY = {
    **FAMILIES["crate-alpha"].exports(),
    "CRATE_ALPHA_PRESETS": f"{_HERE}.configuration_crate_alpha:CRATE_ALPHA_PRESETS",
    "CrateAlphaPreTrainedModel": f"{_HERE}.modeling_crate_alpha:CrateAlphaPreTrainedModel",
    "convert_official_crate_alpha": f"{_HERE}.convert_official:convert_official_crate_alpha",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
