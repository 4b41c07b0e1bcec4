"""``--push_to_hub`` over real HTTP against the local Hub server (tests/hub_server.py), then a remote-code reload."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load, load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_server import LocalHub  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = "tester/crate-digits-tiny"

_RELOAD = r"""
import json, sys
import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
processor = AutoImageProcessor.from_pretrained(sys.argv[1], trust_remote_code=True)
torch.manual_seed(0)
x = torch.randn(2, 1, 16, 16)
with torch.no_grad():
    logits = model(pixel_values=x).logits
print(json.dumps({
    "model_module": type(model).__module__,
    "processor_module": type(processor).__module__,
    "hf_tdiag_loaded": "hf_tdiag" in sys.modules,
    "logits": logits.tolist(),
}))
"""


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "run"
    with LocalHub() as hub:
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": "hf_local_test_token",
            "HF_HOME": str(out.parent / "hf_home"),
            "PYTHONPATH": ROOT,
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        cmd = [
            sys.executable,
            os.path.join(ROOT, "recipes", "train_crate.py"),
            "--output_dir",
            str(out),
            "--push_to_hub",
            "--hub_model_id",
            REPO.split("/")[1],  # a bare name: the Hub puts it under the token's user
            "--hidden_size",
            "16",
            "--num_hidden_layers",
            "2",
            "--num_attention_heads",
            "2",
            "--max_train_steps",
            "2",
            "--per_device_train_batch_size",
            "32",
            "--max_train_samples",
            "64",
            "--max_eval_samples",
            "32",
            "--layer_srr_samples",
            "16",
            "--disable_tqdm",
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        # a fresh interpreter that never imports hf_tdiag: the repo's own code must be enough
        env_reload = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        reload = subprocess.run(
            [sys.executable, "-c", _RELOAD, REPO],
            env=env_reload,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=str(out.parent),
        )
        assert reload.returncode == 0, reload.stderr[-4000:]
        yield {
            "url": hub.url,
            "stdout": proc.stdout,
            "out": out,
            "files": hub.files(REPO),
            "commits": hub.commits(REPO),
            "reload": json.loads(reload.stdout.strip().splitlines()[-1]),
            "unhandled": [r for r in hub.unhandled if "agent-harnesses" not in r[1]],
        }


def test_push_uploads_weights_config_processor_code_results_and_card(pushed):
    files, out = pushed["files"], pushed["out"]
    for name in (
        "model.safetensors",
        "config.json",
        "configuration_crate.py",
        "modeling_crate.py",
        "preprocessor_config.json",
        "image_processing_crate.py",
        "README.md",
        "all_results.json",
        "layer_srr.json",
        "layer_srr.png",
    ):
        assert name in files, name
    assert pushed["unhandled"] == []
    # the weights that arrived are the trained weights
    remote = load(files["model.safetensors"])
    local = load_file(str(out / "model.safetensors"))
    assert remote.keys() == local.keys() and all(torch.equal(remote[k], local[k]) for k in local)
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForImageClassification"] == "modeling_crate.CrateForImageClassification"
    # the filled card is pushed last, so model.push_to_hub's generic README does not survive
    assert pushed["commits"][-1]["summary"] == "Upload model card"
    assert files["README.md"].decode() == (out / "README.md").read_text()
    assert "model-index" in files["README.md"].decode()
    assert json.loads(files["all_results.json"]) == json.loads((out / "all_results.json").read_text())


def test_pushed_repo_loads_with_trust_remote_code_and_gives_the_same_logits(pushed):
    from transformers import AutoModelForImageClassification

    import hf_tdiag  # noqa: F401  (registers the crate model type for the local reference load)

    info = pushed["reload"]
    assert not info["hf_tdiag_loaded"]
    assert info["model_module"].startswith("transformers_modules")
    assert info["processor_module"].startswith("transformers_modules")
    model = AutoModelForImageClassification.from_pretrained(str(pushed["out"])).eval()
    torch.manual_seed(0)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        expected = model(pixel_values=x).logits
    torch.testing.assert_close(torch.tensor(info["logits"]), expected, rtol=1e-5, atol=1e-6)


def test_push_prints_the_url_and_the_card_names_the_resolved_repo(pushed):
    assert f"pushed to the Hub: {pushed['url']}/{REPO}" in pushed["stdout"]
    card = pushed["files"]["README.md"].decode()
    assert f'from_pretrained("{REPO}")' in card and 'from_pretrained("crate-digits-tiny")' not in card


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.slow
def test_unreachable_hub_fails_before_training_naming_offline_mode_and_the_folder(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "HF_HUB_OFFLINE": "0"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=ROOT, HF_TOKEN="hf_local_test_token")
    cmd = [sys.executable, os.path.join(ROOT, "recipes", "train_crate.py"), "--output_dir", str(out)]
    cmd += ["--push_to_hub", "--hub_model_id", "x", "--max_train_steps", "1", "--disable_tqdm"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert "is unreachable (" in message and "127.0.0.1" in message
    assert "HF_HUB_OFFLINE" in message and "from_pretrained(<folder>)" in message and str(out) in message
    assert not (out / "model.safetensors").exists()  # it failed before training, not after


def test_offline_mode_refuses_a_push_at_once_naming_the_local_folder(tmp_path, monkeypatch):
    from hf_tdiag.training.hub import HubUnreachableError, check_hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError, match=r"HF_HUB_OFFLINE is set.*from_pretrained\(<folder>\)"):
        check_hub_reachable(endpoint="http://127.0.0.1:9", output_dir=str(tmp_path))


def test_card_yaml_names_the_hub_dataset_and_base_model_and_the_snippet_the_repo(tmp_path):
    from types import SimpleNamespace

    from hf_tdiag.models.crate import CrateConfig
    from hf_tdiag.training import args as targs
    from hf_tdiag.training.model_card import build_model_card

    config = CrateConfig.from_preset("crate-32", hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    raw = SimpleNamespace(dataset_id="uoft-cs/cifar10", name="uoft-cs/cifar10", eval_split="test", is_digits=False)
    results = dict(eval_accuracy=0.5, eval_loss=1.0, train_loss=0.5, train_accuracy=0.75, generalization_gap=0.5)
    args = targs.make_args(
        output_dir=str(tmp_path / "main"), dataset_name="uoft-cs/cifar10", model_name_or_path="someone/crate-base"
    )
    card = build_model_card(config, results, args, raw, repo_id="me/crate-c10")
    front = str(card).split("---")[1]
    assert "datasets:\n- uoft-cs/cifar10" in front and "base_model: someone/crate-base" in front
    assert 'from_pretrained("me/crate-c10")' in str(card) and 'from_pretrained("main")' not in str(card)
