"""Hub ids over real HTTP: every path that accepts ``org/name`` downloads it from tests/hub_server.py (a local Hub
stand-in) through huggingface_hub, exactly as from huggingface.co — from_pretrained, snapshot_download, the evaluate
modules, the command line; a custom-code repo is refused unless the user opts in (and never prompts under a
terminal), a missing repo is a clear error.

huggingface_hub reads ``HF_ENDPOINT`` when it is imported, so each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hub_server import LocalHub
from test_loading import write_custom_code_repo

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "on", "mat", "ran", "."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Local save_pretrained folders: a CRATE digits classifier, a tiny BERT with its tokenizer, a custom-code repo."""
    from transformers import BertConfig, BertModel, BertTokenizer

    from hf_tdiag import CrateConfig, CrateForImageClassification, CrateImageProcessor

    root = tmp_path_factory.mktemp("hub_models")
    torch.manual_seed(0)
    config = CrateConfig.from_preset("crate-digits", num_labels=10, id2label={i: str(i) for i in range(10)})
    CrateForImageClassification(config).save_pretrained(root / "crate")
    CrateImageProcessor.for_config(config).save_pretrained(root / "crate")
    bert = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    BertModel(bert).save_pretrained(root / "bert")
    BertTokenizer(vocab={w: i for i, w in enumerate(VOCAB)}).save_pretrained(root / "bert")
    write_custom_code_repo(root / "custom")
    return root


@pytest.fixture(scope="module")
def hub(folders):
    with LocalHub() as hub:
        for name in ("crate", "bert", "custom"):
            hub.add_folder(f"org/{name}", folders / name)
        yield hub


def run_with_hub(hub, code: str, tmp_path, *, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter pointed at ``hub`` with an empty Hugging Face cache."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf_home"),
        "CUSTOM_CODE_MARKER": str(tmp_path / "marker.txt"),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_from_pretrained_snapshot_and_evaluate_over_http(hub, folders, tmp_path):
    proc = run_with_hub(
        hub,
        f"""
        import json, torch, evaluate, hf_tdiag
        from huggingface_hub import snapshot_download
        from safetensors.torch import load_file
        from transformers import AutoModel, AutoModelForImageClassification
        from hf_tdiag.inputs import digits_images

        local = load_file({str(folders / "crate" / "model.safetensors")!r})
        clf = AutoModelForImageClassification.from_pretrained("org/crate")
        same = all(torch.equal(clf.state_dict()[k], v) for k, v in local.items())
        base = AutoModel.from_pretrained("org/crate")
        snap = sorted(__import__("os").listdir(snapshot_download("org/crate")))
        images = digits_images(4).images
        srr = evaluate.load(hf_tdiag.metric_path("srr"))
        hub_srr = srr.compute(model="org/crate", images=images)
        local_srr = srr.compute(model={str(folders / "crate")!r}, images=images)
        print(json.dumps(dict(same=same, base=type(base).__name__, snap=snap, hub=hub_srr, local=local_srr)))
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same"] and out["base"] == "CrateModel"
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= set(out["snap"])
    assert out["hub"] == out["local"]  # the same weights give the same numbers
    assert {"config.json", "model.safetensors"} <= set(hub.downloads("org/crate"))
    assert not hub.unhandled, hub.unhandled


def test_text_model_and_tokenizer_over_http(hub, folders, tmp_path):
    proc = run_with_hub(
        hub,
        """
        import json
        from hf_tdiag.loading import load_model
        loaded = load_model("org/bert")
        batch = loaded.processor(["the cat sat on the mat ."], return_tensors="pt")
        print(json.dumps(dict(modality=loaded.modality, ids=batch["input_ids"][0].tolist())))
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["modality"] == "text"
    assert out["ids"] == [VOCAB.index(w) for w in ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]]


def test_custom_code_repo_is_refused_then_runs_on_opt_in(hub, tmp_path):
    proc = run_with_hub(
        hub,
        """
        from hf_tdiag.loading import load_model, load_pretrained
        try:
            load_model("org/custom")
        except ValueError as err:
            print("REFUSED", err)
        model = load_pretrained("org/custom", trust_remote_code=True)
        print("LOADED", type(model).__name__)
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused, loaded = proc.stdout.strip().splitlines()[-2:]
    assert (
        refused.startswith("REFUSED model: 'org/custom' needs its own Python code")
        and "trust_remote_code=True" in refused
    )
    assert loaded == "LOADED TinyCustomModel"
    assert "config ran" in (tmp_path / "marker.txt").read_text()  # ran only after the opt-in
    assert "modeling_tiny.py" in hub.downloads("org/custom")


def test_custom_code_repo_refused_without_prompt_under_a_terminal(hub, tmp_path):
    """``hf-tdiag schatten org/custom`` in a pseudo-terminal: no "[y/N]" question, a clear error, no code run."""
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf_home"),
        "CUSTOM_CODE_MARKER": str(tmp_path / "marker.txt"),
    }
    code = "import sys\nfrom hf_tdiag.cli import main\nsys.exit(main(['schatten', 'org/custom']))"
    controller, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=child, stdout=child, stderr=child, env=env, cwd=tmp_path
    )
    os.close(child)
    output, deadline = b"", time.monotonic() + 300
    while time.monotonic() < deadline:
        ready = select.select([controller], [], [], 0.5)[0]
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if b"[y/N]" in output:
                os.write(controller, b"y\n")  # what a hurried user types; must never be asked
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(controller)
    text = output.decode(errors="replace")
    assert "[y/N]" not in text and "needs its own Python code" in text, text[-2000:]
    assert proc.returncode == 1 and "Traceback" not in text
    assert not (tmp_path / "marker.txt").exists()


def test_missing_repo_is_a_clear_error(hub, tmp_path):
    proc = run_with_hub(
        hub,
        """
        import sys
        from hf_tdiag.loading import load_model
        try:
            load_model("org/missing")
        except ValueError as err:
            print("ERROR", err)
        from hf_tdiag.cli import main
        sys.exit(main(["srr", "org/missing", "--dataset", "digits"]))
    """,
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert (
        "ERROR model: 'org/missing' is neither a local model folder nor a model id reachable on the Hub" in proc.stdout
    )
    assert "org/missing" in proc.stderr and "Traceback" not in proc.stderr


def test_commands_take_hub_ids_over_http(hub, folders, tmp_path):
    """hf-tdiag srr | schatten | concepts | report with org/name: downloaded over HTTP, the same numbers as the
    local folders they were uploaded from."""
    crate, bert = str(folders / "crate"), str(folders / "bert")
    proc = run_with_hub(
        hub,
        f"""
        import json
        from hf_tdiag.cli import main

        def srr(model, out):
            assert main(["srr", model, "--dataset", "digits", "--limit", "8", "--output-dir", out]) == 0
            return json.load(open(out + "/srr.json"))

        def schatten(models, out):
            assert main(["schatten", *models, "--json", out]) == 0
            return json.load(open(out))

        result = dict(
            srr=(srr("org/crate", "hub_srr"), srr({crate!r}, "local_srr")),
            schatten=(schatten(["org/bert", "org/crate"], "hub.json"), schatten([{bert!r}, {crate!r}], "local.json")),
            concepts=main(["concept-fidelity", "org/crate", "--dataset", "digits", "--limit", "8", "--concepts", "2",
                           "--layer", "1", "--no-bound", "--no-figures", "--output-dir", "concepts_out"]),
            report=main(["report", "org/crate", "--dataset", "digits", "--max-images", "8",
                         "--sections", "summary", "srr", "-o", "report_out/report.html"]),
        )
        print(json.dumps(result))
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    hub_srr, local_srr = out["srr"]
    assert _numbers(hub_srr) == _numbers(local_srr) and _numbers(hub_srr)
    hub_s, local_s = out["schatten"]
    assert [r["schatten_bound"] for r in hub_s] == [r["schatten_bound"] for r in local_s] and len(hub_s) == 2
    assert out["concepts"] == 0 and (tmp_path / "concepts_out" / "concept_fidelity.json").is_file()
    assert out["report"] == 0 and "org/crate" in (tmp_path / "report_out" / "report.json").read_text()
    assert {"config.json", "model.safetensors"} <= set(hub.downloads("org/bert"))


def _numbers(value):
    """Every number in a JSON value, in order (names and paths left out)."""
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _numbers(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_streaming_bounds_of_a_hub_decoder_equal_the_local_folders(hub, tmp_path):
    from decoder_models import build

    folder = tmp_path / "gpt2"
    build("gpt2").save_pretrained(folder)
    hub.add_folder("org/gpt2", folder)
    proc = run_with_hub(
        hub,
        f"""
        import json
        from hf_tdiag.diagnostics.schatten import schatten_bounds

        remote = schatten_bounds("org/gpt2", streaming=True, progress=False)
        local = schatten_bounds({str(folder)!r}, streaming=True, progress=False)
        print(json.dumps(dict(remote=remote.to_dict(False), local=local.to_dict(False))))
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    remote, local = out["remote"], out["local"]
    assert remote.pop("model") == "org/gpt2" and local.pop("model") == str(folder)
    assert remote == local and remote["num_layers"] == 2
    # streaming downloads only the config and the safetensors weights
    assert {"config.json", "model.safetensors"} <= set(hub.downloads("org/gpt2"))
    assert not hub.unhandled, hub.unhandled
