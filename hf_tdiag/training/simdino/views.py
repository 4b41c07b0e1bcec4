"""Multi-crop views (2 global + a few local crops) of a batch of image tensors, as DINO and SimDINO train on.

Each view of each image is a random resized crop (:func:`hf_tdiag.training.augment.random_resized_crop_box`, area
fraction in ``global_scale`` or ``local_scale``), resampled bilinearly to the model's input size (or ``local_size``
for local crops when the backbone interpolates its position embeddings), optionally mirrored. The authors crop
global views at 224 px and local views at 96 px and add colour jitter, blur and solarisation; here every view is cut
from the tensors the trainer already reads (digits: 8×8 upsampled to the preset's size), so local crops default to
the global size (backbones with fixed position embeddings, CRATE among them, take one size) and no colour
augmentation is applied. The boxes come from a numpy generator the caller seeds (per step: resumable).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..augment import random_resized_crop_box


def _scale(value, name: str) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    if not 0 < low <= high <= 1:
        raise ValueError(f"{name}: expected 0 < low <= high <= 1, got {tuple(value)!r}")
    return low, high


@dataclass
class MultiCrop:
    """``views(pixel_values, rng)`` → list of ``n_global + n_local`` tensors, the global views first."""

    size: tuple[int, int]
    n_global: int = 2
    n_local: int = 4
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    local_size: tuple[int, int] | None = None
    hflip: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.n_global, int) and self.n_global >= 1):
            raise ValueError(f"n_global: expected a positive int, got {self.n_global!r}")
        if not (isinstance(self.n_local, int) and self.n_local >= 0):
            raise ValueError(f"n_local: expected an int >= 0, got {self.n_local!r}")
        if not 0.0 <= self.hflip <= 1.0:
            raise ValueError(f"hflip: expected a probability in [0, 1], got {self.hflip!r}")
        self.global_scale = _scale(self.global_scale, "global_scale")
        self.local_scale = _scale(self.local_scale, "local_scale")
        self.size = tuple(self.size)
        self.local_size = self.size if self.local_size is None else tuple(self.local_size)

    @property
    def n_crops(self) -> int:
        return self.n_global + self.n_local

    def shapes(self, batch: int, channels: int) -> list[tuple[int, int, int, int]]:
        """The declared shape of each view."""
        g, loc = (batch, channels, *self.size), (batch, channels, *self.local_size)
        return [g] * self.n_global + [loc] * self.n_local

    def boxes(self, batch: int, height: int, width: int, rng: np.random.Generator, local: bool) -> np.ndarray:
        """``(batch, 5)``: ``left, top, right, bottom, flip`` of one view's crop per image."""
        scale = self.local_scale if local else self.global_scale
        out = np.zeros((batch, 5))
        for b in range(batch):
            out[b, :4] = random_resized_crop_box(width, height, rng, scale)
            out[b, 4] = rng.random() < self.hflip
        return out

    def crop(self, pixel_values: torch.Tensor, boxes: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
        """Resample each image's box (pixel edges, ``boxes`` from :meth:`boxes`) to ``size``, bilinearly."""
        _, _, H, W = pixel_values.shape
        b = torch.as_tensor(boxes, dtype=pixel_values.dtype, device=pixel_values.device)
        sx, sy = (b[:, 2] - b[:, 0]) / W, (b[:, 3] - b[:, 1]) / H
        cx, cy = (b[:, 0] + b[:, 2]) / W - 1, (b[:, 1] + b[:, 3]) / H - 1
        sx = torch.where(b[:, 4] > 0, -sx, sx)
        zero = torch.zeros_like(sx)
        theta = torch.stack([torch.stack([sx, zero, cx], -1), torch.stack([zero, sy, cy], -1)], 1)
        grid = F.affine_grid(theta, [len(b), pixel_values.shape[1], *size], align_corners=False)
        return F.grid_sample(pixel_values, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def __call__(self, pixel_values: torch.Tensor, rng: np.random.Generator) -> list[torch.Tensor]:
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4:
            raise ValueError(f"pixel_values: expected a (batch, channels, height, width) tensor, got {pixel_values!r}")
        B, _, H, W = pixel_values.shape
        views = []
        for i in range(self.n_crops):
            local = i >= self.n_global
            boxes = self.boxes(B, H, W, rng, local)
            views.append(self.crop(pixel_values, boxes, self.local_size if local else self.size))
        return views


__all__ = ["MultiCrop"]
