"""CRATE-MAE (Pai et al., ICLR 2024) as a native Transformers model family.

Classes are imported on first access; ``import hf_tdiag`` registers them with the Auto classes
(``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.crate_mae"
_LAZY = {
    **FAMILIES["crate-mae"].exports(),
    "CRATE_MAE_PRESETS": f"{_HERE}.configuration_crate_mae:CRATE_MAE_PRESETS",
    "CrateMAEPreTrainedModel": f"{_HERE}.modeling_crate_mae:CrateMAEPreTrainedModel",
    "convert_official_crate_mae": f"{_HERE}.convert_official:convert_official_crate_mae",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
