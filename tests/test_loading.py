"""hf_tdiag.loading: one loader for every model / processor / tokenizer; a repository's own code never runs
unless the caller opts in (no prompt either, even under a terminal)."""

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

from hf_tdiag.loading import check_source, load_model, load_pretrained

CUSTOM_CONFIG = textwrap.dedent(
    """
    import os
    from transformers import PretrainedConfig

    open(os.environ["CUSTOM_CODE_MARKER"], "a").write("config ran\\n")


    class TinyCustomConfig(PretrainedConfig):
        model_type = "tiny-custom"

        def __init__(self, width=4, **kwargs):
            self.width = width
            super().__init__(**kwargs)
    """
)
CUSTOM_MODEL = textwrap.dedent(
    """
    import os
    import torch
    from transformers import PreTrainedModel
    from .configuration_tiny import TinyCustomConfig

    open(os.environ["CUSTOM_CODE_MARKER"], "a").write("model ran\\n")


    class TinyCustomModel(PreTrainedModel):
        config_class = TinyCustomConfig

        def __init__(self, config):
            super().__init__(config)
            self.proj = torch.nn.Linear(config.width, config.width)
            self.post_init()

        def forward(self, x):
            return self.proj(x)
    """
)


def write_custom_code_repo(folder) -> str:
    """A save_pretrained-style folder whose config needs its own Python code (auto_map, unknown model type)."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    config = {
        "model_type": "tiny-custom",
        "width": 4,
        "architectures": ["TinyCustomModel"],
        "auto_map": {"AutoConfig": "configuration_tiny.TinyCustomConfig", "AutoModel": "modeling_tiny.TinyCustomModel"},
    }
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    with open(os.path.join(folder, "configuration_tiny.py"), "w") as fh:
        fh.write(CUSTOM_CONFIG)
    with open(os.path.join(folder, "modeling_tiny.py"), "w") as fh:
        fh.write(CUSTOM_MODEL)
    save_file({"proj.weight": torch.eye(4), "proj.bias": torch.zeros(4)}, os.path.join(folder, "model.safetensors"))
    return str(folder)


@pytest.fixture
def custom_repo(tmp_path, monkeypatch):
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("CUSTOM_CODE_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    return write_custom_code_repo(tmp_path / "custom"), marker


def test_custom_code_is_refused_without_opt_in(custom_repo):
    folder, marker = custom_repo
    with pytest.raises(ValueError, match="model: .*needs its own Python code.*trust_remote_code=True"):
        load_model(folder)
    with pytest.raises(ValueError, match="model_or_path: .*needs its own Python code"):
        from hf_tdiag.diagnostics.schatten import schatten_bounds

        schatten_bounds(folder)  # called AutoModel.from_pretrained without trust_remote_code before
    assert not marker.exists()


def test_custom_code_runs_with_explicit_opt_in(custom_repo):
    folder, marker = custom_repo
    model = load_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == "TinyCustomModel" and torch.equal(model.proj.weight, torch.eye(4))
    assert "config ran" in marker.read_text()
    with pytest.raises(TypeError, match="trust_remote_code: expected True or False"):
        load_pretrained(folder, trust_remote_code="yes")


def test_refusal_is_prompt_free_under_a_terminal(custom_repo):
    """Under a pseudo-terminal Transformers would ask "run the custom code? [y/N]"; hf-tdiag never lets it."""
    folder, marker = custom_repo
    code = f"from hf_tdiag.diagnostics.schatten import schatten_bounds\nschatten_bounds({folder!r})"
    controller, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=child, stdout=child, stderr=child, env=dict(os.environ))
    os.close(child)
    output, deadline = b"", time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([controller], [], [], 0.5)[0]:
            try:
                output += os.read(controller, 65536)
            except OSError:
                break
        if b"[y/N]" in output:
            os.write(controller, b"y\n")  # what a careless user types; must never be asked
    proc.wait(timeout=30)
    while select.select([controller], [], [], 0.1)[0]:
        try:
            chunk = os.read(controller, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    text = output.decode(errors="replace")
    assert "[y/N]" not in text and "needs its own Python code" in text and proc.returncode != 0
    assert not marker.exists()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty string"),
        ("a b/c", "not an existing folder and not a valid Hub id"),
        ("org/name/extra", "not an existing folder and not a valid Hub id"),
    ],
)
def test_bad_sources_are_named(spec, message):
    with pytest.raises(ValueError, match=f"model: .*{message}"):
        check_source(spec)


def test_folder_without_config_and_plain_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="got the file"):
        load_model(str(tmp_path / "f.bin"))
    with pytest.raises(TypeError, match="model: expected"):
        load_model(3)
