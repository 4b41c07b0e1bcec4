"""Bad inputs to the model-running evaluate modules get errors naming the argument."""

import evaluate
import pytest
import torch
from PIL import Image

import hf_tdiag


@pytest.mark.parametrize("name", ["srr", "attention_svm", "concept_fidelity"])
def test_input_errors_name_the_problem(name):
    module = evaluate.load(hf_tdiag.metric_path(name))
    image = Image.new("L", (8, 8))
    with pytest.raises(ValueError, match=rf"{name}: give one of images, texts or pixel_values"):
        module.compute(images=[image], texts=["a"], model="unused")
    features = module._info().features
    # strings first, then images (concept_fidelity takes texts for BERT-like encoders too)
    assert [type(f["inputs"]).__name__ for f in features] == ["Value", "Image"]
    with pytest.raises(ValueError, match="not predictions/references"):
        module.compute(predictions=[1], model="unused")
    with pytest.raises(ValueError, match=r"pixel_values: expected a tensor of shape \(B, C, H, W\), got \(3, 8, 8\)"):
        module.compute(pixel_values=torch.zeros(3, 8, 8), model="unused")


def test_text_lines_reads_non_empty_lines_and_names_bad_files(tmp_path):
    from hf_tdiag.inputs import text_lines

    path = tmp_path / "t.txt"
    path.write_text("  first \n\n second\nthird\n", encoding="utf-8")
    assert text_lines(path) == ["first", "second", "third"]
    assert text_lines(path, 2) == ["first", "second"]
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no non-empty lines"):
        text_lines(tmp_path / "blank.txt")
    with pytest.raises(ValueError, match="expected a text file"):
        text_lines(tmp_path / "missing.txt")


def test_model_and_inputs_loads_once_and_batches_lazily(tmp_path):
    """The mixin's loader: pixel_values pass through, images go through the processor, batch_size gives lazy batches."""
    from hf_tdiag.inputs import LazyBatches, digits_images
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification

    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1))
    module = evaluate.load(hf_tdiag.metric_path("srr"))
    pixels = torch.zeros(2, 1, 16, 16)
    got, batch, tokenizer = module._model_and_inputs(model, None, pixels)
    assert batch is pixels and got is model and tokenizer is None
    images = digits_images(limit=5).images
    _, lazy, _ = module._model_and_inputs(model, images, None, batch_size=2)
    assert isinstance(lazy, LazyBatches) and [b.shape[0] for b in lazy] == [2, 2, 1]
    _, one, _ = module._model_and_inputs(model, images, None)
    assert torch.equal(one, torch.cat(list(lazy)))
    with pytest.raises(ValueError, match="srr: no inputs; pass images=, texts=, pixel_values="):
        module._model_and_inputs(model, [], None)
    with pytest.raises(ValueError, match="model: expected a Transformers model"):
        module._model_and_inputs(None, images, None)
    with pytest.raises(ValueError, match="texts: .* is an image model; pass images= or pixel_values="):
        module._model_and_inputs(model, ["a text"], None)
