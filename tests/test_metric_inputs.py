"""Bad inputs to the model-running evaluate modules get errors naming the argument."""

import evaluate
import pytest
import torch
from PIL import Image

import hf_tdiag


@pytest.mark.parametrize("name", ["srr", "attention_svm"])
def test_input_errors_name_the_problem(name):
    module = evaluate.load(hf_tdiag.metric_path(name))
    image = Image.new("L", (8, 8))
    with pytest.raises(ValueError, match=rf"{name}: give one of images, texts or pixel_values"):
        module.compute(images=[image], texts=["a"], model="unused")
    with pytest.raises(ValueError, match="not predictions/references"):
        module.compute(predictions=[1], model="unused")
    with pytest.raises(ValueError, match=r"pixel_values: expected a tensor of shape \(B, C, H, W\), got \(3, 8, 8\)"):
        module.compute(pixel_values=torch.zeros(3, 8, 8), model="unused")
