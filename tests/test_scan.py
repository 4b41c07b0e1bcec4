"""``hf_tdiag.scan`` / ``hf-tdiag scan`` over a zoo built here: the table equals the diagnostics run one model at a
time, the cache makes reruns measure only what is missing, failures are logged while the scan goes on, the model
list forms expand as documented, and the comparison's τ matches hand-worked values. The Ray executor, kill -9
and MiniLM are in tests/test_scan_slow.py."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_tdiag  # noqa: F401  (registers the families)
from hf_tdiag.batching import encoded_batches
from hf_tdiag.cli import main
from hf_tdiag.diagnostics.schatten import schatten_bounds
from hf_tdiag.diagnostics.settings import SchattenSettings, SRRSettings
from hf_tdiag.diagnostics.srr import layer_srr
from hf_tdiag.inputs import load_images
from hf_tdiag.loading import load_model
from hf_tdiag.zoo import scan
from hf_tdiag.zoo.compare import correlations, folder_metadata
from hf_tdiag.zoo.models import expand_models, fingerprint
from hf_tdiag.zoo.table import TIMING_COLUMNS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TEXTS = ["the match ended in a draw", "rain is expected tonight", "a new phone was released", "bread rises slowly"]
SRR = SRRSettings(batch_size=4)
SCHATTEN = SchattenSettings()


def _tokenizer_folder(root):
    """A BERT WordPiece tokenizer with a 40-token vocabulary, written here (the text models' tokenizer)."""
    from transformers import BertTokenizerFast

    words = sorted({w for t in TEXTS for w in t.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    folder = root / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    tok.save_pretrained(folder)
    return tok


def _crate(folder, seed, layers, variant="crate"):
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor

    torch.manual_seed(seed)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=layers, variant=variant)
    model = CrateForImageClassification(config)
    model.save_pretrained(folder)
    CrateImageProcessor.for_config(config).save_pretrained(folder)
    return model


def _training_run(folder, steps=(4, 8, 12), accuracies=None):
    """A training run as hf-tdiag's trainer leaves it: the final model, and checkpoint-<step> folders with
    model.safetensors (no config) and trainer_state.json logging the held-out accuracy at each step."""
    model = _crate(folder, 0, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    history = []
    for i, step in enumerate(steps):
        g = torch.Generator().manual_seed(step)
        weights = {k: (v + 0.05 * (i + 1) * torch.randn(v.shape, generator=g)).contiguous() for k, v in state.items()}
        ckpt = folder / f"checkpoint-{step}"
        ckpt.mkdir()
        save_file(weights, str(ckpt / "model.safetensors"))
        accuracy = 0.3 + 0.1 * i if accuracies is None else accuracies[i]
        history.append({"epoch": i + 1, "step": step, "eval_accuracy": accuracy, "eval_loss": 2.0 - 0.2 * i})
        trainer_state = {"completed_steps": step, "epoch": i + 1, "step": step, "history": list(history)}
        (ckpt / "trainer_state.json").write_text(json.dumps(trainer_state))
    return [str(folder / f"checkpoint-{s}") for s in steps]


def _vit(folder, seed, hidden):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(seed)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=hidden, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=2 * hidden, num_labels=10)  # fmt: skip
    ViTForImageClassification(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(folder)


def _bert(folder, seed, layers, tok):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)


def _gpt2(folder, tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=tok.vocab_size)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)


ZOO = ("checkpoint-4", "checkpoint-8", "checkpoint-12", "run", "crate1", "crate2", "crate_c", "vit16", "vit32",
       "bert1", "bert2", "gpt2")  # fmt: skip


def build_zoo(root, names=ZOO) -> dict[str, str]:
    """Small models by name (all 12 by default): a training run's 3 checkpoints and final model, random CRATE of 1
    and 2 layers and a CRATE-C, two ViTs, two BERT encoders, a GPT-2 decoder (Schatten streams its safetensors)."""
    tok = _tokenizer_folder(root)
    out = {}
    if any(n.startswith("checkpoint-") or n == "run" for n in names):
        for path in _training_run(root / "run"):
            out[os.path.basename(path)] = path
        out["run"] = str(root / "run")
    makers = {
        "crate1": lambda f: _crate(f, 1, 1),
        "crate2": lambda f: _crate(f, 2, 2),
        "crate_c": lambda f: _crate(f, 3, 2, "crate-c"),
        "vit16": lambda f: _vit(f, 4, 16),
        "vit32": lambda f: _vit(f, 5, 32),
        "bert1": lambda f: _bert(f, 6, 1, tok),
        "bert2": lambda f: _bert(f, 7, 2, tok),
        "gpt2": lambda f: _gpt2(f, tok),
    }
    for name in names:
        if name in makers:
            makers[name](root / name)
            out[name] = str(root / name)
    return {n: out[n] for n in names}


def check_zoo_table(zoo: dict[str, str], images, table) -> None:
    """Every (model, diagnostic) of the table equals SRR and Schatten run on that model here (1e-9)."""
    assert list(dict.fromkeys(table["model"])) == list(zoo.values())  # the models' order, then the diagnostics'
    for name, model in zoo.items():
        want = reference_frames(model, images, TEXTS)
        for diag in ("srr", "schatten"):
            got = rows_of(table, model, diag)
            assert_frames_equal(got, want[diag], f"{name} {diag}")
            assert got["settings_hash"].nunique() == 1
            count = (
                0 if diag == "schatten" else len(TEXTS) if name.startswith(("bert", "gpt2", "minilm")) else len(images)
            )
            assert set(got["num_inputs"]) == {count}


@pytest.fixture(scope="module")
def images():
    return load_images("digits", limit=6).images


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return build_zoo(
        tmp_path_factory.mktemp("zoo"), ("checkpoint-4", "checkpoint-8", "crate1", "vit16", "bert1", "gpt2")
    )


def reference_frames(model: str, images, texts) -> dict[str, pd.DataFrame]:
    """SRR and Schatten of one model, loaded and measured here without the scan (a checkpoint: its run's model with
    the checkpoint's weights)."""
    parent = os.path.dirname(model) if os.path.basename(model).startswith("checkpoint-") else None
    loaded = load_model(parent or model, eager_attention=False)
    if parent:
        loaded.model.load_state_dict(load_file(os.path.join(model, "model.safetensors")))
    items = images if loaded.modality == "image" else texts
    srr = layer_srr(loaded.model, encoded_batches(loaded, items, SRR.batch_size), settings=SRR, progress=False)
    return {"srr": srr.to_pandas(), "schatten": schatten_bounds(loaded.model, settings=SCHATTEN).to_pandas()}


def assert_frames_equal(got: pd.DataFrame, want: pd.DataFrame, what: str) -> None:
    assert len(got) == len(want) and len(want) > 0, what
    for column in want.columns:
        a, b = got[column].reset_index(drop=True), want[column].reset_index(drop=True)
        if pd.api.types.is_float_dtype(b):
            x, y = a.to_numpy(dtype=float, na_value=np.nan), b.to_numpy(dtype=float, na_value=np.nan)
            assert np.array_equal(np.isnan(x), np.isnan(y)), (what, column)
            assert np.allclose(x[~np.isnan(x)], y[~np.isnan(y)], rtol=0, atol=1e-9), (what, column)
        else:
            assert (
                a.astype(object).where(a.notna(), None).tolist() == b.astype(object).where(b.notna(), None).tolist()
            ), (
                what,
                column,
            )


def rows_of(table: pd.DataFrame, model: str, diagnostic: str) -> pd.DataFrame:
    return table[(table["model"] == model) & (table["diagnostic"] == diagnostic)]


def without_timings(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=list(TIMING_COLUMNS)).reset_index(drop=True)


def assert_tables_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """The same rows and columns apart from the timings, numbers within 1e-9 (other thread counts round otherwise)."""
    got, want = without_timings(got), without_timings(want)
    assert list(got.columns) == list(want.columns) and len(got) == len(want)
    assert_frames_equal(got, want, "table")


def test_zoo_table_equals_the_diagnostics_run_one_model_at_a_time(zoo, images, tmp_path):
    import datasets

    small = {n: zoo[n] for n in ("checkpoint-8", "crate1", "vit16", "bert1", "gpt2")}
    inputs = {"images": images, "texts": TEXTS}
    result = scan(list(small.values()), ["srr", "schatten"], inputs, settings={"srr": SRR}, output_dir=tmp_path / "scan",
                  progress=False)  # fmt: skip
    assert result.failures == [] and len(result.measured) == 2 * len(small) and result.cached == []
    table = result.table
    check_zoo_table(small, images, table)
    # the model hash: sha256 over the names and sha256 digests of the config and weight files, computed here
    folder = zoo["crate1"]
    digests = [json.dumps([n, hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()])
               for n in ("config.json", "model.safetensors")]  # fmt: skip
    expected = hashlib.sha256("".join(digests).encode()).hexdigest()
    assert set(rows_of(table, folder, "srr")["model_hash"]) == {expected}
    assert set(table["hash_method"]) == {"sha256-content"}
    # the GPT-2's Schatten was streamed from its shards (same numbers as the loaded model above)
    entries = [json.load(open(p)) for p in (tmp_path / "scan" / "cache").glob("*.json")]
    assert {e["model"] for e in entries if e["streamed"]} == {zoo["gpt2"]}
    # the files: Parquet through datasets.load_dataset, the save_to_disk folder, the per-model measures
    loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / "scan" / "scan.parquet"), split="train")
    assert loaded.num_rows == len(table) and loaded["model"] == table["model"].tolist()
    assert np.array_equal(pd.Series(loaded["srr"], dtype=float).dropna(), table["srr"].dropna().astype(float))
    on_disk = datasets.load_from_disk(str(tmp_path / "scan" / "dataset"))
    assert on_disk.column_names == list(table.columns) and on_disk.num_rows == len(table)
    measures = pd.read_csv(tmp_path / "scan" / "measures.csv")
    last = rows_of(table, folder, "srr")
    last = last[last["state"] == "output"]["srr"].iloc[-1]
    assert math.isclose(measures.set_index("model").loc[folder, "srr.srr_last_layer"], last, rel_tol=0, abs_tol=1e-12)


def test_rerun_measures_only_what_is_missing_or_changed(zoo, images, tmp_path):
    out = tmp_path / "scan"
    start, added = [zoo["crate1"], zoo["checkpoint-4"]], [zoo["vit16"], zoo["checkpoint-8"]]
    first = scan(start, ["schatten", "srr"], images, output_dir=out, progress=False, figures=False)
    assert len(first.measured) == 4 and first.failures == []
    again = scan(start, ["schatten", "srr"], images, output_dir=out, progress=False, figures=False)
    assert again.measured == [] and len(again.cached) == 4
    assert without_timings(again.table).equals(without_timings(first.table))
    # two models added: only their entries are measured; the table equals a scan of all four from scratch
    grown = scan(start + added, ["schatten", "srr"], images, output_dir=out, progress=False, figures=False)
    measured = {e["model"] for e in (json.load(open(out / "cache" / f"{k}.json")) for k in grown.measured)}
    assert measured == set(added) and len(grown.measured) == 4
    fresh = scan(
        start + added, ["schatten", "srr"], images, output_dir=tmp_path / "fresh", progress=False, figures=False
    )
    assert without_timings(grown.table).equals(without_timings(fresh.table))
    # changed settings: only that diagnostic again, with the new settings' hash
    eps = scan(start + added, ["schatten", "srr"], images, settings={"srr": {"eps": 0.2}}, output_dir=out,
               progress=False, figures=False)  # fmt: skip
    names = {json.load(open(out / "cache" / f"{k}.json"))["diagnostic"] for k in eps.measured}
    assert names == {"srr"} and len(eps.measured) == 4
    assert (
        rows_of(eps.table, zoo["crate1"], "srr")["R"].iloc[-1]
        != rows_of(fresh.table, zoo["crate1"], "srr")["R"].iloc[-1]
    )
    # other inputs: the input diagnostics again, Schatten (weights only) from the cache
    fewer = scan(start + added, ["schatten", "srr"], images[:3], output_dir=out, progress=False, figures=False)
    assert len(fewer.measured) == 4 and len(fewer.cached) == 4


def test_a_failing_model_is_logged_and_the_scan_goes_on(zoo, images, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "crate", "hidden_size": 64, "num_hidden_layers": 1}))
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    out = tmp_path / "scan"
    code = main(["scan", zoo["crate1"], str(broken), zoo["vit16"], "--dataset", "digits", "--max-samples", "4",
                 "--diagnostics", "schatten", "--output-dir", str(out)])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 1
    assert "2 measured now, 0 from the cache, 1 failed" in printed.out and f"failed: {broken}" in printed.err
    table = pd.read_parquet(out / "scan.parquet")
    assert list(dict.fromkeys(table["model"])) == [zoo["crate1"], zoo["vit16"]]
    logged = json.load(open(out / "failures.json"))
    assert [f["model"] for f in logged] == [str(broken)] and logged[0]["error"]
    # the broken model fixed: the next run measures it alone and succeeds
    _crate(broken, 9, 1)
    assert main(["scan", zoo["crate1"], str(broken), zoo["vit16"], "--dataset", "digits", "--max-samples", "4",
                 "--diagnostics", "schatten", "--output-dir", str(out)]) == 0  # fmt: skip
    assert "1 measured now, 2 from the cache, 0 failed" in capsys.readouterr().out


def test_a_diagnostic_that_fails_for_one_model_keeps_the_models_others(zoo, images, tmp_path):
    # the ledger measures white-box models only: the ViT's ledger fails, its Schatten and the CRATE's ledger do not
    result = scan(
        [zoo["crate1"], zoo["vit16"]],
        ["objective-ledger", "schatten"],
        images,
        output_dir=tmp_path / "s",
        progress=False,
    )
    assert [(f["model"], f["diagnostic"]) for f in result.failures] == [(zoo["vit16"], "objective_ledger")]
    assert set(result.table[result.table["diagnostic"] == "schatten"]["model"]) == {zoo["crate1"], zoo["vit16"]}
    assert set(result.table[result.table["diagnostic"] == "objective_ledger"]["model"]) == {zoo["crate1"]}


def test_cli_prefixed_settings_flags(zoo, tmp_path, capsys):
    out = tmp_path / "scan"
    assert main(["scan", zoo["crate1"], "--dataset", "digits", "--max-samples", "4", "--diagnostics", "srr",
                 "--srr-eps", "0.3", "--srr-no-mid", "--output-dir", str(out)]) == 0  # fmt: skip
    entry = json.load(open(next((out / "cache").glob("*.json"))))
    assert entry["settings"]["eps"] == 0.3 and entry["settings"]["include_mid"] is False
    assert entry["settings"] == SRRSettings(eps=0.3, include_mid=False).to_dict()
    with pytest.raises(SystemExit):
        main(["scan", zoo["crate1"], "--srr-eps", "0", "--output-dir", str(out)])
    assert "--srr-eps: expected a finite number > 0, got '0'" in capsys.readouterr().err
    assert main(["scan", zoo["crate1"], "--diagnostics", "schatten", "--srr-eps", "0.2", "--output-dir", str(out)]) == 1
    assert "--srr-eps: the scan does not run srr; add it to --diagnostics" in capsys.readouterr().err
    assert (
        main(["scan", zoo["crate1"], "--diagnostics", "schatten", "--ray-memory-gb", "1", "--output-dir", str(out)])
        == 1
    )
    assert "--ray-memory-gb: only used with --executor ray" in capsys.readouterr().err


def test_model_names_expand_globs_lists_and_run_folders(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for step in (9, 10, 2):
        _crate(run / f"checkpoint-{step}", step, 1)
    monkeypatch.chdir(tmp_path)
    ordered = [os.path.join("run", f"checkpoint-{s}") for s in (2, 9, 10)]
    assert expand_models("run/checkpoint-*") == ordered  # by step, not by name
    assert expand_models(["run"]) == ordered  # a run folder without config.json: its checkpoints
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "zoo.txt").write_text("# my zoo\n../run/checkpoint-10  # last\n\norg/model-a\n")
    listed = expand_models(["@lists/zoo.txt", "run/checkpoint-10"])
    assert listed == [os.path.join(str(tmp_path / "lists"), "../run/checkpoint-10"), "org/model-a"]
    _crate(tmp_path / "final", 1, 1)  # a run folder with its final model: that model, not its checkpoints
    _crate(tmp_path / "final" / "checkpoint-5", 5, 1)
    assert expand_models("final") == ["final"]
    (tmp_path / "self.txt").write_text("@self.txt\n")
    with pytest.raises(ValueError, match="models: list files nest too deeply at '@self.txt'"):
        expand_models("@self.txt")
    (tmp_path / "plain.txt").write_text("plain.txt\n")  # a plain list file naming itself
    with pytest.raises(ValueError, match="models: list files nest too deeply at '.*plain.txt'"):
        expand_models("plain.txt")
    with pytest.raises(ValueError, match="models: the pattern 'nothing/checkpoint-\\*' matches no folder"):
        expand_models("nothing/checkpoint-*")
    with pytest.raises(ValueError, match="is not an existing folder and not a valid Hub id"):
        expand_models(["not a model"])
    with pytest.raises(TypeError, match="models: expected folder paths"):
        expand_models([3])


def test_fingerprint_follows_the_bytes_not_the_path(tmp_path):
    import shutil

    _crate(tmp_path / "a", 1, 1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    memo = {}
    a, b = fingerprint(str(tmp_path / "a"), memo), fingerprint(str(tmp_path / "b"), memo)
    assert (
        a["hash"] == b["hash"]
        and a["method"] == "sha256-content"
        and a["files"] == ["config.json", "model.safetensors"]
    )
    assert fingerprint(str(tmp_path / "b")) == b  # without a memo: the same digest read afresh
    # a trainer checkpoint: its weights and its run's config
    ckpt = _training_run(tmp_path / "run", steps=(3,))[0]
    before = fingerprint(ckpt)
    assert before["files"] == [os.path.join(os.pardir, "config.json"), "model.safetensors"]
    run_config = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps({**run_config, "layer_norm_eps": 1e-3}))
    assert fingerprint(ckpt)["hash"] != before["hash"]
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    config["layer_norm_eps"] = 1e-5
    (tmp_path / "b" / "config.json").write_text(json.dumps(config))
    assert fingerprint(str(tmp_path / "b"), memo)["hash"] != a["hash"]
    data = bytearray((tmp_path / "a" / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of one weight
    (tmp_path / "a" / "model.safetensors").write_bytes(bytes(data))
    assert fingerprint(str(tmp_path / "a"), memo)["hash"] != a["hash"]


def test_compare_tau_and_psi_by_hand(tmp_path):
    # 4 models on a 2 x 2 grid (lr, wd); the measure orders the gap exactly within each lr group and reversed
    # within one wd group: tau over all pairs = (5 concordant - 1 discordant) / 6
    measures = pd.DataFrame({"model": ["m1", "m2", "m3", "m4"], "srr.x": [1.0, 2.0, 3.0, 4.0]})
    meta = {"m1": {"gap": 1.0, "lr": 0.1, "wd": 0.0}, "m2": {"gap": 2.0, "lr": 0.1, "wd": 0.5},
            "m3": {"gap": 4.0, "lr": 0.2, "wd": 0.0}, "m4": {"gap": 3.0, "lr": 0.2, "wd": 0.5}}  # fmt: skip
    rows = {r["target"]: r for r in correlations(measures, meta, hparams=["lr", "wd"])}
    assert set(rows) == {"gap"}  # the hyper-parameters are not targets
    assert math.isclose(rows["gap"]["tau"], 4 / 6)
    # psi_lr: groups wd=0 (m1, m3: concordant) and wd=0.5 (m2, m4: concordant) -> 1; psi_wd: lr=0.1 (m1, m2:
    # concordant) and lr=0.2 (m3, m4: discordant) -> 0; Psi = 1/2
    assert rows["gap"]["psi_per_axis"] == {"lr": 1.0, "wd": 0.0} and rows["gap"]["psi"] == 0.5


def test_checkpoint_metadata_from_trainer_state(tmp_path):
    ckpt = _training_run(tmp_path / "run")[1]
    assert folder_metadata(ckpt) == {"step": 8.0, "epoch": 2.0, "eval_accuracy": 0.4, "eval_loss": 1.8}
    # Transformers' Trainer: global_step and log_history
    (tmp_path / "hf").mkdir()
    state = {"global_step": 5, "epoch": 1.0, "log_history": [{"step": 5, "eval_accuracy": 0.9}, {"step": 4, "loss": 1}]}
    (tmp_path / "hf" / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "hf" / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.95, "dataset": "x"}))
    assert folder_metadata(str(tmp_path / "hf")) == {"step": 5.0, "epoch": 1.0, "eval_accuracy": 0.95}


def test_scan_of_checkpoints_correlates_with_their_held_out_accuracy(tmp_path):
    accuracy = [0.5, 0.3, 0.6, 0.7]  # logged at each checkpoint's step; the bound grows with the steps' noise
    ckpts = _training_run(tmp_path / "run", steps=(2, 4, 6, 8), accuracies=accuracy)
    result = scan(str(tmp_path / "run" / "checkpoint-*"), ["schatten"], output_dir=tmp_path / "s", progress=False)
    rows = {(r["measure"], r["target"]): r for r in result.correlations}
    bound = result.measures.set_index("model")["schatten.edelman_bound"]
    concordant = sum(np.sign(bound[ckpts[i]] - bound[ckpts[j]]) * np.sign(accuracy[i] - accuracy[j])
                     for i in range(4) for j in range(i + 1, 4))  # fmt: skip
    assert rows[("schatten.edelman_bound", "eval_accuracy")]["n"] == 4 and concordant == 4
    assert math.isclose(rows[("schatten.edelman_bound", "eval_accuracy")]["tau"], concordant / 6)
    # a figure per headline measure only; the constant Schatten bound of these random weights has no tau
    assert sorted(os.listdir(tmp_path / "s" / "figures")) == [
        "schatten.edelman_bound.png",
        "schatten.schatten_bound.png",
    ]
    assert rows[("schatten.schatten_bound", "eval_accuracy")]["tau"] is None
    written = pd.read_csv(tmp_path / "s" / "correlations.csv")
    assert set(written["target"]) >= {"eval_accuracy", "step", "epoch"}


def test_bad_arguments_name_the_input(zoo, tmp_path):
    with pytest.raises(ValueError, match="diagnostic: unknown diagnostic 'sr'"):
        scan(zoo["crate1"], ["sr"], output_dir=tmp_path / "s")
    # a registered diagnostic without a scan rule (token_snr needs labels) is refused before anything runs, as is
    # its name on the command line, which names the command to run instead
    with pytest.raises(ValueError, match="diagnostics: a scan runs srr, schatten, concept_fidelity, attention_svm, objective_ledger; "
                                         "not token_snr"):  # fmt: skip
        scan(zoo["crate1"], ["srr", "token_snr"], output_dir=tmp_path / "s")
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        main(["scan", zoo["crate1"], "--diagnostics", "token_snr", "--output-dir", str(tmp_path / "s")])
    assert "'token_snr': a scan runs srr, schatten, concept_fidelity, attention_svm, objective_ledger" in err.getvalue()
    assert "hf-tdiag token-snr per model" in err.getvalue()
    with pytest.raises(ValueError, match="settings: given for \\['srr'\\], which the scan does not run"):
        scan(zoo["crate1"], ["schatten"], settings={"srr": SRRSettings()}, output_dir=tmp_path / "s")
    with pytest.raises(TypeError, match="inputs: got the name 'digits'; pass \\{'images': 'digits'\\}"):
        scan(zoo["crate1"], ["srr"], "digits", output_dir=tmp_path / "s")
    with pytest.raises(ValueError, match="hparams: \\['lr'\\] are not metadata columns of any model"):
        scan(
            zoo["crate1"], ["schatten"], hparams=["lr"], metadata={zoo["crate1"]: {"acc": 1}}, output_dir=tmp_path / "m"
        )
    with pytest.raises(ValueError, match="metadata: rows for models the scan does not have: \\['other'\\]"):
        scan(zoo["crate1"], ["schatten"], metadata={"other": {"acc": 1}}, output_dir=tmp_path / "m")
    assert not (tmp_path / "m" / "cache").exists()  # refused before anything was measured
    with pytest.raises(ValueError, match="jobs"):
        scan(zoo["crate1"], ["srr"], jobs=0, output_dir=tmp_path / "s")
    assert not (tmp_path / "s").exists()  # refused before any folder is made


def test_metadata_from_csv_mapping_and_folders(tmp_path, monkeypatch):
    from hf_tdiag.zoo.compare import measure_figure, read_metadata

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    (tmp_path / "b" / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.5, "note": "x"}))
    (tmp_path / "meta.csv").write_text("model,acc,lr,tag\n./a,0.75,inf,fine-tune\n")
    # a CSV row names the same folder spelled otherwise; non-finite numbers are missing; text stays text; a model
    # without a row reads its folder (all_results.json without a trainer_state.json)
    meta = read_metadata("meta.csv", ["a", "b"])
    assert meta == {"a": {"acc": 0.75, "lr": None, "tag": "fine-tune"}, "b": {"eval_accuracy": 0.5}}
    (tmp_path / "bad.csv").write_text("name,acc\na,1\n")
    with pytest.raises(ValueError, match="metadata: 'bad.csv' has no 'model' column"):
        read_metadata("bad.csv", ["a"])
    with pytest.raises(TypeError, match="metadata: expected a CSV path or a mapping"):
        read_metadata(3, ["a"])
    # a checkpoint whose history logged nothing at its step still has its step
    (tmp_path / "a" / "trainer_state.json").write_text(json.dumps({"global_step": 7, "log_history": []}))
    assert folder_metadata(str(tmp_path / "a")) == {"step": 7.0}
    # Psi leaves out an axis on which every model agrees; a model without metadata is left out of the figure
    measures = pd.DataFrame({"model": ["m1", "m2", "m3", "m4", "m5"], "srr.srr_last_layer": [1.0, 2.0, 3.0, 4.0, 5.0]})
    meta = {
        f"m{i}": {"gap": g, "lr": lr, "seed": 0.0}
        for i, g, lr in ((1, 1.0, 0.1), (2, 2.0, 0.1), (3, 3.0, 0.2), (4, 5.0, 0.2))
    }
    rows = correlations(measures, meta, hparams=["lr", "seed"])
    assert [(r["target"], r["n"], r["tau"], r["psi_per_axis"]) for r in rows] == [("gap", 4, 1.0, {"lr": 1.0})]
    fig = measure_figure("srr.srr_last_layer", measures, meta, rows)
    (panel,) = fig.axes
    assert panel.collections[0].get_offsets().shape == (4, 2) and panel.get_title() == "τ = +1.00, Ψ = +1.00"
