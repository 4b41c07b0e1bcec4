"""Bad inputs and faults on the command line (issue 45), one table: each case sets up a folder as a careful or
careless user would, runs ``hf-tdiag`` in-process and is classed by what happened to the user's files and what was
printed:

* ``lost``: a file the user had is changed or gone;
* ``raw``: a Python exception escaped, or a traceback was printed;
* ``unclear``: exit 1 without the message naming the input (the expected text);
* ``silent-wrong``: exit 0 but the result is not what the user meant (the case's check fails);
* ``clear``: exit 1, one line, naming the input;
* ``handled``: exit 0, the user's files intact, the case's check holds.

Every case here must be ``clear`` or ``handled``. :func:`tally` classes the whole table (used to count the table
against an older commit for the issue's before/after numbers: ``python -c "import test_fuzz_cli as t;
print(t.tally())"`` with that commit's checkout first on ``sys.path``). All cases refuse before loading a model or
run on a 1-block 8x8 CRATE, so the table is fast."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

MANIFEST = ".hf-tdiag-manifest.json"


def _files(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name != MANIFEST:
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _write(root, files: dict[str, str | bytes]) -> None:
    for name, data in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if name.endswith("/"):
            os.makedirs(path, exist_ok=True)
            continue
        with open(path, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)


# ----------------------------------------------------------------------------------------- inputs of the table


def _tiny_model(folder: str) -> None:
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor

    torch.manual_seed(0)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=1)
    CrateForImageClassification(config).save_pretrained(folder)
    CrateImageProcessor.for_config(config).save_pretrained(folder)


def _official(path: str, *, meta: bool = False, sparse: bool = False) -> None:
    """A crate-digits checkpoint in the official layout (random weights)."""
    g = torch.Generator().manual_seed(0)
    dim = 64
    sd = {
        "to_patch_embedding.1.weight": torch.ones(4), "to_patch_embedding.1.bias": torch.zeros(4),
        "to_patch_embedding.2.weight": torch.randn(dim, 4, generator=g), "to_patch_embedding.2.bias": torch.zeros(dim),
        "to_patch_embedding.3.weight": torch.ones(dim), "to_patch_embedding.3.bias": torch.zeros(dim),
        "pos_embedding": torch.randn(1, 17, dim, generator=g), "cls_token": torch.randn(1, 1, dim, generator=g),
        "mlp_head.0.weight": torch.ones(dim), "mlp_head.0.bias": torch.zeros(dim),
        "mlp_head.1.weight": torch.randn(10, dim, generator=g), "mlp_head.1.bias": torch.zeros(10),
    }  # fmt: skip
    for i in range(4):
        p = f"transformer.layers.{i}"
        sd[f"{p}.0.norm.weight"], sd[f"{p}.0.norm.bias"] = torch.ones(dim), torch.zeros(dim)
        sd[f"{p}.0.fn.qkv.weight"] = 0.1 * torch.randn(dim, dim, generator=g)
        sd[f"{p}.0.fn.to_out.0.weight"], sd[f"{p}.0.fn.to_out.0.bias"] = (
            0.1 * torch.randn(dim, dim, generator=g),
            torch.zeros(dim),
        )
        sd[f"{p}.1.norm.weight"], sd[f"{p}.1.norm.bias"] = torch.ones(dim), torch.zeros(dim)
        sd[f"{p}.1.fn.weight"] = 0.1 * torch.randn(dim, dim, generator=g)  # fmt: skip
    if meta:
        sd["mlp_head.0.weight"] = torch.empty(dim, device="meta")
    if sparse:
        sd["mlp_head.1.weight"] = sd["mlp_head.1.weight"].to_sparse()
    torch.save(sd, path)


@dataclass
class Case:
    """``files``: what the user has under the case folder (``{name: content}``, ``name/`` a folder; ``@ck`` an official
    checkpoint, ``@meta``/``@sparse`` a damaged one, ``@model`` a tiny CRATE folder); ``argv`` with ``{d}`` for the
    case folder; ``expect``: the text a clear error holds, or ``None`` for a run that must succeed (``check`` then
    gets the folder and must hold)."""

    id: str
    files: dict
    argv: list[str]
    expect: str | None
    check: Callable[[str], bool] | None = None
    keep: list[str] = field(default_factory=list)  # for a handled case: user files that must stay byte-identical


def _setup(case: Case, root: str) -> None:
    for name, data in case.files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if data == "@ck":
            _official(path)
        elif data in ("@meta", "@sparse"):
            _official(path, meta=data == "@meta", sparse=data == "@sparse")
        elif data == "@model":
            _tiny_model(path)
        else:
            _write(root, {name: data})


TRAIN = ["--hidden-size", "16", "--num-hidden-layers", "1", "--num-attention-heads", "2", "--max-train-steps", "1",
         "--max-train-samples", "32", "--max-eval-samples", "16", "--layer-srr-samples", "0", "--disable-tqdm"]  # fmt: skip
CONVERT = ["convert-official", "{d}/ck.pth", "--preset", "crate-digits", "--output-dir", "{d}/out"]
FLAG = "--overwrite-output-dir"
USER = {"README.md": "# my project\n", "notes.txt": "mine\n"}
APP = {"config.json": '{"app": 1}\n', "logs/app.log": "started\n"}


REPORT = ["report", "{d}/m", "--dataset", "digits", "--max-samples", "16", "--output-dir", "{d}/out"]
SVM = ["attention-svm", "{d}/m", "--dataset", "digits", "--max-samples", "16", "--output-dir", "{d}/out"]
CONCEPTS = ["concept-fidelity", "{d}/m", "--dataset", "digits", "--max-samples", "16", "--output-dir", "{d}/out"]


def _labels(text: str | bytes) -> dict:
    return {"ck.pth": "@ck", "labels.json": text}


CASES: list[Case] = [
    # --- the trainer's output folder: a user's files are never replaced or removed
    Case("train: user's README.md", {"run/" + k: v for k, v in USER.items()}, ["train", "--output-dir", "{d}/run", *TRAIN], "README.md"),
    Case("train: user's README.md, flag", {"run/" + k: v for k, v in USER.items()}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "README.md"),
    Case("train: app's config.json and logs, flag", {"run/" + k: v for k, v in {**APP, **USER}.items()}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "config.json"),
    Case("train: app's config.json", {"run/" + k: v for k, v in APP.items()}, ["train", "--output-dir", "{d}/run", *TRAIN], "config.json"),
    Case("train: user's logs folder", {"run/logs/x.log": "x"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "logs"),
    Case("train: another program's weights", {"run/model.safetensors": b"\x00" * 16}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "model.safetensors"),
    Case("train: old pytorch_model.bin", {"run/pytorch_model.bin": b"\x00" * 16}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "pytorch_model.bin"),
    Case("train: checkpoints of an older hf-tdiag", {"run/checkpoint-5/trainer_state.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "checkpoint-5"),
    Case("train: user's modeling_x.py", {"run/modeling_mine.py": "x = 1\n"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "modeling_mine.py"),
    Case("train: user's preprocessor_config.json", {"run/preprocessor_config.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "preprocessor_config.json"),
    Case("train: user's all_results.json", {"run/all_results.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "all_results.json"),
    Case("train: user's srr_history.json", {"run/srr_history.json": "[]"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "srr_history.json"),
    Case("train: user's tokenizer.json", {"run/tokenizer.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN], "tokenizer.json"),
    Case("train: output is a file", {"run": "a file"}, ["train", "--output-dir", "{d}/run", *TRAIN], "is an existing file"),
    Case("train: output below a file", {"run": "a file"}, ["train", "--output-dir", "{d}/run/sub", *TRAIN], "cannot write into"),
    Case("train: damaged manifest", {"run/.hf-tdiag-manifest.json": "{", "run/config.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "cannot be read"),
    Case("train: a manifest of another program", {"run/.hf-tdiag-manifest.json": '{"kind": "x", "runs": []}', "run/config.json": "{}"}, ["train", "--output-dir", "{d}/run", *TRAIN, FLAG], "not an hf-tdiag output manifest"),
    Case("train: resume from a missing folder", {}, ["train", "--output-dir", "{d}/run", *TRAIN, "--resume-from-checkpoint", "{d}/nothing"], "is not a folder"),
    Case("train: resume from a user's folder", {"ck/notes.txt": "x"}, ["train", "--output-dir", "{d}/run", *TRAIN, "--resume-from-checkpoint", "{d}/ck"], "not a complete checkpoint"),
    Case("train: user's notes only", {"run/notes.txt": "mine\n"}, ["train", "--output-dir", "{d}/run", *TRAIN], None,
         check=lambda d: os.path.isfile(f"{d}/run/model.safetensors") and os.path.isfile(f"{d}/run/config.json"), keep=["run/notes.txt"]),
    # --- the converter: its input is never removed or replaced
    Case("convert: input inside the output folder, flag", {"out/ck.pth": "@ck"}, ["convert-official", "{d}/out/ck.pth", "--preset", "crate-digits", "--output-dir", "{d}/out", FLAG], None,
         check=lambda d: os.path.isfile(f"{d}/out/config.json"), keep=["out/ck.pth"]),
    Case("convert: input inside the output folder", {"out/ck.pth": "@ck"}, ["convert-official", "{d}/out/ck.pth", "--preset", "crate-digits", "--output-dir", "{d}/out"], None,
         check=lambda d: os.path.isfile(f"{d}/out/model.safetensors"), keep=["out/ck.pth"]),
    Case("convert: input named like the output weights", {"out/model.safetensors": "@ck"}, ["convert-official", "{d}/out/model.safetensors", "--preset", "crate-digits", "--output-dir", "{d}/out", FLAG], "would replace the input"),
    Case("convert: user's README.md in the output", {"ck.pth": "@ck", "out/README.md": "mine"}, [*CONVERT, FLAG], "README.md"),
    Case("convert: older hf-tdiag's model, flag", {"ck.pth": "@ck", "out/config.json": "{}", "out/model.safetensors": b"0"}, [*CONVERT, FLAG], "no .hf-tdiag-manifest.json"),
    Case("convert: older hf-tdiag's model", {"ck.pth": "@ck", "out/config.json": "{}"}, CONVERT, "config.json"),
    Case("convert: missing checkpoint", {}, CONVERT, "no such file"),
    Case("convert: checkpoint is a folder", {"ck.pth/": ""}, CONVERT, "is a folder"),
    Case("convert: empty checkpoint", {"ck.pth": b""}, CONVERT, "is empty"),
    Case("convert: text as checkpoint", {"ck.pth": "hello\n"}, CONVERT, "cannot read"),
    Case("convert: truncated checkpoint", {"ck.pth": b"PK\x03\x04" + b"\x00" * 30}, CONVERT, "cannot read"),
    Case("convert: a meta tensor", {"ck.pth": "@meta"}, CONVERT, "meta device"),
    Case("convert: a sparse tensor", {"ck.pth": "@sparse"}, CONVERT, "sparse"),
    Case("convert: wrong preset", {"ck.pth": "@ck"}, ["convert-official", "{d}/ck.pth", "--preset", "crate-huge", "--output-dir", "{d}/out"], "--preset"),
    Case("convert: output is a file", {"ck.pth": "@ck", "out": "x"}, CONVERT, "is an existing file"),
    Case("convert: labels with a duplicate name", _labels('["cat", "dog", "cat", "3", "4", "5", "6", "7", "8", "9"]'), [*CONVERT, "--labels", "{d}/labels.json"], "given twice"),
    Case("convert: labels keyed by names", _labels('{"a": "cat"}'), [*CONVERT, "--labels", "{d}/labels.json"], "has the key 'a'"),
    Case("convert: labels missing", {"ck.pth": "@ck"}, [*CONVERT, "--labels", "{d}/labels.json"], "does not exist"),
    Case("convert: labels a folder", {"ck.pth": "@ck", "labels.json/": ""}, [*CONVERT, "--labels", "{d}/labels.json"], "is a folder"),
    Case("convert: labels not UTF-8", _labels(b"\xff\xfe[\x00"), [*CONVERT, "--labels", "{d}/labels.json"], "not UTF-8"),
    Case("convert: labels not JSON", _labels("cat, dog"), [*CONVERT, "--labels", "{d}/labels.json"], "not valid JSON"),
    Case("convert: labels a number", _labels("7"), [*CONVERT, "--labels", "{d}/labels.json"], "expected a JSON list or object"),
    Case("convert: labels too few", _labels('["a", "b"]'), [*CONVERT, "--labels", "{d}/labels.json"], "expected names for classes 0..9"),
    Case("convert: labels of objects", _labels('[{"name": "a"}]'), [*CONVERT, "--labels", "{d}/labels.json"], "class names must be strings"),
    Case("convert: labels with a BOM", _labels("\ufeff" + json.dumps([str(i) for i in range(10)])), [*CONVERT, "--labels", "{d}/labels.json"], None,
         check=lambda d: json.load(open(f"{d}/out/config.json"))["id2label"]["0"] == "0", keep=["labels.json"]),
    Case("convert: a text preset with labels", _labels("[]"), ["convert-official", "{d}/ck.pth", "--preset", "crate-lm-12l", "--output-dir", "{d}/out", "--labels", "{d}/labels.json"], "not options of a text CRATE"),
    # --- measuring commands: their output never replaces a user's file of the same name
    Case("srr: user's srr.json", {"m": "@model", "out/srr.json": "mine"}, ["srr", "{d}/m", "--dataset", "digits", "--output-dir", "{d}/out"], "srr.json"),
    Case("srr: user's srr.json, flag", {"m": "@model", "out/srr.json": "mine"}, ["srr", "{d}/m", "--dataset", "digits", "--output-dir", "{d}/out", FLAG], "no hf-tdiag run recorded writing"),
    Case("srr: user's srr.png, flag", {"m": "@model", "out/srr.png": b"\x89PNG"}, ["srr", "{d}/m", "--dataset", "digits", "--output-dir", "{d}/out", FLAG], "srr.png"),
    Case("schatten: user's schatten.json, flag", {"m": "@model", "out/schatten.json": "mine"}, ["schatten", "{d}/m", "--output-dir", "{d}/out", FLAG], "schatten.json"),
    Case("objective-ledger: user's objective_ledger.json, flag", {"m": "@model", "out/objective_ledger.json": "mine"}, ["objective-ledger", "{d}/m", "--images", "digits", "--output-dir", "{d}/out", FLAG], "objective_ledger.json"),
    Case("srr: output into the model's folder", {"m": "@model"}, ["srr", "{d}/m", "--dataset", "digits", "--max-samples", "8", "--output-dir", "{d}/m"], None,
         check=lambda d: os.path.isfile(f"{d}/m/srr.json") and json.load(open(f"{d}/m/config.json"))["model_type"] == "crate", keep=["m/config.json", "m/model.safetensors"]),
    # --- out-of-range layers, heads, queries and concept counts: refused before any work (the 1-block model)
    Case("report: --layer past the blocks", {"m": "@model"}, [*REPORT, "--layer", "2"], "--layer: expected a block number 0..1"),
    Case("report: --attention-layer past the blocks", {"m": "@model"}, [*REPORT, "--attention-layer", "9"], "--attention-layer: expected a block number 1..1"),
    Case("report: --head past the heads", {"m": "@model"}, [*REPORT, "--head", "4"], "--head: expected an integer in [0, 4), got 4"),
    Case("report: --concepts past the token size", {"m": "@model"}, [*REPORT, "--concepts", "100000"], "--concepts: expected at most 64 concepts"),
    Case("report: --head past the heads, attention only", {"m": "@model"}, [*REPORT, "--sections", "attention_svm", "--head", "9"], "--head: expected an integer in [0, 4)"),
    Case("report: --layer past the blocks, concepts only", {"m": "@model"}, [*REPORT, "--sections", "concept_fidelity", "--layer", "5"], "--layer: expected a block number"),
    Case("attention-svm: --layer past the blocks", {"m": "@model"}, [*SVM, "--layer", "9"], "--layer: expected a block number 1..1, got 9"),
    Case("attention-svm: --layer 0", {"m": "@model"}, [*SVM, "--layer", "0"], "--layer: expected a positive integer"),
    Case("attention-svm: --head past the heads", {"m": "@model"}, [*SVM, "--layer", "1", "--head", "9"], "head: expected an integer in [0, 4), got 9"),
    Case("attention-svm: --head -1", {"m": "@model"}, [*SVM, "--layer", "1", "--head", "-1"], "head: expected an integer in [0, 4), got -1"),
    Case("attention-svm: --queries past the tokens", {"m": "@model"}, [*SVM, "--layer", "1", "--queries", "999"], "queries: positions must lie in [0, 17), got [999]"),
    Case("attention-svm: --queries not numbers", {"m": "@model"}, [*SVM, "--layer", "1", "--queries", "x"], "--queries: expected 'all', 'cls' or comma-separated integers"),
    Case("concepts: --layer past the blocks", {"m": "@model"}, [*CONCEPTS, "--layer", "9"], "layer: expected a block number 0..1 (0 = the embeddings), got 9"),
    Case("concepts: --layers with one past the blocks", {"m": "@model"}, [*CONCEPTS, "--layers", "0,9"], "got 9"),
    Case("concepts: --concepts past the token size", {"m": "@model"}, [*CONCEPTS, "--layer", "1", "--concepts", "100000"], "n_concepts: expected at most"),
    Case("concepts: --concepts 0", {"m": "@model"}, [*CONCEPTS, "--layer", "1", "--concepts", "0"], "--concepts/--n-concepts: expected a positive integer"),
]  # fmt: skip


def run_case(case: Case, root: str) -> tuple[str, str]:
    """``(outcome class, what was printed)`` for one case set up under ``root``."""
    from hf_tdiag.cli import main as cli_main

    os.makedirs(root, exist_ok=True)
    _setup(case, root)
    before = _files(root)
    argv = [a.replace("{d}", root) for a in case.argv]
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = cli_main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - a raw exception is one of the outcomes
        return "raw", f"{type(exc).__name__}: {exc}"
    finally:
        from hf_tdiag import _outputs

        getattr(_outputs, "release_output_dirs", lambda: None)()
    text = err.getvalue().strip()
    after = _files(root)
    kept = before if case.expect is not None else {k: before[k] for k in case.keep}
    if any(after.get(k) != v for k, v in kept.items()):
        return "lost", text
    if "Traceback" in text:
        return "raw", text
    if case.expect is None:  # a run that must succeed: refused is unclear, a wrong result silent-wrong
        return ("unclear" if code != 0 else "handled" if case.check(root) else "silent-wrong"), text
    if code == 0:
        return "silent-wrong", text
    lines = [line for line in text.splitlines() if "warning" not in line]
    if code == 2:  # argparse: its usage, then one error line naming the argument
        lines = [line for line in lines if ": error: " in line]
    return ("clear" if case.expect in "\n".join(lines) and len(lines) == 1 else "unclear"), text


def tally(root: str | None = None) -> dict[str, int]:
    """Every case's outcome class, counted (a temporary folder per case)."""
    import tempfile

    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(CASES):
            outcome, _ = run_case(case, os.path.join(root or tmp, f"case{i}"))
            counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_case(case, tmp_path):
    outcome, text = run_case(case, str(tmp_path / "case"))
    assert outcome == ("handled" if case.expect is None else "clear"), f"{outcome}: {text}"
