"""PIL-based image processor for CRATE-MAE (no torchvision needed).

Imports only transformers so that ``save_pretrained`` can ship it for ``trust_remote_code``.
"""

from __future__ import annotations

from transformers.image_processing_backends import PilBackend
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling


class CrateMAEImageProcessor(PilBackend):
    r"""Resize to ``size``, rescale to [0, 1], normalize with ImageNet mean/std.

    Returns ``pixel_values`` ``(batch, channels, height, width)``; :meth:`for_config` matches a config's image size
    and channel count (one channel: mean = std = 0.5).
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
    def for_config(cls, config, **kwargs) -> CrateMAEImageProcessor:
        """Processor whose output size and channel count match ``config``; kwargs override."""
        height = width = int(config.image_size)
        fields = {"size": {"height": int(height), "width": int(width)}}
        if config.num_channels == 1:
            fields.update(image_mean=[0.5], image_std=[0.5], do_convert_rgb=False)
        elif config.num_channels != 3:
            fields.update(image_mean=[0.5] * config.num_channels, image_std=[0.5] * config.num_channels)
        fields.update(kwargs)
        return cls(**fields)


__all__ = ["CrateMAEImageProcessor"]
