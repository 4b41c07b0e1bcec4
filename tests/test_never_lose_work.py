"""Never lose a user's work (issue 29), end to end: the command line refuses before loading anything, training
twice into one folder leaves the first model byte-identical, a resume with a changed learning rate is refused and
leaves the checkpoint as it was, two models of the same folder name stay two rows, images of every format reach
the model through one converter, and the public diagnostics leave the caller's model and torch state as found.
The fast tables of the same rules are in tests/test_output_safety.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from hf_tdiag.cli import main as cli_main

pytestmark = pytest.mark.slow


def _tree(root) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (to prove nothing changed)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def _fill(folder, *names) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in names:
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(f"old {name}\n")


# ----------------------------------------------------------------------------------------- command line


def _cli(argv, capsys):
    code = cli_main(argv)
    return code, capsys.readouterr().err


def test_cli_report_into_a_model_folder_named_config_refuses_and_keeps_the_model(tmp_path, capsys):
    _fill(tmp_path / "model", "config.json", "model.safetensors")
    before = _tree(tmp_path / "model")
    for extra in ([], ["--overwrite-output-dir"]):
        code, err = _cli(
            [
                "report",
                str(tmp_path / "model"),
                "--dataset",
                "digits",
                "-o",
                str(tmp_path / "model" / "config.html"),
                *extra,
            ],
            capsys,
        )
        assert code == 1 and "config.json" in err and "would replace" in err and len(err.strip().splitlines()) == 1
    assert _tree(tmp_path / "model") == before and not (tmp_path / "model" / "config.html").exists()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["srr", "M", "--dataset", "digits", "--output-dir", "N"], "already holds another run's"),
        (["schatten", "M", "--output-dir", "N"], "already holds another run's"),
        (["concept-fidelity", "M", "--dataset", "digits", "--output-dir", "N"], "already holds another run's"),
        (
            ["attention-svm", "M", "--layer", "1", "--dataset", "digits", "--output-dir", "N"],
            "already holds another run's",
        ),
        (["report", "M", "--dataset", "digits", "--output-dir", "N"], "already holds another run's"),
        (["report", "M", "--dataset", "digits", "-o", "page.txt"], "--output: expected a file name ending in .html"),
        (["srr", "M", "--dataset", "digits", "--output_dir", "old"], "srr.json"),  # the underscore spelling too
    ],
    ids=["srr", "schatten", "concept-fidelity", "attention-svm", "report", "report-suffix", "srr-old-results"],
)
def test_cli_commands_refuse_before_loading_the_model(tmp_path, capsys, argv, named):
    _fill(tmp_path / "M", "config.json", "model.safetensors")  # not a loadable model: refusal comes first
    _fill(tmp_path / "N", "config.json", "model.safetensors")  # another model's folder as the output
    _fill(tmp_path / "old", "srr.json")
    before = _tree(tmp_path)
    code, err = _cli([str(tmp_path / a) if a in ("M", "N", "old", "page.txt") else a for a in argv], capsys)
    assert code == 1 and named in err and "Traceback" not in err
    assert _tree(tmp_path) == before


def test_device_on_the_command_line_is_one_line_not_a_traceback(capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        cli_main(["srr", "M", "--dataset", "digits", "--device", "cuda:99"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--device" in err and "cuda:99" in err and "Traceback" not in err


# ----------------------------------------------------------------------------------------- training

TINY = [
    "--hidden-size", "16", "--num-hidden-layers", "2", "--num-attention-heads", "2",
    "--per-device-train-batch-size", "32", "--max-train-samples", "128", "--max-eval-samples", "32",
    "--layer-srr-samples", "0", "--disable-tqdm", "--seed", "3",
]  # fmt: skip


def _train(capsys, out, *extra):
    return _cli(["train", "--output-dir", str(out), *TINY, *extra], capsys)


def test_training_twice_into_one_folder_refuses_and_keeps_the_first_model(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _train(capsys, out, "--max-train-steps", "4", "--checkpointing-steps", "2")
    assert code == 0, err
    first = _tree(out)
    assert "model.safetensors" in first and "checkpoint-4/trainer_state.json" in first
    code, err = _train(capsys, out, "--max-train-steps", "2", "--learning-rate", "0.1")
    assert code == 1 and "--overwrite-output-dir" in err and "model.safetensors" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _tree(out) == first  # byte-identical: weights, checkpoints, card, results
    # with the flag the previous run's files go (a stale page from a report of the old model too), the new run's come
    _fill(out, "report.html")
    from hf_tdiag._outputs import adopt_outputs

    adopt_outputs(out, ["report.html"])  # written by an earlier hf-tdiag report, as its manifest records (issue 45)
    code, err = _train(capsys, out, "--max-train-steps", "2", "--overwrite-output-dir")
    assert code == 0, err
    after = _tree(out)
    assert not any(k.startswith(("checkpoint-", "report.html")) for k in after)
    assert (
        json.loads(after["all_results.json"])["steps"] == 2 and after["model.safetensors"] != first["model.safetensors"]
    )


def test_resume_with_another_learning_rate_is_refused_and_the_checkpoint_kept(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = _train(capsys, out, "--max-train-steps", "4", "--checkpointing-steps", "2", "--learning-rate", "0.003")
    assert code == 0, err
    before = _tree(out)
    code, err = _train(capsys, out, "--max-train-steps", "4", "--learning-rate", "0.01",
                       "--resume-from-checkpoint", "latest")  # fmt: skip
    assert code == 1 and "learning_rate: 0.003 -> 0.01" in err and "checkpoint-4" in err
    assert _tree(out) == before
    state = json.loads(before["checkpoint-4/trainer_state.json"])
    assert state["settings"]["learning_rate"] == 0.003 and len(state["run_id"]) == 12
    # the same settings resume (no flag needed: the checkpoints are this folder's run)
    code, err = _train(capsys, out, "--max-train-steps", "4", "--checkpointing-steps", "2", "--learning-rate", "0.003",
                       "--resume-from-checkpoint", "latest")  # fmt: skip
    assert code == 0, err
    assert json.loads((out / "all_results.json").read_text())["resumed_from"] == str(out / "checkpoint-4")


def test_a_full_disk_while_checkpointing_names_the_checkpoint(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from hf_tdiag.training.loop import train

    def full(self, output_dir=None, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 128 vs 0")  # torch's words

    monkeypatch.setattr(Accelerator, "save_state", full)
    with pytest.raises(OSError) as info:
        train(output_dir=str(tmp_path / "run"), max_train_steps=2, checkpointing_steps=1, hidden_size=16,
              num_hidden_layers=1, num_attention_heads=2, max_train_samples=64, max_eval_samples=16,
              layer_srr_samples=0, disable_tqdm=True)  # fmt: skip
    assert str(tmp_path / "run" / "checkpoint-1") in str(info.value)
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path / "run"))


# ----------------------------------------------------------------------------------------- measuring


@pytest.fixture(scope="module")
def crate_folder(tmp_path_factory):
    from hf_tdiag.models.crate import CrateConfig, CrateForImageClassification, CrateImageProcessor

    root = tmp_path_factory.mktemp("crate")
    torch.manual_seed(0)
    cfg = CrateConfig.from_preset("crate-digits", num_labels=10, num_hidden_layers=2)
    for sub in ("a/model", "b/model"):
        torch.manual_seed(len(sub) if sub.startswith("a") else 99)
        CrateForImageClassification(cfg).save_pretrained(root / sub)
        CrateImageProcessor.for_config(cfg).save_pretrained(root / sub)
    return root


def test_two_models_of_the_same_folder_name_are_two_rows(crate_folder, capsys, tmp_path):
    code, err = _cli(["srr", str(crate_folder / "a/model"), str(crate_folder / "b/model"), "--dataset", "digits",
                      "--max-samples", "8", "--output-dir", str(tmp_path / "srr")], capsys)  # fmt: skip
    assert code == 0, err
    reports = json.loads((tmp_path / "srr" / "srr.json").read_text())["reports"]
    assert sorted(reports) == ["a/model (crate)", "b/model (crate)"]
    a, b = (reports[k] for k in sorted(reports))
    assert a != b  # two different models measured, not one measured twice


def test_16_bit_images_reach_the_model_scaled_not_clipped(crate_folder, tmp_path):
    from hf_tdiag.inputs import load_images
    from hf_tdiag.loading import load_model, pixel_values_for

    digit = np.zeros((8, 8), dtype=np.uint16)
    digit[2:6, 3:5] = 65535
    digit[0, 0] = 30000
    os.makedirs(tmp_path / "imgs" / "1")
    Image.fromarray(digit).save(tmp_path / "imgs" / "1" / "a.png")  # 16-bit grayscale PNG
    Image.fromarray((digit >> 8).astype(np.uint8)).save(tmp_path / "imgs" / "1" / "b.png")  # the same, 8 bits
    found = load_images(str(tmp_path / "imgs"))
    eight = [np.asarray(im) for im in found.images]
    np.testing.assert_array_equal(eight[0], np.rint(digit * (255.0 / 65535.0)).astype(np.uint8))
    assert (eight[0] == 255).mean() == pytest.approx(8 / 64)  # not 99% white
    loaded = load_model(str(crate_folder / "a/model"))
    raw = [Image.open(tmp_path / "imgs" / "1" / n) for n in ("a.png", "b.png")]  # PIL images as a user passes them
    x = pixel_values_for(raw, loaded)
    torch.testing.assert_close(x[0], x[1], atol=2 / 255 * 4, rtol=0)  # 16-bit and 8-bit copies: the same input


def _state(model):
    return (
        [m.training for m in model.modules()],
        [(p.device, p.dtype, p.requires_grad) for p in model.parameters()],
        torch.is_grad_enabled(),
    )


@pytest.mark.parametrize("name", ["layer_srr", "concept_fidelity", "attention_svm_diagnostic", "schatten_bounds"])
@pytest.mark.parametrize("grad", [True, False])
def test_public_diagnostics_leave_the_callers_model_and_torch_state_as_found(crate_folder, name, grad):
    import hf_tdiag
    from hf_tdiag.inputs import digits_images
    from hf_tdiag.loading import load_model, pixel_values_for

    loaded = load_model(str(crate_folder / "a/model"))
    model = loaded.model
    x = pixel_values_for(digits_images(8).images, loaded)
    model.train()
    model.crate.encoder.layer[0].eval()  # a mixed state must come back exactly
    next(model.parameters()).requires_grad_(False)
    calls = {
        "layer_srr": lambda: hf_tdiag.layer_srr(model, x, progress=False),
        "concept_fidelity": lambda: hf_tdiag.concept_fidelity(model, x, 1, 2),
        "attention_svm_diagnostic": lambda: hf_tdiag.attention_svm_diagnostic(model, x, 1, 0, max_queries=4),
        "schatten_bounds": lambda: hf_tdiag.schatten_bounds(model),
    }
    with torch.set_grad_enabled(grad):
        before = _state(model)
        calls[name]()
        assert _state(model) == before


def test_a_garbage_pytorch_model_bin_is_named_without_unsafe_advice(crate_folder, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(crate_folder / "a/model", bad)
    (bad / "model.safetensors").unlink()
    (bad / "pytorch_model.bin").write_bytes(bytes(range(256)) * 12)  # not a torch.save file
    code, err = _cli(["srr", str(bad), "--dataset", "digits", "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 1 and "pytorch_model.bin" in err and "not a PyTorch weights file" in err
    assert "weights_only" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_config_claiming_more_layers_than_the_weights_fails_before_building(crate_folder, tmp_path):
    import shutil

    from hf_tdiag.loading import load_model

    bad = tmp_path / "bad"
    shutil.copytree(crate_folder / "a/model", bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000000, but the weights hold 2 blocks"):
        load_model(str(bad))  # refused from the file headers, before 10^9 layers are built
    (bad / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    assert len(load_model(str(bad)).model.crate.encoder.layer) == 2  # the matching config still loads
