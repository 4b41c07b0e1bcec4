"""CRATE (Coding RAte reduction TransformEr) as a native Transformers model family.

The classes are imported on first access (``from hf_tdiag.models.crate import CrateConfig``), so that importing
the package stays cheap; ``import hf_tdiag`` registers them with the Auto classes (``hf_tdiag.models.families``).
"""

from __future__ import annotations

from ..._lazy import lazy_exports
from ..families import FAMILIES

_HERE = "hf_tdiag.models.crate"
_LAZY = {
    **FAMILIES["crate"].exports(),
    "CRATE_PRESETS": f"{_HERE}.configuration_crate:CRATE_PRESETS",
    "CRATE_VARIANTS": f"{_HERE}.configuration_crate:CRATE_VARIANTS",
    "size_pair": f"{_HERE}.configuration_crate:size_pair",
    "CrateModelOutput": f"{_HERE}.modeling_crate:CrateModelOutput",
    "CrateImageClassifierOutput": f"{_HERE}.modeling_crate:CrateImageClassifierOutput",
    "CratePreTrainedModel": f"{_HERE}.modeling_crate:CratePreTrainedModel",
    "convert_official_crate": f"{_HERE}.convert_official:convert_official_crate",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
