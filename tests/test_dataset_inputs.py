"""A ``datasets`` object whose columns are model inputs is accepted by every diagnostic that takes inputs, and gives
the numbers of the same samples passed as a tensor; a dataset that holds no model inputs, or rows of different
shapes, is refused with one line saying what to do."""

import datasets
import pytest
import torch

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.batching import dataset_batches, is_dataset


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2))
    x = torch.randn(6, 1, 8, 8)
    y = torch.tensor([0, 1, 0, 1, 0, 1])
    # a label column and a string column beside the model input: neither reaches the model
    ds = datasets.Dataset.from_dict({"pixel_values": x.numpy(), "label": y.numpy(), "name": list("abcdef")})
    return model.eval(), x, y, ds


def test_the_loader_yields_the_model_input_columns_in_order(setup):
    _, x, _, ds = setup
    assert is_dataset(ds) and is_dataset(ds.to_iterable_dataset()) and not is_dataset(x)
    batches = list(dataset_batches(ds, 4))
    assert [sorted(b) for b in batches] == [["pixel_values"], ["pixel_values"]]
    assert torch.equal(torch.cat([b["pixel_values"] for b in batches]), x)
    streamed = list(dataset_batches(ds.to_iterable_dataset(), 5))
    assert torch.equal(torch.cat([b["pixel_values"] for b in streamed]), x)


def test_srr_ledger_and_token_snr_equal_the_tensor_run(setup):
    model, x, y, ds = setup
    a = hf_tdiag.layer_srr(model, x, progress=False).to_pandas()
    b = hf_tdiag.layer_srr(model, ds, batch_size=4, progress=False).to_pandas()
    assert a.equals(b)
    # the same batches (4 + 2 samples) as the tensor cut by batch_size: the sums are taken in the same order
    assert (
        hf_tdiag.objective_ledger(model, ds, batch_size=4)
        .to_pandas()
        .equals(hf_tdiag.objective_ledger(model, x, batch_size=4).to_pandas())
    )
    snr = hf_tdiag.token_snr(model, x, y, batch_size=4).to_pandas()
    assert hf_tdiag.token_snr(model, ds, y, batch_size=4).to_pandas().equals(snr)


def test_attention_svm_and_concepts_read_the_whole_dataset(setup):
    model, x, _, ds = setup
    r1 = hf_tdiag.attention_svm_diagnostic(model, x, 1, 0, max_queries=4)
    r2 = hf_tdiag.attention_svm_diagnostic(model, ds, 1, 0, max_queries=4)
    keys = ("correlation", "margin_ratio", "num_queries")
    assert [r1.summary()[k] for k in keys] == [r2.summary()[k] for k in keys]
    torch.manual_seed(1)
    c1 = hf_tdiag.concept_fidelity(model, x, 1, 3, bounds=False, progress=False, batch_size=4)
    torch.manual_seed(1)
    c2 = hf_tdiag.concept_fidelity(model, ds, 1, 3, bounds=False, progress=False, batch_size=4)
    assert c1["n_images"] == c2["n_images"] == 6 and c1["kl"] == c2["kl"] and c1["delta_rec"] == c2["delta_rec"]


def test_a_dataset_without_model_inputs_or_with_ragged_rows_is_refused(setup):
    model, *_ = setup
    raw = datasets.Dataset.from_dict({"image": [[0, 1], [2, 3]], "label": [0, 1]})
    with pytest.raises(ValueError, match=r"inputs: the dataset's columns \['image', 'label'\] hold no model inputs"):
        hf_tdiag.layer_srr(model, raw, progress=False)
    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]})
    with pytest.raises(ValueError, match="rows differ in shape") as err:
        list(dataset_batches(ragged, 2))
    assert "padding='max_length'" in str(err.value) and "\n" not in str(err.value)
