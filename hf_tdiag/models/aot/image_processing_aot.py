"""PIL-based image processor for AoT (no torchvision needed).

Imports only transformers so that ``save_pretrained`` can ship it for ``trust_remote_code``.
"""

from __future__ import annotations

import numpy as np
from transformers.image_processing_backends import PilBackend
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling

from .configuration_aot import size_pair


class AotImageProcessor(PilBackend):
    r"""Resize to ``size``, rescale to [0, 1] and normalize with ImageNet mean/std (CRATE's pipeline).

    Returns ``pixel_values`` of shape ``(batch, channels, height, width)``. Use :meth:`for_config` to get a
    processor matching an :class:`AotConfig` (image size and number of channels). Every image is first brought to
    the channel count the model expects (one per ``image_mean`` entry): an RGB image becomes grayscale ``L`` for a
    1-channel model and a grayscale image is repeated for an RGB one, so ``pipeline("image-classification")``,
    which hands over RGB images, works with grayscale checkpoints.
    """

    model_input_names = ["pixel_values"]
    resample = PILImageResampling.BICUBIC
    image_mean = IMAGENET_DEFAULT_MEAN
    image_std = IMAGENET_DEFAULT_STD
    size = {"height": 224, "width": 224}
    do_resize = True
    do_rescale = True
    do_normalize = True

    @classmethod
    def for_config(cls, config, **kwargs) -> AotImageProcessor:
        """Processor whose output size and channel count match ``config`` (an AotConfig); kwargs override."""
        height, width = size_pair(config.image_size, "image_size")
        fields = {"size": {"height": int(height), "width": int(width)}}
        if config.num_channels == 1:
            fields.update(image_mean=[0.5], image_std=[0.5], do_convert_rgb=False)
        elif config.num_channels != 3:
            fields.update(image_mean=[0.5] * config.num_channels, image_std=[0.5] * config.num_channels)
        fields.update(kwargs)
        return cls(**fields)

    @property
    def expected_channels(self) -> int | None:
        """Channels the model takes: one per ``image_mean`` entry (None when the mean is a scalar)."""
        mean = self.image_mean
        return len(mean) if isinstance(mean, (list, tuple)) else None

    def process_image(self, image, do_convert_rgb=None, input_data_format=None, **kwargs) -> np.ndarray:
        """One image, channel-first, with the channel count of :attr:`expected_channels`."""
        channels = self.expected_channels
        if channels in (1, 3) and hasattr(image, "mode") and hasattr(image, "convert"):  # a PIL image
            image = image.convert("L" if channels == 1 else "RGB")
            do_convert_rgb = False
        array = super().process_image(image, do_convert_rgb=do_convert_rgb, input_data_format=input_data_format)
        return match_channels(array, channels)


def match_channels(array: np.ndarray, channels: int | None) -> np.ndarray:
    """A channel-first ``(C, H, W)`` image with ``channels`` channels: grey repeated, RGB(A) to ITU-R 601 luma."""
    have = array.shape[0]
    if channels is None or have == channels:
        return array
    if have == 1:
        return np.repeat(array, channels, axis=0)
    if channels == 1 and have in (3, 4):
        luma = 0.299 * array[0] + 0.587 * array[1] + 0.114 * array[2]  # PIL's convert("L") weights
        return luma[None].astype(array.dtype) if np.issubdtype(array.dtype, np.floating) else np.rint(luma)[None]
    if channels == 3 and have == 4:
        return array[:3]
    raise ValueError(
        f"images: the model expects {channels} channel(s), got an image with {have}; convert the image first"
    )


__all__ = ["AotImageProcessor", "match_channels"]
