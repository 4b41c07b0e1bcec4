"""SimDINO / SimDINOv2 (Wu et al. 2025) checkpoints converted into Transformers' own ViT / Dinov2 classes.

SimDINO trains a plain ViT backbone, so this folder holds a converter only, not a model family: the converted
folders load with ``AutoModel`` as ``ViTModel``, ``Dinov2Model`` or ``Dinov2WithRegistersModel``.
"""

from __future__ import annotations

from ..._lazy import lazy_exports

_HERE = "hf_tdiag.models.simdino.convert_official"
_LAZY = {
    "SIMDINO_LAYOUTS": f"{_HERE}:SIMDINO_LAYOUTS",
    "split_simdino_checkpoint": f"{_HERE}:split_simdino_checkpoint",
    "convert_simdino": f"{_HERE}:convert_simdino",
}

__getattr__ = lazy_exports(__name__, _LAZY, globals())

__all__ = list(_LAZY)
