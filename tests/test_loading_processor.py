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


def _crate_processor(channels):
    from hf_tdiag.models.crate import CrateConfig, CrateImageProcessor

    config = CrateConfig(
        image_size=8, patch_size=4, num_channels=channels, hidden_size=8, num_hidden_layers=1, num_attention_heads=2
    )
    return CrateImageProcessor.for_config(config)


def test_crate_processor_turns_rgb_into_the_grey_a_one_channel_model_expects():
    rgb = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    processor = _crate_processor(1)
    from_pil = processor(Image.fromarray(rgb, mode="RGB"), return_tensors="pt")["pixel_values"]
    grey = np.asarray(Image.fromarray(rgb, mode="RGB").convert("L"), dtype=np.float64)  # PIL's own conversion
    assert tuple(from_pil.shape) == (1, 1, 8, 8)
    np.testing.assert_allclose(from_pil[0, 0].numpy(), (grey / 255 - 0.5) / 0.5, atol=1e-6)
    from_array = processor(rgb, return_tensors="pt")["pixel_values"]  # an (H, W, 3) array: ITU-R 601 luma
    luma = np.rint(rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114)
    np.testing.assert_allclose(from_array[0, 0].numpy(), (luma / 255 - 0.5) / 0.5, atol=1e-6)


def test_crate_processor_repeats_grey_for_an_rgb_model():
    grey = np.random.default_rng(2).integers(0, 256, (8, 8), dtype=np.uint8)
    processor = _crate_processor(3)
    for image in (Image.fromarray(grey, mode="L"), grey[..., None]):  # a PIL image and an (H, W, 1) array
        pixels = processor(image, return_tensors="pt")["pixel_values"][0].numpy()
        assert pixels.shape == (3, 8, 8)
        mean, std = np.array(processor.image_mean), np.array(processor.image_std)
        expected = (grey[None] / 255 - mean[:, None, None]) / std[:, None, None]
        np.testing.assert_allclose(pixels, expected, atol=1e-5)


def test_crate_processor_refuses_a_channel_count_it_cannot_convert():
    from hf_tdiag.models.crate.image_processing_crate import match_channels

    with pytest.raises(ValueError, match="expects 3 channel"):
        match_channels(np.zeros((2, 4, 4)), 3)
