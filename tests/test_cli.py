"""One command-line convention: hyphenated flags with underscore and old-name aliases, one name and default per
idea, --version, plain help text, a parser that imports neither torch nor transformers, lazy CRATE registration,
atomic outputs, heterogeneous schatten tables, the thread rule and max_queries=0."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from hf_tdiag._atomic import atomic_open, write_csv, write_json
from hf_tdiag._cli_args import NUM_CONCEPTS, ArgumentParser, normalize_flag, plain
from hf_tdiag._threads import SMALL_MODEL_PARAMETERS, pick_threads
from hf_tdiag.cli import build_parser
from hf_tdiag.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ["attention-svm", "concept-fidelity", "convert-official", "report", "schatten", "srr", "study", "train"]
RECIPES = [
    "attention_svm.py",
    "concept_fidelity.py",
    "schatten_bert_miniatures.py",
    "schatten_trained_grid.py",
    "srr_generalization.py",
    "train_crate.py",
]


def _run(code: str, *args: str, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def _help(command: str | None) -> str:
    parser = build_parser()
    if command is None:
        return parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    return ""


def _subparser_help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        cli_main([command, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_and_version_import_neither_torch_nor_transformers():
    code = (
        "import sys, contextlib, io\n"
        "from hf_tdiag_cli import main\n"
        "for argv in [['--help'], ['--version']] + [[c, '--help'] for c in sys.argv[1:]]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, (argv, e.code)\n"
        "    assert out.getvalue().strip(), argv\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy', 'matplotlib', 'datasets') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    proc = _run(code, *COMMANDS)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_version(capsys):
    import hf_tdiag

    with pytest.raises(SystemExit) as info:
        cli_main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hf-tdiag {hf_tdiag.__version__} (torch {torch.__version__}")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_and_flags_are_hyphenated(command, capsys):
    text = _subparser_help(command, capsys)
    assert "``" not in text and not re.search(r":(mod|func|class|meth):`", text)
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", text))
    assert flags, text
    assert not [f for f in flags if "_" in f or f != f.lower()], flags


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_help_is_plain_and_hyphenated(recipe):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "recipes", recipe), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout and ":mod:" not in proc.stdout
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", proc.stdout.split("options:")[-1]))
    assert "--output-dir" in flags
    assert not [f for f in flags if "_" in f or f != f.lower()], flags


def _parse(argv):
    return build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "command, required",
    [
        ("srr", ["m", "--dataset", "digits"]),
        ("concept-fidelity", ["m", "--dataset", "digits"]),
        ("attention-svm", ["m", "--dataset", "digits", "--layer", "1"]),
        ("report", ["m"]),
        ("schatten", ["m"]),
        ("study", []),
        ("convert-official", ["ckpt", "--preset", "crate-tiny"]),
        ("train", []),
    ],
)
def test_output_dir_in_every_spelling(command, required):
    canonical = _parse([command, *required, "--output-dir", "x"])
    assert canonical.output_dir == "x"
    assert _parse([command, *required, "--output_dir", "x"]).output_dir == "x"
    assert _parse([command, *required, "--output_dir=y"]).output_dir == "y"
    if command == "convert-official":
        assert _parse([command, *required, "--output", "z"]).output_dir == "z"  # the old name


@pytest.mark.parametrize(
    "command, extra", [("srr", []), ("concept-fidelity", []), ("attention-svm", ["--layer", "1"]), ("report", [])]
)
def test_max_samples_and_its_old_names(command, extra):
    base = [command, "m", "--dataset", "digits", *extra]
    for flag in ("--max-samples", "--max_samples", "--limit", "--max-images"):
        assert _parse([*base, flag, "5"]).max_samples == 5
    default = _parse(base).max_samples
    assert default == (8 if command == "attention-svm" else 64)
    with pytest.raises(SystemExit):
        _parse([*base, "--max-samples", "0"])


def test_study_old_names_still_work():
    args = _parse(["study", "--limit", "3", "--max_examples", "128", "--no_plot", "--summarize_only", "--keep_models"])
    assert (args.max_runs, args.max_samples, args.no_figures, args.summarize_only, args.keep_models) == (
        3,
        128,
        True,
        True,
        True,
    )


def test_trainer_takes_both_spellings_and_old_thread_flag():
    from hf_tdiag.training.args import make_args

    a = make_args(["--output_dir", "o", "--num_train_epochs", "2", "--num_threads", "1", "--srr_weight", "0.1"])
    b = make_args(["--output-dir", "o", "--num-train-epochs", "2", "--threads", "1", "--srr-weight", "0.1"])
    assert vars(a) == vars(b)
    assert (a.num_train_epochs, a.num_threads, a.srr_weight) == (2, 1, 0.1)


def test_trainer_defaults_equal_the_parser_defaults():
    from hf_tdiag.training.args import build_parser as train_parser
    from hf_tdiag.training.args import make_args, parse_srr_layer

    parsed = vars(train_parser().parse_args(["--output-dir", "o"]))
    made = vars(make_args(output_dir="o"))
    assert made == {**parsed, "srr_layer": parse_srr_layer(parsed["srr_layer"])}


def test_schatten_old_l_phi_spellings():
    for flag in ("--l-phi", "--l_phi", "--L_phi", "--L-phi"):
        assert _parse(["schatten", "m", flag, "2.5"]).L_phi == 2.5
    for flag in ("--num-workers", "--workers", "--num_workers"):
        assert _parse(["schatten", "m", flag, "3"]).num_workers == 3
    # --threads means torch threads in every command, as in srr, concepts and attention-svm
    parsed = _parse(["schatten", "m", "--threads", "2"])
    assert (parsed.threads, parsed.num_workers) == (2, None)


@pytest.mark.parametrize("command, extra", [("srr", []), ("concept-fidelity", []), ("attention-svm", ["--layer", "1"])])
def test_measuring_commands_require_one_input(command, extra, capsys, tmp_path):
    """A model that records no training dataset needs an input flag; nothing is written or loaded first."""
    out = tmp_path / "out"
    assert cli_main([command, "m", *extra, "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hf-tdiag {command}: error: inputs: pass --images DIR, --dataset NAME or --texts FILE")
    assert "'m' records no dataset it was trained on" in err and not out.exists()


def test_a_model_trained_by_hf_tdiag_is_measured_on_its_held_out_split_and_outputs_have_one_root(
    tmp_path, monkeypatch, capsys
):
    """Without an input flag the inputs are the split the folder's all_results.json names (the trainer's record);
    with --dataset the flag wins; outputs default to hf-tdiag-out/<command>."""
    import json

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor
    from hf_tdiag._cli_args import trained_on

    model_dir = tmp_path / "run"
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1))
    model.save_pretrained(model_dir)
    CrateImageProcessor.for_config(model.config).save_pretrained(model_dir)
    assert trained_on(str(model_dir)) is None
    (model_dir / "all_results.json").write_text(json.dumps({"dataset": "sklearn-digits", "eval_split": "test"}))
    assert trained_on(str(model_dir)) == ("digits", "test")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["srr", str(model_dir), "--max-samples", "6", "--no-mid"]) == 0
    assert "inputs: the test split of 'digits'" in capsys.readouterr().out
    (report,) = json.loads((tmp_path / "hf-tdiag-out" / "srr" / "srr.json").read_text())["reports"].values()
    from hf_tdiag import layer_srr
    from hf_tdiag.inputs import digits_images

    pixels = CrateImageProcessor.for_config(model.config)(images=digits_images(limit=6, split="test").images,
                                                           return_tensors="pt")["pixel_values"]  # fmt: skip
    expected = layer_srr(model, pixels, include_mid=False, progress=False)
    assert report["num_samples"] == 6
    assert report["mean"]["output"]["srr"] == pytest.approx(expected.mean["output"]["srr"], rel=1e-6)
    # records that name no split to read again give no default
    for record in ({"dataset": "x", "eval_split": "train[0.1 held out]"}, {"dataset": str(tmp_path)}, [1], "{"):
        (model_dir / "all_results.json").write_text(record if isinstance(record, str) else json.dumps(record))
        assert trained_on(str(model_dir)) is None


def test_one_default_number_of_concepts():
    from hf_tdiag.report.report import ReportOptions

    assert _parse(["concept-fidelity", "m", "--dataset", "digits"]).n_concepts == NUM_CONCEPTS
    assert _parse(["report", "m"]).concepts == NUM_CONCEPTS
    assert ReportOptions().n_concepts == NUM_CONCEPTS


def test_max_queries_all_and_zero_mean_every_query():
    base = ["attention-svm", "m", "--dataset", "digits", "--layer", "1"]
    assert _parse(base).max_queries == 64
    assert _parse([*base, "--max-queries", "all"]).max_queries is None
    assert _parse([*base, "--max-queries", "0"]).max_queries is None
    assert _parse([*base, "--max_queries", "7"]).max_queries == 7


def test_max_queries_zero_in_the_python_api_is_every_query(one_torch_thread):
    from transformers import ViTConfig, ViTModel

    import hf_tdiag

    model = ViTModel(
        ViTConfig(
            image_size=8,
            patch_size=4,
            num_channels=1,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
        )
    ).eval()
    x = torch.randn(2, 1, 8, 8)
    every = hf_tdiag.attention_svm_diagnostic(model, x, 1, 0, max_queries=None)
    zero = hf_tdiag.attention_svm_diagnostic(model, x, 1, 0, max_queries=0)
    assert zero.summary()["num_queries"] == every.summary()["num_queries"] == 2 * 5
    assert zero.summary()["correlation"] == every.summary()["correlation"]
    with pytest.raises(ValueError, match="max_queries"):
        hf_tdiag.attention_svm_diagnostic(model, x, 1, 0, max_queries=-1)


def test_normalize_flag_and_plain():
    assert normalize_flag("--output_dir=a_b") == "--output-dir=a_b"
    assert normalize_flag("a_b") == "a_b" and normalize_flag("-o") == "-o" and normalize_flag("--") == "--"
    p = ArgumentParser()
    p.add_argument("--set-x")
    p.add_argument("rest", nargs="*")
    args = p.parse_args(["--set_x", "v_1", "--", "--not_a_flag"])
    assert args.set_x == "v_1" and args.rest == ["--not_a_flag"]
    assert plain("See :mod:`hf_tdiag.training` and ``x.json``.") == "See hf_tdiag.training and x.json."


def test_thread_rule(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pick_threads(3, num_parameters=10) == 3
    assert pick_threads(None, device="cpu", num_parameters=SMALL_MODEL_PARAMETERS - 1) == 1
    assert pick_threads(None, device="cpu", num_parameters=SMALL_MODEL_PARAMETERS) is None
    assert pick_threads(None, device="meta", num_parameters=10) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert pick_threads(None, device="cpu", num_parameters=10) is None  # the environment is the user's choice
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            pick_threads(bad)


def test_atomic_writes_leave_the_old_file_on_failure(tmp_path):
    path = tmp_path / "a.json"
    write_json(path, {"x": 1})
    with pytest.raises(RuntimeError):
        with atomic_open(path) as fh:
            fh.write('{"x": 2')
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"x": 1}
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left behind
    with pytest.raises(IsADirectoryError, match="folder"):
        write_json(tmp_path, {})


def test_csv_of_rows_with_different_columns(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"model": "a", "x": 1}, {"model": "b", "y": 2}, {"x": 3, "model": "c"}])
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["model", "x", "y"]
    assert rows == [
        {"model": "a", "x": "1", "y": ""},
        {"model": "b", "x": "", "y": "2"},
        {"model": "c", "x": "3", "y": ""},
    ]


def test_schatten_table_of_a_crate_and_a_bert(tmp_path, capsys, one_torch_thread):
    from transformers import BertConfig, BertModel

    from hf_tdiag.models.crate import CrateConfig, CrateModel

    CrateModel(CrateConfig.from_preset("crate-digits", num_hidden_layers=1)).save_pretrained(tmp_path / "crate")
    BertModel(
        BertConfig(
            vocab_size=20,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            intermediate_size=64,
            max_position_embeddings=8,
        )
    ).save_pretrained(tmp_path / "bert")
    out = tmp_path / "out"
    code = cli_main(["schatten", str(tmp_path / "crate"), str(tmp_path / "bert"), "--output-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    with open(out / "schatten.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["model"] for r in rows] == [str(tmp_path / "crate"), str(tmp_path / "bert")]
    crate_only = [k for k in rows[0] if rows[0][k] != "" and rows[1][k] == ""]
    assert "mean_p_opt_ista" in crate_only  # the column that crashed DictWriter before
    reports = json.loads((out / "schatten.json").read_text())
    assert [r["model"] for r in reports] == [r["model"] for r in rows]
    assert (out / "matrices.csv").stat().st_size > 0
    assert sum(name.endswith(".png") for name in os.listdir(out)) == 8  # four figures per model
    # the old per-file flags still choose exactly what is written
    only = tmp_path / "only.csv"
    assert (
        cli_main(["schatten", str(tmp_path / "bert"), "--csv", str(only), "--output-dir", str(tmp_path / "unused")])
        == 0
    )
    assert only.is_file() and not (tmp_path / "unused").exists()


@pytest.mark.parametrize(
    "statement",
    [
        "from transformers import AutoConfig; AutoConfig.for_model('crate')",
        "from transformers import AutoModel, AutoConfig; AutoModel.from_config(AutoConfig.for_model('crate', **SMALL))",
        "import transformers.modeling_layers; from transformers import AutoModelForImageClassification as A, "
        "AutoConfig; A.from_config(AutoConfig.for_model('crate', **SMALL))",
        "from hf_tdiag.models.crate import CrateForImageClassification; from transformers import AutoModel, "
        "AutoConfig; AutoModel.from_config(AutoConfig.for_model('crate', **SMALL))",
        "from transformers import ViTModel, AutoImageProcessor; from hf_tdiag.models.crate import CrateConfig; "
        "assert type(AutoImageProcessor.from_pretrained(FOLDER)).__name__ == 'CrateImageProcessor'",
    ],
)
# transformers imported first: a subprocess each (~5 s), run with the slow tests
@pytest.mark.parametrize("first", ["hf_tdiag", pytest.param("transformers", marks=pytest.mark.slow)])
def test_crate_is_registered_whatever_the_import_order(statement, first, tmp_path):
    folder = tmp_path / "proc"
    code = (
        "import sys\n"
        f"import {'hf_tdiag' if first == 'hf_tdiag' else 'transformers.models.auto.modeling_auto'}\n"
        "import hf_tdiag\n"
        "SMALL = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, image_size=8, patch_size=4)\n"
        f"FOLDER = {str(folder)!r}\n"
        "from hf_tdiag.models.crate import CrateImageProcessor\n"
        "CrateImageProcessor(size={'height': 8, 'width': 8}).save_pretrained(FOLDER)\n"
        f"{statement}\n"
        "print('ok')\n"
    )
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_save_pretrained_writes_the_auto_maps_without_the_auto_classes_in_use(tmp_path):
    code = (
        "import json, sys, hf_tdiag\n"
        "from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor\n"
        "cfg = CrateConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, image_size=8, patch_size=4)\n"
        "CrateForImageClassification(cfg).save_pretrained(sys.argv[1])\n"
        "CrateImageProcessor().save_pretrained(sys.argv[1])\n"
        "print(sorted(json.load(open(sys.argv[1] + '/config.json'))['auto_map']))\n"
        "print(sorted(json.load(open(sys.argv[1] + '/preprocessor_config.json'))['auto_map']))\n"
    )
    proc = _run(code, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == [
        "['AutoConfig', 'AutoModel', 'AutoModelForImageClassification']",  # every Auto class the model supports
        "['AutoImageProcessor']",
    ]


@pytest.mark.parametrize(
    "command, extra",
    [
        ("srr", ["--dataset", "digits"]),
        ("concept-fidelity", ["--dataset", "digits"]),
        ("attention-svm", ["--dataset", "digits", "--layer", "1"]),
        ("report", []),
        ("schatten", []),
    ],
)
def test_trust_remote_code_is_an_explicit_flag(command, extra):
    assert _parse([command, "m", *extra]).trust_remote_code is False
    assert _parse([command, "m", *extra, "--trust_remote_code"]).trust_remote_code is True


def test_report_without_inputs_names_the_sections_that_need_them_and_runs_the_weight_only_ones(tmp_path, capsys):
    import json

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    model_dir = tmp_path / "model"
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1))
    model.save_pretrained(model_dir)
    CrateImageProcessor.for_config(model.config).save_pretrained(model_dir)
    out = tmp_path / "out"
    assert cli_main(["report", str(model_dir), "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert (
        "inputs: the sections srr, concept_fidelity, attention_svm, objective_ledger measure the model on inputs" in err
    )
    assert "--sections summary,schatten" in err and not out.exists()
    assert cli_main(["report", str(model_dir), "--sections", "summary,schatten", "--output-dir", str(out)]) == 0
    sections = json.loads((out / "report.json").read_text())["sections"]
    assert {k: v["status"] for k, v in sections.items()} == {"summary": "ok", "schatten": "ok"}


def test_report_and_concepts_print_the_numbers_with_their_counts_and_labels(tmp_path, capsys):
    """The command line shows the page's headline numbers with what they were measured on, and labels a vacuous
    KL bound with its reason, as the page and the Space do."""
    import json
    import math

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    model_dir = tmp_path / "model"
    model = CrateForImageClassification(CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2))
    model.save_pretrained(model_dir)
    CrateImageProcessor.for_config(model.config).save_pretrained(model_dir)
    argv = [
        "report",
        str(model_dir),
        "--dataset",
        "digits",
        "--max-samples",
        "8",
        "--sections",
        "summary,concept_fidelity",
    ]
    assert cli_main([*argv, "--output-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    page = json.loads((tmp_path / "r" / "report.json").read_text())["sections"]["concept_fidelity"]
    bound = page["numbers"]["bound_certified"]
    line = next(x for x in out.splitlines() if x.strip().startswith("KL bound, certified:"))
    assert "n = 8 images" in line and (("[vacuous: the bound" in line) == (bound > math.log(10)))
    assert any(x.strip().startswith("top-1 accuracy:") and "of 8 labelled inputs" in x for x in out.splitlines())
    assert cli_main(["concept-fidelity", str(model_dir), "--dataset", "digits", "--max-samples", "8", "--layer", "1",
                     "--concepts", "3", "--no-figures", "--output-dir", str(tmp_path / "c")]) == 0  # fmt: skip
    runs = json.loads((tmp_path / "c" / "concept_fidelity.json").read_text())["runs"]
    printed = capsys.readouterr().out
    for label, run in runs.items():
        if run.get("bound_certified", 0) > math.log(10):
            assert f"{label}: bound_certified is vacuous: the bound" in printed
