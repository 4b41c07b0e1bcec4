"""A vision model saved without an image processor gets one matching its channel count."""

import numpy as np
import pytest
from PIL import Image
from transformers import ViTConfig, ViTForImageClassification

from hf_tdiag.loading import load_model, pixel_values_for


@pytest.mark.parametrize("channels,mode", [(1, "L"), (3, "RGB")])
def test_fallback_processor_matches_channels(tmp_path, channels, mode):
    cfg = ViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=8,
        patch_size=4,
        num_channels=channels,
        num_labels=3,
    )
    ViTForImageClassification(cfg).save_pretrained(tmp_path)  # no preprocessor_config.json
    loaded = load_model(str(tmp_path))
    image = Image.fromarray(np.full((8, 8, 3) if channels == 3 else (8, 8), 255, dtype=np.uint8), mode=mode)
    pixels = pixel_values_for([image], loaded)
    assert tuple(pixels.shape) == (1, channels, 8, 8)
    expected = (1.0 - 0.5) / 0.5 if channels == 1 else None
    if expected is not None:  # white pixel, mean 0.5, std 0.5
        assert float(pixels.min()) == pytest.approx(expected)
    loaded.model(pixel_values=pixels)  # the model accepts what the processor made
