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


def test_text_lines_reads_non_empty_lines_and_names_bad_files(tmp_path):
    from hf_tdiag.data_inputs import text_lines

    path = tmp_path / "t.txt"
    path.write_text("  first \n\n second\nthird\n", encoding="utf-8")
    assert text_lines(path) == ["first", "second", "third"]
    assert text_lines(path, 2) == ["first", "second"]
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no non-empty lines"):
        text_lines(tmp_path / "blank.txt")
    with pytest.raises(ValueError, match="expected a text file"):
        text_lines(tmp_path / "missing.txt")
