"""The card ``save_pretrained`` / ``push_to_hub`` write for every family (hf_tdiag/_hub_card.py): the preset
only where the sizes are that preset's, the snippet naming the folder path or the repo id (and it loads), a user's
README kept, a training card carried over only while the weights are the folder's; pushed to the local Hub server
(tests/hub_server.py): the README's YAML and snippet, ``base_model`` for a fine-tune of a Hub model."""

import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import ModelCard

import hf_tdiag  # noqa: F401  (registers the families)
from hf_tdiag._hub_card import same_weights
from hf_tdiag.models.crate import CRATE_PRESETS, CrateConfig, CrateForImageClassification
from hf_tdiag.models.crate_alpha import CRATE_ALPHA_PRESETS, CrateAlphaConfig, CrateAlphaForImageClassification
from hf_tdiag.models.crate_mae import CRATE_MAE_PRESETS, CrateMAEConfig, CrateMAEForPreTraining
from hf_tdiag.models.crate_text import CrateTextConfig, CrateTextForCausalLM
from hf_tdiag.models.crate_text.configuration_crate_text import CRATE_TEXT_PRESETS
from hf_tdiag.models.tost import TOST_PRESETS, TostConfig, TostForImageClassification
from hf_tdiag.training import model_card

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_server import LocalHub  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNIPPET = re.compile(r'model = (\w+)\.from_pretrained\("([^"]+)"\)')


def _models():
    torch.manual_seed(0)
    text = CrateTextConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           max_position_embeddings=16, is_decoder=True)  # fmt: skip
    return {
        "crate": CrateForImageClassification(CrateConfig.from_preset("crate-digits", variant="crate-c", num_labels=3)),
        "crate-alpha": CrateAlphaForImageClassification(CrateAlphaConfig.from_preset("crate-alpha-digits")),
        "crate-mae": CrateMAEForPreTraining(CrateMAEConfig.from_preset("crate-mae-digits")),
        "tost": TostForImageClassification(TostConfig.from_preset("tost-digits")),
        "crate_text": CrateTextForCausalLM(text),
    }


@pytest.mark.parametrize(
    ("cls", "table"),
    [
        (CrateConfig, CRATE_PRESETS),
        (CrateAlphaConfig, CRATE_ALPHA_PRESETS),
        (CrateMAEConfig, CRATE_MAE_PRESETS),
        (TostConfig, TOST_PRESETS),
        (CrateTextConfig, CRATE_TEXT_PRESETS),
    ],  # fmt: skip
)
def test_every_preset_is_recognised_and_a_changed_size_is_none(cls, table):
    for name in table:
        assert model_card.matching_preset(cls.from_preset(name), prefer=name) == name
        # a config saved and reloaded (sizes as JSON lists) is still the preset
        assert model_card.matching_preset(cls.from_dict(cls.from_preset(name).to_dict()), prefer=name) == name
    first = next(iter(table))
    wider = cls.from_preset(first, hidden_size=cls.from_preset(first).hidden_size * 2)
    assert model_card.matching_preset(wider) is None


def test_the_trainers_16px_digits_model_is_no_preset_and_a_variant_keeps_its_size():
    # the main job's model: crate-digits with the trainer's 16 px / patch 4 (the preset is 8 px / patch 2)
    assert model_card.matching_preset(CrateConfig.from_preset("crate-digits", image_size=16, patch_size=4)) is None
    assert model_card.matching_preset(CrateConfig.from_preset("crate-digits", variant="crate-n")) == "crate-digits"
    assert model_card.matching_preset(CrateConfig.from_preset("crate-digits", num_labels=7)) == "crate-digits"


def test_folder_display_relative_as_given_absolute_never_shown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_card.folder_display("runs/main") == "runs/main"
    assert model_card.folder_display("./runs//main/") == "runs/main"
    assert model_card.folder_display(str(tmp_path / "runs" / "main")) == "runs/main"  # under the working directory
    outside = tmp_path.parent / "elsewhere" / "run7"
    assert model_card.folder_display(str(outside)) == "path/to/run7"


def test_training_card_snippet_and_command_name_the_folder_path_and_no_invented_link(monkeypatch, tmp_path):
    from hf_tdiag.training import args as targs

    monkeypatch.chdir(tmp_path)
    config = CrateConfig.from_preset("crate-digits", image_size=16, patch_size=4, num_labels=10)
    raw = SimpleNamespace(dataset_id="sklearn-digits", name="digits", eval_split="test", is_digits=True)
    results = dict(eval_accuracy=0.5, eval_loss=1.0, train_loss=0.5, train_accuracy=0.75, generalization_gap=0.5)
    args = targs.make_args(output_dir="runs/main", dataset_name="digits")
    card = model_card.build_model_card(config, results, args, raw, preset="crate-digits")
    text = str(card)
    assert 'from_pretrained("runs/main")' in text and 'from_pretrained("main")' not in text
    assert "--output_dir runs/main" in text
    assert "preset `crate-digits`" not in text and card.data.model_name == "CRATE on sklearn-digits"
    assert "github.com" not in text and re.findall(r"\]\((https?://[^)]+)\)", text) == []
    eight = CrateConfig.from_preset("crate-digits", num_labels=10)
    assert "preset `crate-digits`" in str(model_card.build_model_card(eight, results, args, raw, preset="crate-digits"))


def test_save_pretrained_writes_each_familys_card_whose_snippet_loads_the_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    presets = {"crate": "crate-digits", "crate-alpha": "crate-alpha-digits", "crate-mae": "crate-mae-digits",
               "tost": "tost-digits", "crate_text": None}  # fmt: skip
    for name, model in _models().items():
        folder = os.path.join("saved", name)
        model.save_pretrained(folder)
        card = ModelCard.load(os.path.join(folder, "README.md"))
        assert model_card.PROJECT_TAG in card.data.tags and card.data.library_name == "transformers"
        assert card.data.base_model is None and card.data.eval_results is None  # no record: no metrics claimed
        assert "no training record" in card.text
        preset = presets[name]
        assert (f"preset `{preset}`" in card.text) if preset else ("no preset" in card.text)
        auto, where = SNIPPET.search(card.text).groups()
        assert where == folder
        import transformers

        loaded = getattr(transformers, auto).from_pretrained(where)  # the snippet, run as written
        assert type(loaded) is type(model)
        for key, value in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (name, key)


def test_a_users_readme_is_never_replaced(tmp_path):
    model = _models()["tost"]
    (tmp_path / "README.md").write_text("# my notes\n")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text() == "# my notes\n"
    assert (tmp_path / "model.safetensors").exists()


def _training_folder(folder, model):
    from hf_tdiag.training import args as targs

    model.save_pretrained(folder)
    raw = SimpleNamespace(dataset_id="sklearn-digits", name="digits", eval_split="test", is_digits=True)
    results = dict(eval_accuracy=0.625, eval_loss=1.0, train_loss=0.5, train_accuracy=0.75, generalization_gap=0.5)
    args = targs.make_args(output_dir=str(folder), dataset_name="digits")
    model_card.build_model_card(model.config, results, args, raw, repo_id="somewhere/else").save(
        os.path.join(folder, "README.md")
    )


def test_a_training_card_follows_the_weights_it_describes_and_only_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _training_folder("run", _models()["crate"])
    trained = (tmp_path / "run" / "README.md").read_text()
    model = CrateForImageClassification.from_pretrained("run")
    model.save_pretrained("copy")
    copied = (tmp_path / "copy" / "README.md").read_text()
    assert copied == trained.replace('from_pretrained("somewhere/else")', 'from_pretrained("copy")')
    assert same_weights("run", "copy")
    with torch.no_grad():
        model.classifier.bias.add_(1.0)  # fine-tuned in memory: the run's card no longer describes it
    model.save_pretrained("tuned")
    assert not same_weights("run", "tuned")
    tuned = ModelCard.load(str(tmp_path / "tuned" / "README.md"))
    assert tuned.data.eval_results is None and "0.625" not in tuned.text
    assert "local checkpoint `run`; its weights have changed since" in tuned.text
    model.save_pretrained("run")  # back into the folder it came from: the folder's card stays as it is
    assert (tmp_path / "run" / "README.md").read_text() == trained


_PUSH = textwrap.dedent(
    """
    import sys
    import torch
    import hf_tdiag
    from huggingface_hub import HfApi
    from transformers import AutoModel, AutoModelForImageClassification
    run, tost = sys.argv[1], sys.argv[2]
    AutoModelForImageClassification.from_pretrained(run).push_to_hub("crate-run")  # a training folder's model
    AutoModel.from_pretrained(tost).push_to_hub("tost")  # no training record
    tuned = AutoModelForImageClassification.from_pretrained("tester/crate-run")  # a Hub model, fine-tuned
    with torch.no_grad():
        tuned.classifier.bias.add_(1.0)
    tuned.push_to_hub("crate-tuned")
    HfApi().create_repo("own")
    HfApi().upload_file(path_or_fileobj=b"# my card\\n", path_in_repo="README.md", repo_id="tester/own")
    AutoModel.from_pretrained(tost).push_to_hub("own")
    print("PUSHED")
    """
)


def test_push_to_hub_gives_the_hub_the_project_card(tmp_path):
    models = _models()
    _training_folder(tmp_path / "run", models["crate"])
    models["tost"].tost.save_pretrained(tmp_path / "tost")  # the base model: AutoModel
    (tmp_path / "tost" / "README.md").unlink()
    with LocalHub() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_local_test_token",
               "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ROOT, "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", _PUSH, str(tmp_path / "run"), str(tmp_path / "tost")], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0 and "PUSHED" in proc.stdout, proc.stderr[-3000:]
        cards = {
            repo: hub.files(f"tester/{repo}")["README.md"].decode() for repo in ("crate-run", "tost", "crate-tuned")
        }
        own = hub.files("tester/own")["README.md"]
        commits = {repo: [c["summary"] for c in hub.commits(f"tester/{repo}")] for repo in ("crate-run", "tost")}
        assert [r for r in hub.unhandled if "agent-harnesses" not in r[1]] == []
    # the training folder's card, its snippet naming the repo the Hub resolved; its metrics in the model-index
    run = ModelCard(cards["crate-run"])
    assert run.data.library_name == "transformers" and "hf-tdiag" in run.data.tags and "crate" in run.data.tags
    metrics = {r.metric_type: r.metric_value for r in run.data.eval_results}
    assert metrics["accuracy"] == 0.625 and run.data.base_model is None
    assert SNIPPET.search(run.text).groups() == ("AutoModelForImageClassification", "tester/crate-run")
    assert len(commits["crate-run"]) == 1  # one commit: the card came with the weights
    # a model with no training record: the family card, no metrics, the repo in the snippet
    tost = ModelCard(cards["tost"])
    assert tost.data.tags == ["white-box-transformer", "hf-tdiag", "tost"] and tost.data.eval_results is None
    assert SNIPPET.search(tost.text).groups() == ("AutoModel", "tester/tost") and "preset `tost-digits`" in tost.text
    assert "transformers model that has been pushed on the Hub" not in cards["tost"]
    # a fine-tune of a Hub model names it as base_model
    tuned = ModelCard(cards["crate-tuned"])
    assert tuned.data.base_model == "tester/crate-run" and tuned.data.eval_results is None
    assert SNIPPET.search(tuned.text).groups()[1] == "tester/crate-tuned"
    assert "[`tester/crate-run`](https://huggingface.co/tester/crate-run)" in tuned.text
    # a card the repo already had, not written by hf-tdiag, stays (transformers adds an empty YAML header)
    assert own.decode().split("---\n")[-1] == "# my card\n" and "hf-tdiag" not in own.decode()
