"""Bad inputs -> a ValueError/TypeError (or a one-line CLI error) that names the input, never a traceback from
deep inside a library, never a silently wrong result. One parametrized case per input tried; the table of
outcomes before and after is in the closing note of issue 18."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

import hf_tdiag
from hf_tdiag.cli import main as cli_main
from hf_tdiag.measures import coding_rate, schatten
from hf_tdiag.measures.concepts import SemiNMF
from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny CRATE and a tiny BERT saved with save_pretrained, plus damaged copies and bad files."""
    from PIL import Image
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("bad")
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    CrateForImageClassification(cfg).save_pretrained(root / "crate")
    CrateImageProcessor.for_config(cfg).save_pretrained(root / "crate")
    BertModel(
        BertConfig(
            vocab_size=30,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
        )
    ).save_pretrained(root / "bert")
    # its tokenizer (a folder without one has none: hf_tdiag.loading.load_tokenizer), 30 words as the vocabulary
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxy"]
    (root / "bert" / "vocab.txt").write_text("\n".join(words))
    BertTokenizerFast(vocab_file=str(root / "bert" / "vocab.txt")).save_pretrained(root / "bert")
    shutil.copytree(root / "crate", root / "truncated")
    weights = (root / "truncated" / "model.safetensors").read_bytes()
    (root / "truncated" / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    shutil.copytree(root / "crate", root / "eps0")
    config = json.loads((root / "eps0" / "config.json").read_text())
    (root / "eps0" / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 0}))
    (root / "garbage_config").mkdir()
    (root / "garbage_config" / "config.json").write_text("{oops")
    (root / "zero_png").mkdir()
    (root / "zero_png" / "a.png").write_bytes(b"")
    (root / "empty.pth").write_bytes(b"")
    (root / "garbage.pth").write_bytes(bytes(range(256)) * 3)
    torch.save([1, 2, 3], root / "list.pth")
    torch.save({"foo": torch.zeros(2)}, root / "nokeys.pth")
    (root / "labels.json").write_text("{not json")
    (root / "afile").write_text("x")
    (root / "empty_dir").mkdir()
    Image.new("L", (8, 8)).save(root / "img.png")
    (root / "remote").mkdir()
    (root / "remote" / "config.json").write_text(
        json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "evil.Evil"}})
    )
    (root / "remote" / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    return root


# ----------------------------------------------------------------------------------------- configuration

CONFIG_CASES = [
    ({"ista_step_size": math.inf}, ValueError, "ista_step_size"),
    ({"ista_step_size": 0.0}, ValueError, "ista_step_size"),
    ({"layer_norm_eps": 0}, ValueError, "layer_norm_eps"),
    ({"num_attention_heads": 0}, ValueError, "num_attention_heads"),
    ({"hiden_size": 128}, TypeError, "'hiden_size' (did you mean 'hidden_size'?)"),
    ({"foo": 1}, TypeError, "'foo'"),
    ({"hidden_dropout_prob": math.nan}, ValueError, "hidden_dropout_prob"),
    ({"attention_probs_dropout_prob": 1.0}, ValueError, "attention_probs_dropout_prob"),
    ({"ista_lambda": math.inf}, ValueError, "ista_lambda"),
    ({"ista_lambda": -1}, ValueError, "ista_lambda"),
    ({"initializer_range": -0.1}, ValueError, "initializer_range"),
    ({"image_size": True}, TypeError, "image_size"),
    ({"patch_size": (2, True)}, TypeError, "patch_size"),
    ({"hidden_size": 64.0}, ValueError, "hidden_size"),
    ({"variant": ["crate"]}, ValueError, "variant"),
    ({"pooling": "max"}, ValueError, "pooling"),
]


@pytest.mark.parametrize("overrides, error, named", CONFIG_CASES, ids=[str(c[0]) for c in CONFIG_CASES])
def test_config_values_are_validated(overrides, error, named):
    with pytest.raises(error) as info:
        CrateConfig.from_preset("crate-digits", **overrides)
    assert named in str(info.value)


def test_from_preset_still_takes_pretrained_config_keywords():
    config = CrateConfig.from_preset("crate-digits", num_labels=3, output_attentions=True)
    assert config.num_labels == 3 and config.output_attentions


# ----------------------------------------------------------------------------------------- Schatten indices p

SIGMA = [3.0, 2.0, 1.0]
P_CALLS = {  # each function of measures/schatten.py that takes a Schatten index p (or a list of them, ps)
    "schatten_power": lambda p: schatten.schatten_power(SIGMA, p),
    "schatten_powers": lambda ps: schatten.schatten_powers(SIGMA, ps),
    "contributions": lambda ps: schatten.contributions(torch.ones(len(ps)), ps, 1.0, 1.0, 1, 4),
    "flip_factors": lambda ps: schatten.flip_factors(torch.ones(len(ps)), ps, 1.0, 4),
    "optimal_contribution": lambda ps: schatten.optimal_contribution(torch.ones(len(ps)), ps),
}
PS = "ps: expected Schatten indices p, finite numbers >= 0 (p = 0 counts the rank), got"
P_CASES = [
    ("schatten_power", "x", TypeError, "p: expected a finite number >= 0, got 'x'"),
    ("schatten_power", "2", TypeError, "p: expected a finite number >= 0, got '2'"),
    ("schatten_power", None, TypeError, "p: expected a finite number >= 0, got None"),
    ("schatten_power", True, TypeError, "p: expected a finite number >= 0, got True"),
    ("schatten_power", [2.0], TypeError, "p: expected a finite number >= 0, got [2.0]"),
    ("schatten_power", math.nan, ValueError, "p: expected a finite number >= 0, got nan"),
    ("schatten_power", math.inf, ValueError, "p: expected a finite number >= 0, got inf"),
    ("schatten_power", -0.5, ValueError, "p: expected a finite number >= 0, got -0.5"),
    ("schatten_powers", ["x"], TypeError, f"{PS} ['x']"),
    ("schatten_powers", [1.0, True], TypeError, f"{PS} [1.0, True]"),
    ("schatten_powers", [1.0, math.nan], ValueError, f"{PS} nan at index (1,)"),
    ("schatten_powers", [0.0, 1.0, -2.0], ValueError, f"{PS} -2.0 at index (2,)"),
    ("contributions", [0.5, -1.0], ValueError, f"{PS} -1.0 at index (1,)"),
    ("flip_factors", [math.inf], ValueError, f"{PS} inf at index (0,)"),
    ("optimal_contribution", ["0.5"], TypeError, f"{PS} ['0.5']"),
    ("schatten_powers", [-1.0, math.nan], ValueError, f"{PS} -1.0 at index (0,)"),  # two bad values: the first
    ("schatten_powers", None, TypeError, "ps: expected a torch.Tensor or numpy array, got NoneType"),
]


@pytest.mark.parametrize("function, p, error, named", P_CASES, ids=[f"{c[0]}-{c[1]!r}" for c in P_CASES])
def test_schatten_index_p_is_named_with_its_value(function, p, error, named):
    with pytest.raises(error) as info:
        P_CALLS[function](p)
    assert named in str(info.value)


def test_schatten_index_p_boundaries_are_accepted():
    # p = 0 counts the rank (the paper's grid starts there); one index in a 0-d tensor or array is a number
    assert float(schatten.schatten_power(SIGMA, 0)) == 3.0
    assert float(schatten.schatten_power(SIGMA, torch.tensor(2.0))) == 14.0
    assert float(schatten.schatten_power(SIGMA, np.float32(1.0))) == 6.0
    assert schatten.schatten_powers(SIGMA, 2.0).tolist() == [14.0]  # one index outside a list
    assert schatten.schatten_powers(SIGMA, torch.tensor(1.0)).tolist() == [6.0]


@pytest.mark.parametrize("p", [-1.0, torch.tensor(-1.0), np.float64(-1.0)], ids=["float", "0-d tensor", "np.float64"])
def test_one_bad_index_outside_a_list_is_named_without_an_index(p):
    with pytest.raises(ValueError) as info:
        schatten.schatten_powers(SIGMA, p)
    assert str(info.value) == f"{PS} -1.0"


# ----------------------------------------------------------------------------------------- Semi-NMF concepts


def _fitted(gram_weight=0.0):
    torch.manual_seed(0)
    return SemiNMF(2, gram_weight=gram_weight, max_iter=2, refine_iter=2).fit(torch.randn(3, 4, 5))


MIN = "n_concepts: expected at most min(rows, d) = "
SEMI_NMF_CASES = [
    ("n_concepts 0", lambda: SemiNMF(0), ValueError, "n_concepts: expected a positive integer, got 0"),
    ("gram_weight -1", lambda: SemiNMF(2, gram_weight=-1.0), ValueError, "gram_weight: expected a finite number"),
    ("max_iter -1", lambda: SemiNMF(2, max_iter=-1), ValueError, "max_iter: expected an integer >= 0, got -1"),
    ("refine_iter -1", lambda: SemiNMF(2, refine_iter=-1), ValueError, "refine_iter: expected an integer >= 0"),
    ("init pca", lambda: SemiNMF(2, init="pca"), ValueError, "init: expected one of"),
    ("dtype int64", lambda: SemiNMF(2, dtype=torch.int64), TypeError, "dtype: expected torch.float32, torch.float64"),
    ("encode_tol 0", lambda: SemiNMF(2, encode_tol=0.0), ValueError, "encode_tol: expected a positive number, got 0.0"),
    ("A 1-D", lambda: SemiNMF(2).fit(torch.randn(5)), ValueError, "A: expected shape"),
    ("A zeros", lambda: SemiNMF(2).fit(torch.zeros(6, 4)), ValueError, "A: all activations are zero"),
    ("k > d", lambda: SemiNMF(4).fit(torch.randn(8, 3)), ValueError, MIN + "min(8, 3) = 3"),
    ("k > rows", lambda: SemiNMF(4).fit(torch.randn(3, 8)), ValueError, MIN + "min(3, 8) = 3"),
    ("k > d, 3-D", lambda: SemiNMF(4).fit(torch.randn(2, 6, 3)), ValueError, MIN + "min(12, 3) = 3"),
    ("gram rows", lambda: SemiNMF(2, gram_weight=0.5).fit(torch.randn(20, 6)), ValueError, "A: gram_weight > 0"),
    ("not fitted", lambda: SemiNMF(2).transform(torch.randn(4, 5)), ValueError, "not fitted yet"),
    ("transform d", lambda: _fitted().transform(torch.randn(4, 6)), ValueError, "A: expected 5 features"),
    ("transform rows", lambda: _fitted(0.5).transform(torch.randn(4, 5)), ValueError, "A: gram_weight > 0 needs"),
    ("inverse k", lambda: _fitted().inverse_transform(torch.rand(4, 3)), ValueError, "U: expected 2 concepts"),
]


@pytest.mark.parametrize("call, error, named", [c[1:] for c in SEMI_NMF_CASES], ids=[c[0] for c in SEMI_NMF_CASES])
def test_semi_nmf_arguments_are_named(call, error, named):
    with pytest.raises(error) as info:
        call()
    assert named in str(info.value)


def test_config_json_with_bad_values_is_named(folders):
    with pytest.raises(ValueError, match="layer_norm_eps"):
        CrateConfig.from_pretrained(folders / "eps0")
    from hf_tdiag.loading import load_model

    with pytest.raises(ValueError) as info:
        load_model(str(folders / "eps0"))
    assert str(folders / "eps0" / "config.json") in str(info.value) and "layer_norm_eps" in str(info.value)
    assert "remote" not in str(info.value)  # not mistaken for a custom-code repository


# ----------------------------------------------------------------------------------------- model files


@pytest.mark.parametrize("what", ["load_model", "schatten_bounds"])
def test_truncated_safetensors_is_named(folders, what):
    from hf_tdiag.loading import load_model

    fn = load_model if what == "load_model" else hf_tdiag.schatten_bounds
    with pytest.raises(ValueError) as info:
        fn(str(folders / "truncated"))
    assert str(folders / "truncated" / "model.safetensors") in str(info.value)


def test_unreadable_config_json_is_named(folders):
    with pytest.raises(ValueError) as info:
        hf_tdiag.schatten_bounds(str(folders / "garbage_config"))
    assert str(folders / "garbage_config" / "config.json") in str(info.value)
    assert "Hub" not in str(info.value)


def test_schatten_bounds_of_a_config_file(folders):
    with pytest.raises(ValueError) as info:
        hf_tdiag.schatten_bounds(str(folders / "crate" / "config.json"))
    assert str(folders / "crate" / "config.json") in str(info.value)


# ----------------------------------------------------------------------------------------- inputs


@pytest.fixture(scope="module")
def crate(folders):
    return CrateForImageClassification.from_pretrained(folders / "crate").eval()


@pytest.mark.parametrize(
    "pixels, error, named",
    [
        (torch.full((2, 1, 8, 8), math.nan), ValueError, "pixel_values: contains NaN at index (0, 0, 0, 0)"),
        (torch.full((2, 1, 8, 8), math.inf), ValueError, "pixel_values: contains inf"),
        (torch.ones(2, 1, 8, 8, dtype=torch.int64), TypeError, "pixel_values must be floating point"),
        (torch.rand(1, 8, 8), ValueError, "pixel_values"),
        (torch.rand(0, 1, 8, 8), ValueError, "inputs"),
    ],
    ids=["nan", "inf", "int", "3-D", "empty"],
)
def test_layer_srr_names_the_bad_pixels(crate, pixels, error, named, one_torch_thread):
    with pytest.raises(error) as info:
        hf_tdiag.layer_srr(crate, pixels, progress=False)
    assert named in str(info.value) and "Z:" not in str(info.value)


def test_layernorm_on_a_post_ln_model_warns(folders, one_torch_thread):
    from transformers import BertModel

    bert = BertModel.from_pretrained(folders / "bert").eval()
    with pytest.warns(UserWarning, match="apply_layernorm: bert has no pre-attention LayerNorm"):
        report = hf_tdiag.layer_srr(
            bert, {"input_ids": torch.randint(0, 30, (2, 5))}, apply_layernorm=True, progress=False
        )
    assert report.settings["layernorm_applied"] is False


def test_empty_inputs_of_the_evaluate_modules(crate):
    import evaluate

    for name, kwargs in (
        ("srr", {}),
        ("concept_fidelity", {"layer": 1, "n_concepts": 2}),
        ("attention_svm", {"layer": 0}),
    ):
        with pytest.raises(ValueError, match="images: expected at least one input, got an empty list"):
            evaluate.load(hf_tdiag.metric_path(name)).compute(model=crate, images=[], **kwargs)


def test_eps_whose_square_overflows(crate):
    for eps in (1e308, 1e-200):
        with pytest.raises(ValueError, match="eps: expected a value whose square"):
            hf_tdiag.layer_srr(crate, torch.rand(2, 1, 8, 8), eps=eps, progress=False)
        with pytest.raises(ValueError, match="eps: expected a value whose square"):
            coding_rate(torch.rand(2, 4, 3), eps=eps)


def test_texts_for_an_image_model_in_the_srr_module(crate):
    import evaluate

    with pytest.raises(ValueError, match="texts: .* is an image model"):
        evaluate.load(hf_tdiag.metric_path("srr")).compute(model=crate, texts=["a b"])


def test_concept_fidelity_on_an_empty_batch(crate):
    with pytest.raises(ValueError, match="inputs: expected at least one image, got an empty batch"):
        hf_tdiag.concept_fidelity(crate, torch.rand(0, 1, 8, 8), 1, 2)


def test_digits_split_is_checked():
    from hf_tdiag.inputs import load_images

    with pytest.raises(ValueError, match="split: expected None, 'train' or 'test' for the digits, got 'nope'"):
        load_images("digits", split="nope")
    assert len(load_images("digits", split="test", limit=3).images) == 3


# ----------------------------------------------------------------------------------------- command line


def _cli(argv, capsys):
    try:
        code = cli_main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


CLI_CASES = [
    # (id, argv with {root} for the fixture folder, exit code, text the error must contain)
    (
        "convert empty file",
        ["convert-official", "{root}/empty.pth", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "{root}/empty.pth' is empty",
    ),
    (
        "convert garbage",
        ["convert-official", "{root}/garbage.pth", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "cannot read '{root}/garbage.pth'",
    ),
    (
        "convert folder",
        ["convert-official", "{root}/empty_dir", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "'{root}/empty_dir' is a folder",
    ),
    (
        "convert missing",
        ["convert-official", "{root}/nope.pth", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "no such file '{root}/nope.pth'",
    ),
    (
        "convert list",
        ["convert-official", "{root}/list.pth", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "'{root}/list.pth': state_dict must be a mapping",
    ),
    (
        "convert no head",
        ["convert-official", "{root}/nokeys.pth", "--preset", "crate-digits", "--output-dir", "{root}/converted"],
        1,
        "'{root}/nokeys.pth' has no 'mlp_head.1.weight'",
    ),
    (
        "convert truncated safetensors",
        [
            "convert-official",
            "{root}/truncated/model.safetensors",
            "--preset",
            "crate-digits",
            "--output-dir",
            "{root}/converted",
        ],
        1,
        "cannot read '{root}/truncated/model.safetensors' as a safetensors file",
    ),
    (
        "convert unknown preset",
        ["convert-official", "{root}/nokeys.pth", "--preset", "crate-huge", "--output-dir", "{root}/converted"],
        1,
        "--preset: expected one of",
    ),
    (
        "convert bad labels",
        [
            "convert-official",
            "{root}/crate-official.pth",
            "--preset",
            "crate-digits",
            "--output-dir",
            "{root}/converted",
            "--labels",
            "{root}/labels.json",
        ],
        1,
        "--labels: '{root}/labels.json' is not valid JSON",
    ),
    ("srr zero-byte image", ["srr", "{root}/crate", "--images", "{root}/zero_png"], 1, "'a.png': not an image file"),
    (
        "srr truncated weights",
        ["srr", "{root}/truncated", "--dataset", "digits"],
        1,
        "'{root}/truncated/model.safetensors'",
    ),
    (
        "srr garbage config",
        ["srr", "{root}/garbage_config", "--dataset", "digits"],
        1,
        "'{root}/garbage_config/config.json'",
    ),
    ("srr config eps 0", ["srr", "{root}/eps0", "--dataset", "digits"], 1, "layer_norm_eps must be in (0.0, inf)"),
    (
        "srr config.json as model",
        ["srr", "{root}/crate/config.json", "--dataset", "digits"],
        1,
        "got the file '{root}/crate/config.json'",
    ),
    ("srr missing model", ["srr", "{root}/nope", "--dataset", "digits"], 1, "'{root}/nope' is not an existing folder"),
    (
        "srr images is a file",
        ["srr", "{root}/crate", "--images", "{root}/afile"],
        1,
        "images: expected a folder, got '{root}/afile'",
    ),
    (
        "srr texts on image model",
        ["srr", "{root}/crate", "--texts", "{root}/labels.json"],
        1,
        "texts: '{root}/crate' is not a text model",
    ),
    ("srr BERT on images", ["srr", "{root}/bert", "--dataset", "digits"], 1, "'{root}/bert' is not a vision model"),
    (
        "srr digits split",
        ["srr", "{root}/crate", "--dataset", "digits", "--split", "nope"],
        1,
        "split: expected None, 'train' or 'test'",
    ),
    (
        "srr device",
        ["srr", "{root}/crate", "--dataset", "digits", "--device", "gpu0"],
        2,
        "--device: expected a torch device",
    ),
    (
        "srr output dir is a file",
        ["srr", "{root}/crate", "--dataset", "digits", "--output-dir", "{root}/afile"],
        2,
        "--output-dir: '{root}/afile' is an existing file",
    ),
    ("srr max samples 0", ["srr", "{root}/crate", "--dataset", "digits", "--max-samples", "0"], 2, "--max-samples"),
    (
        "srr eps nan",
        ["srr", "{root}/crate", "--dataset", "digits", "--eps", "nan"],
        2,
        "--eps: expected a finite number",
    ),
    ("srr batch size 0", ["srr", "{root}/crate", "--dataset", "digits", "--batch-size", "0"], 2, "--batch-size"),
    (
        "srr no input",
        ["srr", "{root}/crate"],
        1,
        "inputs: pass --images DIR, --dataset NAME or --texts FILE ('{root}/crate' records no dataset",
    ),
    (
        "srr unknown flag",
        ["srr", "{root}/crate", "--dataset", "digits", "--frobnicate"],
        2,
        "unrecognized arguments: --frobnicate",
    ),
    ("schatten truncated", ["schatten", "{root}/truncated"], 1, "'{root}/truncated/model.safetensors'"),
    ("schatten empty folder", ["schatten", "{root}/empty_dir"], 1, "'{root}/empty_dir' has no config.json"),
    ("schatten l-phi nan", ["schatten", "{root}/crate", "--l-phi", "nan"], 2, "--l-phi"),
    ("concepts k 0", ["concept-fidelity", "{root}/crate", "--dataset", "digits", "--concepts", "0"], 2, "--concepts"),
    (
        "concepts layer 99",
        ["concept-fidelity", "{root}/crate", "--dataset", "digits", "--layer", "99"],
        1,
        "layer: expected a block number 0..1 (0 = the embeddings), got",
    ),
    (
        "concepts on BERT",
        ["concept-fidelity", "{root}/bert", "--dataset", "digits"],
        1,
        "'{root}/bert' is a text model; pass --texts FILE",
    ),
    (
        "attention-svm head 99",
        ["attention-svm", "{root}/crate", "--dataset", "digits", "--layer", "1", "--head", "99"],
        1,
        "head: expected an integer in [0, 4)",
    ),
    ("attention-svm layer -1", ["attention-svm", "{root}/crate", "--dataset", "digits", "--layer", "-1"], 2, "--layer"),
    (
        "attention-svm layer 0",
        ["attention-svm", "{root}/crate", "--dataset", "digits", "--layer", "0"],
        2,
        "--layer: expected a positive integer",
    ),
    (
        "attention-svm layer 5",
        ["attention-svm", "{root}/crate", "--dataset", "digits", "--layer", "5"],
        1,
        "--layer: expected a block number 1..1, got 5",
    ),
    (
        "attention-svm queries",
        ["attention-svm", "{root}/crate", "--dataset", "digits", "--layer", "1", "--queries", "999"],
        1,
        "queries: positions must lie in [0, 17)",
    ),
    # refused by the parser, before the model is loaded (exit 2, as argparse does)
    ("report sections", ["report", "{root}/crate", "--sections", "bogus"], 2, "--sections: 'bogus' is not one of"),
    (
        "report images on text model",
        ["report", "{root}/bert", "--images", "{root}/zero_png"],
        1,
        "'{root}/bert' is a text model",
    ),
    (
        "srr images folder is empty",
        ["srr", "{root}/crate", "--images", "{root}/empty_dir"],
        1,
        "'{root}/empty_dir': the folder is empty",
    ),
    ("study axis", ["study", "--axis", "lr"], 1, "--axis: expected KEY=VALUE, got 'lr'"),
    ("study jobs 0", ["study", "--jobs", "0"], 2, "--jobs"),
    (
        "train lr nan",
        ["train", "--output-dir", "{root}/t", "--learning-rate", "nan"],
        1,
        "learning_rate: expected a finite number",
    ),
    (
        "train preset typo",
        ["train", "--output-dir", "{root}/t", "--preset", "crate-digit"],
        1,
        "preset: expected one of",
    ),
    ("train output is a file", ["train", "--output-dir", "{root}/afile"], 2, "'{root}/afile' is an existing file"),
    (
        "train resume missing",
        ["train", "--output-dir", "{root}/t", "--resume-from-checkpoint", "{root}/nope"],
        1,
        "resume_from_checkpoint: '{root}/nope' is not a folder",
    ),
    ("unknown command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    (
        "srr eps overflows",
        ["srr", "{root}/crate", "--dataset", "digits", "--max-samples", "2", "--eps", "1e308"],
        1,
        "eps: expected a value whose square is a positive finite float",
    ),
    (
        "srr binary texts",
        ["srr", "{root}/bert", "--texts", "{root}/garbage.pth"],
        1,
        "texts: '{root}/garbage.pth' is not UTF-8 text",
    ),
    (
        "srr custom-code repo",
        ["srr", "{root}/remote", "--dataset", "digits"],
        1,
        "'{root}/remote' needs its own Python code",
    ),
    (
        "concepts max-iter 0",
        ["concept-fidelity", "{root}/crate", "--dataset", "digits", "--max-iter", "0"],
        2,
        "--max-iter",
    ),
    ("report concepts 0", ["report", "{root}/crate", "--concepts", "0"], 2, "--concepts"),
    ("report max-samples 0", ["report", "{root}/crate", "--max-samples", "0"], 2, "--max-samples"),
]


@pytest.mark.parametrize("argv, code, named", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_errors_name_the_input(folders, argv, code, named, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default output folders, if any were written, stay under tmp_path
    if "{root}/crate-official.pth" in argv:
        torch.save({"mlp_head.1.weight": torch.zeros(10, 64)}, folders / "crate-official.pth")
    argv = [a.replace("{root}", str(folders)) for a in argv]
    got, err = _cli(argv, capsys)
    assert got == code, err
    assert named.replace("{root}", str(folders)) in err, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("hf-tdiag")  # one error line (after a usage block for exit 2)


def test_cli_prints_the_layernorm_warning(folders, capsys, tmp_path):
    (tmp_path / "t.txt").write_text("a b\nc d\n")
    code, err = _cli(
        ["srr", folders / "bert", "--texts", tmp_path / "t.txt", "--layernorm", "--output-dir", tmp_path / "o"], capsys
    )
    assert code == 0
    assert "hf-tdiag srr: warning: apply_layernorm: bert has no pre-attention LayerNorm" in err


# ----------------------------------------------------------------------------------------- resuming


def _checkpoint(root, step, state):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if state is not None:
        (folder / "trainer_state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    return folder


GOOD = {"completed_steps": 4, "epoch": 1, "batches_in_epoch": 0, "step": 4}


@pytest.mark.parametrize(
    "damage, named",
    [
        (json.dumps(GOOD)[:20], "is not valid JSON"),
        ("", "is not valid JSON"),
        ("[1, 2]", "holds a JSON list"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "epoch"}), "lacks the key(s) ['epoch']"),
        (json.dumps({**GOOD, "completed_steps": -3}), "completed_steps=-3"),
        (None, "is missing"),
    ],
    ids=["truncated", "empty", "not-an-object", "missing-key", "negative-step", "no-state-file"],
)
def test_latest_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, damage, named):
    from hf_tdiag.training.checkpointing import read_state, resolve_checkpoint

    good = _checkpoint(tmp_path, 4, GOOD)
    bad = _checkpoint(tmp_path, 8, damage)
    messages = []
    assert resolve_checkpoint("latest", str(tmp_path), notify=messages.append) == str(good)
    assert len(messages) == 1 and str(bad / "trainer_state.json") in messages[0] and named in messages[0]
    assert str(good) in messages[0]
    with pytest.raises(ValueError) as info:  # the damaged one named, when asked for explicitly
        resolve_checkpoint(str(bad), str(tmp_path))
    assert str(bad / "trainer_state.json") in str(info.value) and named in str(info.value)
    with pytest.raises(ValueError) as info:
        read_state(str(bad))
    assert str(bad / "trainer_state.json") in str(info.value)


def test_latest_with_only_damaged_checkpoints_is_an_error(tmp_path):
    from hf_tdiag.training.checkpointing import resolve_checkpoint

    _checkpoint(tmp_path, 3, '{"completed_steps": 3, "ep')
    _checkpoint(tmp_path, 6, None)
    with pytest.raises(ValueError) as info:
        resolve_checkpoint("latest", str(tmp_path))
    text = str(info.value)
    assert str(tmp_path / "checkpoint-3" / "trainer_state.json") in text
    assert str(tmp_path / "checkpoint-6" / "trainer_state.json") in text
    assert "no intact checkpoint" in text


def test_latest_without_checkpoints_starts_fresh(tmp_path):
    from hf_tdiag.training.checkpointing import resolve_checkpoint

    assert resolve_checkpoint("latest", str(tmp_path)) is None
    assert resolve_checkpoint("latest", str(tmp_path / "not-there")) is None


def test_default_notification_is_a_warning(tmp_path):
    from hf_tdiag.training.checkpointing import resolve_checkpoint

    _checkpoint(tmp_path, 1, GOOD)
    _checkpoint(tmp_path, 2, "{")
    with pytest.warns(UserWarning, match="checkpoint-2"):
        assert resolve_checkpoint("latest", str(tmp_path)).endswith("checkpoint-1")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: _gd(steps=0), "steps"),
        (lambda: _finite_part(z=torch.randn(3)), "z"),
        (lambda: _supervised(kl_weight=-1.0), "kl_weight"),
        (lambda: _supervised(supervised_iter=-1), "supervised_iter"),
        (lambda: _supervised(batch_size=0), "batch_size"),
        (lambda: _sharpness_with(rho=0.0), "rho"),
    ],
    ids=["gd-steps", "finite-part-z", "kl_weight", "supervised_iter", "batch_size", "sharpness-rho"],
)
def test_measure_options_name_themselves(call, name):
    with pytest.raises((ValueError, TypeError), match=rf"^{name}: "):
        call()


def _gd(**kw):
    from hf_tdiag.experiments.attention_gd import make_attention_data, stack_data, train_attention_batch

    return train_attention_batch(stack_data([make_attention_data(3, 4, 5, seed=0)]), **kw)


def _finite_part(z):
    from hf_tdiag.measures.attention_svm.finite import gen_svm_finite_part

    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[:, 0] = True
    return gen_svm_finite_part(torch.randn(3, 4, 5), z, mask, torch.zeros(3, 4))


def _supervised(**kw):
    from hf_tdiag.measures.concepts import ClassifierSupervisedSemiNMF

    return ClassifierSupervisedSemiNMF(3, **kw)


def _sharpness_with(**kw):
    from hf_tdiag.measures.sharpness import sharpness

    w = torch.zeros(3, requires_grad=True)
    return sharpness(lambda batch: ((w - batch) ** 2).sum(), [w], [torch.ones(3)], **kw)
